"""The CPU backend's launcher: a `CpuProgram` runs the built kernels of one model on tensors'
data pointers, through one custom-op pair per model (`cpu_fwd`, `cpu_bwd`; built by `backends/ops.py`) with
fake implementations and an autograd formula, so that `torch.compile(fullgraph=True)` sees one
node per call and autograd the derived backward.

Arguments follow the ABI (`emit.CpuABI`): the inputs as [T, N] with unit lane stride (N the
step's elements), initial states as [N] tensors or numbers, params as numbers (one value) or
[N] float64 tensors (per-channel values, broadcast). Threads: `torch.get_num_threads()`.
Where the kernels could not be built, the program runs the torch backend's loop (after one
warning naming why).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import FlexDSLError
from ..base import RunResult, key_ints, key_tensor
from ..ops import Op, define
from .abi import CpuABI

DTYPES = {torch.float32: "f32", torch.float64: "f64"}
# kernel calls by kind ("fwd", "bwd"): lets tests check that the kernels ran
CALLS: dict[str, int] = {"fwd": 0, "bwd": 0}


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _step_shape(inputs: Sequence[torch.Tensor]) -> torch.Size:
    if len(inputs) == 1:
        return inputs[0].shape[1:]
    return torch.broadcast_shapes(*(x.shape[1:] for x in inputs))


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _sum_to(g: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    if len(shape) == 0:
        return g.sum()
    return g.sum_to_size(shape)


class CpuProgram:
    def __init__(self, lib: ctypes.CDLL | None, openmp: bool, abi: CpuABI, key: str, fallback: Any,
                 why: str | None = None) -> None:
        self.abi, self.key, self.name = abi, key, abi.name
        self.lib, self.openmp = lib, openmp
        self.fallback = fallback  # the torch backend's program of the same model
        self.why = why  # why the kernels are missing (None: built)
        self.n_in, self.n_st, self.n_p = len(abi.inputs), len(abi.states), len(abi.params)
        self.n_out = len(abi.outputs)
        self.learn_idx = [abi.params.index(p) for p in abi.learnable]
        self.reread_idx = [abi.inputs.index(x) for x in abi.reread]
        self.fns = {}
        if lib is not None:
            for kind in ("fwd", "bwd"):
                for suffix in DTYPES.values():
                    fn = getattr(lib, f"flexdsl_{kind}_{suffix}")
                    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
                    fn.restype = None
                    self.fns[kind, suffix] = fn
        self.op_fwd = self.op_bwd = None

    # ------------------------------------------------------------------ kernel calls
    def _call(self, kind: str, dtype: torch.dtype, ints: list[int], ptrs: list[int | None],
              vals: list[float]) -> None:
        n = (ctypes.c_int64 * len(ints))(*ints)
        p = (ctypes.c_void_p * len(ptrs))(*ptrs)
        f = (ctypes.c_double * max(len(vals), 1))(*vals)
        self.fns[kind, DTYPES[dtype]](n, p, f)
        CALLS[kind] += 1

    def _params(self, params: Sequence[Any], shape, N: int) -> tuple[list, list[float], list]:
        """Per param: a [N] float64 tensor (per-channel values) or None and its value."""
        tensors, vals, keep = [], [], []
        for p in params:
            if isinstance(p, torch.Tensor):
                if p.numel() == 1:
                    tensors.append(None)
                    vals.append(float(p.detach().reshape(())))
                else:
                    t = p.detach().to(torch.float64).expand(shape).reshape(N).contiguous()
                    tensors.append(t)
                    vals.append(0.0)
                    keep.append(t)
            else:
                tensors.append(None)
                vals.append(float(p))
        return tensors, vals, keep

    def forward(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any],
                store_seqs: bool, save: bool, key: Sequence[int] = ()) -> list[torch.Tensor]:
        """The forward kernel: outputs, final states, the state sequences (with `store_seqs`) and
        the saved values [K, T, *shape] (with `save`, when the plan saves any); `key`: a noisy
        model's (seed, t0)."""
        x0 = inputs[0]
        T, shape = x0.shape[0], _step_shape(inputs)
        N = _prod(shape)
        dtype = x0.dtype
        xs, strides = [], []
        for x in inputs:
            x2 = x.detach().to(dtype).expand(T, *shape).reshape(T, N)
            if N > 1 and x2.stride(1) != 1:
                x2 = x2.contiguous()
            xs.append(x2)
            strides.append(x2.stride(0))
        inits, init_vals = [], []
        for s in states:
            if isinstance(s, torch.Tensor) and (s.numel() == 1 or (s.numel() and all(st == 0 for st in s.stride()))):
                inits.append(None)  # one value (a 0-d tensor, or one broadcast): read here
                init_vals.append(float(s.detach().reshape(-1)[0]))
            elif isinstance(s, torch.Tensor):
                inits.append(s.detach().to(dtype).expand(shape).reshape(N).contiguous())
                init_vals.append(0.0)
            else:
                inits.append(None)
                init_vals.append(float(s))
        prm, prm_vals, _keep = self._params(params, shape, N)
        outs = [torch.empty((T, *shape), dtype=dtype) for _ in range(self.n_out)]
        fins = [torch.empty(shape, dtype=dtype) for _ in range(self.n_st)]
        seqs = [torch.empty((T, *shape), dtype=dtype) for _ in range(self.n_st)] if store_seqs else []
        saved = torch.empty((len(self.abi.saved), T, *shape), dtype=dtype) if save and self.abi.saved else None
        if N:
            ints = [T, N, torch.get_num_threads(), *strides, *self._key(key)]
            ptrs = [*map(_ptr, xs), *map(_ptr, inits), *map(_ptr, prm), *map(_ptr, outs), *map(_ptr, fins),
                    *(map(_ptr, seqs) if store_seqs else [None] * self.n_st), _ptr(saved)]
            self._call("fwd", dtype, ints, ptrs, [*init_vals, *prm_vals])
        return [*outs, *fins, *seqs, *([saved] if saved is not None else [])]

    def _key(self, key: Sequence[int]) -> list[int]:
        """The kernels' key ints: (seed, t0) for a noisy model, else none."""
        if not self.abi.draws:
            return []
        if len(key) != 2:
            raise ValueError(f"{self.name} draws random numbers: its kernels need the call's NoiseKey")
        return [int(key[0]), int(key[1])]

    def backward(self, reread: Sequence[torch.Tensor], saved: torch.Tensor | None, params: Sequence[Any],
                 g_outs: Sequence[torch.Tensor | None], g_seqs: Sequence[torch.Tensor | None],
                 g_fins: Sequence[torch.Tensor | None], need: Sequence[bool], T: int, shape: Sequence[int],
                 dtype: torch.dtype, key: Sequence[int] = ()) -> list[torch.Tensor]:
        """The backward kernel: full-shape gradients of the inputs [T, *shape], of the initial
        states [*shape] and per element of the learnable params [*shape] (float64), those
        `need`ed (inputs, states, learnable params) in that order."""
        shape = tuple(int(s) for s in shape)
        N = _prod(shape)
        n_in, n_st = self.n_in, self.n_st
        need_x, need_s, need_p = need[:n_in], need[n_in:n_in + n_st], need[n_in + n_st:]
        gx = [torch.empty((T, *shape), dtype=dtype) if n else None for n in need_x]
        gs = [torch.empty(shape, dtype=dtype) if n else None for n in need_s]
        gp = [torch.empty(shape, dtype=torch.float64) if n else None for n in need_p]
        result = [g for g in [*gx, *gs, *gp] if g is not None]
        if N == 0:
            return result
        xs: list[Any] = [None] * n_in
        strides = [0] * n_in
        for i, x in zip(self.reread_idx, reread):
            x2 = x.detach().to(dtype).expand(T, *shape).reshape(T, N)
            if N > 1 and x2.stride(1) != 1:
                x2 = x2.contiguous()
            xs[i], strides[i] = x2, x2.stride(0)
        prm, prm_vals, _keep = self._params(params, shape, N)

        def flat(g, lead):
            return None if g is None else g.detach().to(dtype).expand(*lead, *shape).reshape(*lead, N).contiguous()

        go = [flat(g, (T,)) for g in g_outs]
        gq = [flat(g, (T,)) for g in g_seqs]
        gf = [flat(g, ()) for g in g_fins]
        sv = saved.contiguous() if saved is not None else None
        ints = [T, N, torch.get_num_threads(), *strides, *self._key(key)]
        ptrs = [*map(_ptr, xs), _ptr(sv), *map(_ptr, prm), *map(_ptr, go), *map(_ptr, gq), *map(_ptr, gf),
                *map(_ptr, gx), *map(_ptr, gs), *map(_ptr, gp)]
        self._call("bwd", dtype, ints, ptrs, prm_vals)
        return result

    # ------------------------------------------------------------------ custom ops
    def prepare_trace(self, ir: Any = None) -> None:
        """Before a torch.compile trace: the custom ops."""
        if self.lib is None:
            if hasattr(self.fallback, "prepare_trace"):
                self.fallback.prepare_trace(ir)
            return
        self._register_ops()

    def _register_ops(self) -> None:
        if self.op_fwd is not None:
            return
        ns = f"flexdsl_{''.join(ch for ch in self.name.lower() if ch.isascii() and ch.isalnum())[:24]}_{self.key[:16]}"
        prog = self
        n_in, n_st, n_out = self.n_in, self.n_st, self.n_out
        n_saved = len(self.abi.saved)

        noisy = bool(self.abi.draws)

        def fwd(inputs: list[torch.Tensor], states: list[torch.Tensor], params: list[torch.Tensor],
                state_vals: list[float], param_vals: list[float], is_tensor: list[bool], store_seqs: bool,
                save: bool, key: torch.Tensor | None = None) -> list[torch.Tensor]:
            st, pr = _unpack(states, state_vals, is_tensor[:n_st]), _unpack(params, param_vals, is_tensor[n_st:])
            return prog.forward(inputs, st, pr, store_seqs, save, key_ints(key))

        def fwd_fake(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, key=None):
            x0 = inputs[0]
            T, shape = x0.shape[0], _step_shape(inputs)
            res = [x0.new_empty((T, *shape)) for _ in range(n_out)] + [x0.new_empty(shape) for _ in range(n_st)]
            if store_seqs:
                res += [x0.new_empty((T, *shape)) for _ in range(n_st)]
            if save and n_saved:
                res.append(x0.new_empty((n_saved, T, *shape)))
            return res

        def bwd(reread: list[torch.Tensor], saved: torch.Tensor | None, params: list[torch.Tensor],
                param_vals: list[float], is_param_t: list[bool], g_outs: list[torch.Tensor | None],
                g_seqs: list[torch.Tensor | None], g_fins: list[torch.Tensor | None], need: list[bool], T: int,
                shape: list[int], dtype: torch.dtype, key: torch.Tensor | None = None) -> list[torch.Tensor]:
            return prog.backward(reread, saved, _unpack(params, param_vals, is_param_t), g_outs, g_seqs, g_fins,
                                 need, T, shape, dtype, key_ints(key))

        def bwd_fake(reread, saved, params, param_vals, is_param_t, g_outs, g_seqs, g_fins, need, T, shape, dtype,
                     key=None):
            like = next(t for t in [*reread, saved, *g_outs, *g_seqs, *g_fins, *params] if t is not None)
            res = [like.new_empty((T, *shape), dtype=dtype) for n in need[:n_in] if n]
            res += [like.new_empty(tuple(shape), dtype=dtype) for n in need[n_in:n_in + n_st] if n]
            res += [like.new_empty(tuple(shape), dtype=torch.float64) for n in need[n_in + n_st:] if n]
            return res

        def autograd(handles: tuple) -> tuple:
            def setup_context(ctx, inputs, output):
                _setup_context(prog, ctx, inputs, output, n_saved)

            def backward(ctx, grads):
                if torch.is_grad_enabled() and not torch.compiler.is_compiling():  # (create_graph=True)
                    raise FlexDSLError("second-order gradients (create_graph=True) cannot go through the CPU kernels "
                                       f"of {prog.name}: their backward is a kernel, and its results are not "
                                       "differentiable", prog.name,
                                       hint="use backend='torch' for this model (its backward is differentiable)")
                return _backward(prog, ctx, grads, handles[1])

            return setup_context, backward

        self.op_fwd, self.op_bwd = define(ns, [Op("cpu_fwd", fwd, fake=fwd_fake, noisy=noisy),
                                               Op("cpu_bwd", bwd, fake=bwd_fake, noisy=noisy)],
                                          device_types="cpu", autograd=autograd)

    # ------------------------------------------------------------------ the Program interface
    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool, noise: Any = None) -> RunResult:
        if self.lib is None:
            return self.fallback.run(inputs, states, params, store_seqs=store_seqs,
                                     **({"noise": noise} if noise is not None else {}))
        x0 = inputs[0]
        if x0.device.type != "cpu":
            raise FlexDSLError(f"the CPU kernels run on CPU tensors, but the input is on {x0.device}", self.name,
                               hint="use backend='auto' (the Triton kernels for CUDA tensors) or backend='torch'")
        if x0.dtype not in DTYPES:
            raise FlexDSLError(f"the CPU kernels take float32 or float64 inputs, not {x0.dtype}", self.name,
                               hint="use backend='torch' (or 'auto', which runs other dtypes there)")
        grad = torch.is_grad_enabled()
        save = grad and (any(x.requires_grad for x in inputs)
                         or any(isinstance(v, torch.Tensor) and v.requires_grad for v in [*states, *params]))
        n_out, n_st = self.n_out, self.n_st
        key = key_tensor(noise)
        if not save and not torch.compiler.is_compiling():
            res = self.forward(inputs, states, params, store_seqs, False, key_ints(key))
        else:
            self._register_ops()
            assert self.op_fwd is not None
            st, st_vals, pr, pr_vals, is_t = [], [], [], [], []
            for v in states:
                if isinstance(v, torch.Tensor):
                    if v.device != x0.device:
                        v = v.to(x0.device)
                    st.append(v)
                    st_vals.append(0.0)
                    is_t.append(True)
                else:
                    st_vals.append(float(v))
                    is_t.append(False)
            for v in params:
                if isinstance(v, torch.Tensor):
                    pr.append(v)
                    pr_vals.append(0.0)
                    is_t.append(True)
                else:
                    pr_vals.append(float(v))
                    is_t.append(False)
            res = self.op_fwd(list(inputs), st, pr, st_vals, pr_vals, is_t, bool(store_seqs), save,
                              *([key] if key is not None else []))
        return RunResult(list(res[:n_out]), list(res[n_out:n_out + n_st]),
                         list(res[n_out + n_st:n_out + 2 * n_st]) if store_seqs else None)


def _unpack(tensors: Sequence[torch.Tensor], vals: Sequence[float], is_t: Sequence[bool]) -> list[Any]:
    """Values in order: the next tensor where `is_t`, else the number."""
    it = iter(tensors)
    return [next(it) if t else v for t, v in zip(is_t, vals)]


def _setup_context(prog: CpuProgram, ctx, inputs, output, n_saved: int) -> None:
    """What the backward of the forward op needs (its setup_context)."""
    n_st = prog.n_st
    xs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, *key = inputs
    ctx.key = key[0] if key else None  # (a noisy model's op takes the key of its draws)
    # (the number lists' gradients: None, or an empty list for an empty one, as autograd checks the structure)
    ctx.tail = [[] if isinstance(a, list | tuple) and not a else None for a in (state_vals, param_vals, is_tensor)]
    st = _unpack(states, state_vals, is_tensor[:n_st])
    pr = _unpack(params, param_vals, is_tensor[n_st:])
    x0 = xs[0]
    ctx.T, ctx.shape, ctx.dtype = x0.shape[0], tuple(_step_shape(xs)), x0.dtype
    ctx.store_seqs = store_seqs
    ctx.param_vals, ctx.is_param_t = list(param_vals), list(is_tensor[n_st:])
    ctx.x_shapes = [tuple(x.shape) for x in xs]
    ctx.s_info = [(tuple(s.shape), s.dtype) if isinstance(s, torch.Tensor) else None for s in st]
    ctx.p_info = [(tuple(p.shape), p.dtype) if isinstance(p, torch.Tensor) else None for p in pr]
    ab = prog.abi
    ctx.need = [*(x.requires_grad and nz for x, nz in zip(xs, ab.grad_inputs)),
                *(isinstance(s, torch.Tensor) and s.requires_grad and nz for s, nz in zip(st, ab.grad_states)),
                *(isinstance(pr[i], torch.Tensor) and pr[i].requires_grad and nz
                  for i, nz in zip(prog.learn_idx, ab.grad_params))]
    sav = output[-1] if save and n_saved else None
    ctx.save_for_backward(*[xs[i] for i in prog.reread_idx], sav, *params)
    ctx.set_materialize_grads(False)


def _backward(prog: CpuProgram, ctx, grads, bwd) -> tuple:
    """The forward op's autograd formula: the backward op, its results summed to each input's shape."""
    n_in, n_st, n_out = prog.n_in, prog.n_st, prog.n_out
    saved = ctx.saved_tensors
    k = len(prog.reread_idx)
    reread, sav, params = list(saved[:k]), saved[k], list(saved[k + 1:])
    g_outs = list(grads[:n_out])
    g_fins = list(grads[n_out:n_out + n_st])
    g_seqs = list(grads[n_out + n_st:n_out + 2 * n_st]) if ctx.store_seqs else [None] * n_st
    need = ctx.need
    n_p_t = len(params)
    g_in: list = [None] * n_in
    g_st: list = [None] * n_st
    g_pr: list = [None] * len(ctx.p_info)
    if any(need) and not all(g is None for g in [*g_outs, *g_fins, *g_seqs]):
        res = iter(bwd(reread, sav, params, ctx.param_vals, ctx.is_param_t, g_outs, g_seqs, g_fins, need,
                       ctx.T, list(ctx.shape), ctx.dtype, *([ctx.key] if ctx.key is not None else [])))
        for i in range(n_in):
            if need[i]:
                g_in[i] = _sum_to(next(res), ctx.x_shapes[i])
        for i in range(n_st):
            if need[n_in + i]:
                sh, dt = ctx.s_info[i]
                g_st[i] = _sum_to(next(res), sh).to(dt)
        for i, n in zip(prog.learn_idx, need[n_in + n_st:]):
            if n:
                sh, dt = ctx.p_info[i]
                g_pr[i] = _sum_to(next(res), sh).to(dt)
    g_st = [g for g, info in zip(g_st, ctx.s_info) if info is not None]
    g_pr = [g for g, info in zip(g_pr, ctx.p_info) if info is not None]
    assert len(g_pr) == n_p_t
    return g_in, g_st, g_pr, *ctx.tail, None, None, *([None] if ctx.key is not None else [])


__all__ = ["CpuProgram", "CALLS", "DTYPES"]
