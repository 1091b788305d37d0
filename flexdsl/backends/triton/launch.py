"""The Triton backend's launcher: a `TritonProgram` runs the generated kernels of one model,
with arguments built from the kernel ABI, through one `torch.library.custom_op` family per
model (so `torch.compile(fullgraph=True)` and CUDA graphs see opaque ops with fake
implementations) and a symbolic backward.

Launch heuristics, visible here and settable by environment variables:
- `FLEXDSL_TRITON_BLOCK` lanes per program (default 1024 for small kernels, 256 for big ones,
  whose registers would spill); the interpreter (`TRITON_INTERPRET=1`) uses few big programs;
- `FLEXDSL_TRITON_WARPS` warps per program (default 4);
- `FLEXDSL_TRITON_FAST_LAUNCH=0` turns off the cache of compiled kernels that skips Triton's
  per-call argument binding (tens of microseconds a launch).
T is a runtime loop bound and N a runtime size: a new T or shape compiles nothing.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from ...errors import FlexDSLError
from ..base import RunResult
from .abi import KernelABI

# kernel launches by kind ("fwd", "bwd"): lets tests check that the Triton path really ran
LAUNCHES: Counter = Counter()

_INTERPRET: list[bool] = []


def interpret() -> bool:
    """TRITON_INTERPRET=1 (read once: it must be set before triton is imported anyway)."""
    if not _INTERPRET:
        _INTERPRET.append(os.environ.get("TRITON_INTERPRET", "0") == "1")
    return _INTERPRET[0]


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device_index: int) -> int:
    """The current CUDA stream's handle (what Triton's own launcher asks for; cheaper than
    torch.cuda.current_stream(), which builds a Stream object)."""
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _device_of(ts) -> torch.device:
    for t in ts:
        if t is not None:
            return t.device
    return torch.device("cpu")


class _Kernel:
    """One kernel with its ABI order: a launch takes a value list per role."""

    def __init__(self, fn, args, warps: int) -> None:
        self.fn = fn
        groups: dict[str, int] = {}
        self.index: list[tuple[str, int]] = []
        for a in args:
            i = groups.get(a.role, 0)
            groups[a.role] = i + 1
            self.index.append((a.role, i))
        self.constexpr = [a.constexpr for a in args]
        self.warps = warps
        self.cache: dict = {}
        self.fast = os.environ.get("FLEXDSL_TRITON_FAST_LAUNCH", "1") == "1"

    def launch(self, grid: tuple[int], values: dict[str, list]) -> None:
        full = [values[r][i] for r, i in self.index]
        if interpret() or not self.fast:
            self.fn[grid](*full, num_warps=self.warps)
            return
        # a cache of compiled kernels keyed like Triton's own specialization (tensor dtype and
        # 16-byte alignment, ints ==1 / %16 / 64-bit, None, constexpr values)
        key: list[Any] = []
        dev = 0
        for a, c in zip(full, self.constexpr):
            if c:
                key.append(a)
            elif isinstance(a, torch.Tensor):
                dev = a.device.index or 0
                key.append((a.dtype, a.data_ptr() % 16 == 0))
            elif a is None or isinstance(a, float):
                key.append(a is None)
            else:
                key.append((a == 1, a % 16 == 0, a >= 2**31 or a < -2**31))
        k = tuple(key)
        ck = self.cache.get(k)
        if ck is None:
            ck = self.fn[grid](*full, num_warps=self.warps)
            if hasattr(ck, "run"):
                self.cache[k] = ck
            return
        try:
            stream = _stream(dev)
            ck.run(grid[0], 1, 1, stream, ck.function, ck.packed_metadata, ck.launch_metadata(grid, stream, *full),
                   None, None, *full)
        except (TypeError, AttributeError):  # another Triton's launcher API: use the public path
            self.fast = False
            self.fn[grid](*full, num_warps=self.warps)


class TritonProgram:
    def __init__(self, module: ModuleType, abi: KernelABI, key: str) -> None:
        self.mod = module
        self.abi = abi
        self.key = key
        self.name = abi.name
        self.inputs, self.states, self.params = abi.inputs, abi.states, abi.params
        self.learnable, self.outputs = abi.learnable, abi.outputs
        self.saved, self.reread = abi.saved, abi.reread
        self.reread_idx = [self.inputs.index(x) for x in self.reread]
        self.grad_inputs, self.grad_states, self.grad_params = abi.grad_inputs, abi.grad_states, abi.grad_params
        self.learn_idx = [self.params.index(p) for p in self.learnable]
        self.has_hoisted = bool(abi.hoisted_fwd or abi.hoisted_bwd)
        # ~8 lanes per thread for small models, fewer for big ones (whose registers would spill);
        # the kernels' argument count (params, states, saved values...) measures the size
        big = len(abi.fwd) + len(abi.bwd) >= 84
        self.block = int(os.environ.get("FLEXDSL_TRITON_BLOCK", 0)) or (256 if big else 1024)
        warps = int(os.environ.get("FLEXDSL_TRITON_WARPS", 0)) or 4
        self.k_fwd = _Kernel(module.fwd_kernel, abi.fwd, warps)
        self.k_bwd = _Kernel(module.bwd_kernel, abi.bwd, warps)
        self._host_cache: dict = {}
        self._register_ops()

    # ------------------------------------------------------------------ launch helpers
    def _block(self, N: int) -> int:
        if interpret():  # few big programs: the interpreter runs programs one after another
            return max(16, min(4096, 1 << max(0, N - 1).bit_length()))
        return self.block

    def _host(self, params, param_vals) -> tuple[bool, dict]:
        """Loop invariants in float64 on the host when every param is a Python float (as the
        torch path computes them), else (False, {}): the kernel computes them."""
        if any(p is not None for p in params) or not self.has_hoisted:
            return False, {}
        key = tuple(param_vals)
        hit = self._host_cache.get(key)
        if hit is None:
            try:
                hit = (True, self.mod.host_invariants(*param_vals))
            except (ValueError, ZeroDivisionError, OverflowError):
                hit = (False, {})
            if len(self._host_cache) > 64:
                self._host_cache.clear()
            self._host_cache[key] = hit
        return hit

    @staticmethod
    def _param(p: torch.Tensor | None, v: float, shape, N: int, dev) -> tuple[Any, int]:
        if p is None:
            return float(v), 0
        if p.device != dev:
            p = p.to(dev)
        if p.numel() == 1:
            return p.reshape(1), 1
        return p.detach().expand(shape).reshape(N).contiguous(), 2  # the kernel reads [N] at unit stride

    @staticmethod
    def _unpack(tensors, vals, is_t):
        it = iter(tensors)
        return [next(it) if k else None for k in is_t], list(vals)

    def fwd_impl(self, inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save):
        n_st = len(self.states)
        states, state_vals = self._unpack(states, state_vals, is_tensor[:n_st])
        params, param_vals = self._unpack(params, param_vals, is_tensor[n_st:])
        x0 = inputs[0]
        T, shape = x0.shape[0], tuple(x0.shape[1:])
        N = _prod(shape)
        dev, dtype = x0.device, x0.dtype
        outs = [torch.empty((T, *shape), dtype=dtype, device=dev) for _ in self.outputs]
        fins = [torch.empty(shape, dtype=dtype, device=dev) for _ in self.states]
        seqs = [torch.empty((T, *shape), dtype=dtype, device=dev) for _ in self.states] if store_seqs else []
        sav = torch.empty((len(self.saved), T, *shape), dtype=dtype, device=dev) if save and self.saved else None
        result = outs + fins + seqs + ([sav] if sav is not None else [])
        if N == 0:
            return result
        xs, strides = [], []
        for x in inputs:
            x2 = x.reshape(T, N)
            if x2.stride(1) != 1:
                x2 = x2.contiguous()
            xs.append(x2)
            strides.append(x2.stride(0))
        inits, initmodes = [], []
        for s, v in zip(states, state_vals):
            if s is None:
                inits.append(float(v))
                initmodes.append(0)
            else:
                inits.append(s.to(dev).expand(shape).reshape(N))
                initmodes.append(2)
        pargs, modes = [], []
        for p, v in zip(params, param_vals):
            a, mode = self._param(p, v, shape, N, dev)
            pargs.append(a)
            modes.append(mode)
        host, hv = self._host(params, param_vals)
        block = self._block(N)
        values = {
            "in": xs, "stride": strides, "init": inits, "param": pargs, "out": outs, "fin": fins,
            "seq": seqs if store_seqs else [None] * len(self.states),
            "hoisted": [hv.get(y, 0.0) for y in self.abi.hoisted_fwd], "saved": [sav], "N": [N], "T": [T],
            "initmode": initmodes, "mode": modes, "host": [host], "store_seqs": [bool(store_seqs)],
            "save": [sav is not None], "block": [block],
        }
        self.k_fwd.launch((cdiv(N, block),), values)
        LAUNCHES["fwd"] += 1
        return result

    def bwd_impl(self, reread, saved, params, param_vals, is_param_t, g_outs, g_seqs, g_fins, need, T, shape, dtype):
        params, param_vals = self._unpack(params, param_vals, is_param_t)
        shape = tuple(int(s) for s in shape)
        N = _prod(shape)
        n_in, n_st = len(self.inputs), len(self.states)
        need_gx, need_gs, need_gp = need[:n_in], need[n_in:n_in + n_st], need[n_in + n_st:]
        dev = _device_of([*reread, saved, *params, *g_outs, *g_seqs, *g_fins])
        gx = [torch.empty((T, *shape), dtype=dtype, device=dev) if n else None for n in need_gx]
        gs = [torch.empty(shape, dtype=torch.float32, device=dev) if n else None for n in need_gs]
        gp = [torch.empty(shape, dtype=torch.float32, device=dev) if n else None for n in need_gp]
        result = [g for g in [*gx, *gs, *gp] if g is not None]
        if N == 0:
            return result
        if T == 0:  # nothing to run backward through: the initial states get the final states' grads
            for i, g in enumerate(gs):
                if g is not None:
                    g.copy_(g_fins[i] if g_fins[i] is not None else torch.zeros((), device=dev))
            for g in gp:
                if g is not None:
                    g.zero_()
            return result
        xs: list[Any] = [None] * n_in
        strides = [0] * n_in
        for i, x in zip(self.reread_idx, reread):
            x2 = x.reshape(T, N)
            if x2.stride(1) != 1:
                x2 = x2.contiguous()
            xs[i], strides[i] = x2, x2.stride(0)
        pargs, modes = [], []
        for p, v in zip(params, param_vals):
            a, mode = self._param(p, v, shape, N, dev)
            pargs.append(a)
            modes.append(mode)

        def flat(g, lead):
            if g is None:
                return None
            g = g.reshape(*lead, N)
            return g if g.is_contiguous() else g.contiguous()

        host, hv = self._host(params, param_vals)
        block = self._block(N)
        values = {
            "in": xs, "stride": strides, "saved": [saved], "param": pargs,
            "gout": [flat(g, (T,)) for g in g_outs], "gseq": [flat(g, (T,)) for g in g_seqs],
            "gfin": [flat(g, ()) for g in g_fins], "gx": gx, "gs": gs, "gp": gp,
            "hoisted": [hv.get(y, 0.0) for y in self.abi.hoisted_bwd], "N": [N], "T": [T], "mode": modes,
            "hasgout": [g is not None for g in g_outs], "hasgseq": [g is not None for g in g_seqs],
            "hasgfin": [g is not None for g in g_fins], "needgx": [bool(n) for n in need_gx],
            "needgs": [bool(n) for n in need_gs], "needgp": [bool(n) for n in need_gp], "host": [host],
            "block": [block],
        }
        self.k_bwd.launch((cdiv(N, block),), values)
        LAUNCHES["bwd"] += 1
        return result

    # ------------------------------------------------------------------ custom ops
    def _register_ops(self) -> None:
        ns = f"flexdsl_{''.join(ch for ch in self.name.lower() if ch.isascii() and ch.isalnum())[:24]}_{self.key[:16]}"
        tm = self
        n_out, n_st = len(self.outputs), len(self.states)
        lib_ops = torch.library

        @lib_ops.custom_op(f"{ns}::fwd", mutates_args=())
        def fwd(inputs: list[torch.Tensor], states: list[torch.Tensor], params: list[torch.Tensor],
                state_vals: list[float], param_vals: list[float], is_tensor: list[bool], store_seqs: bool,
                save: bool) -> list[torch.Tensor]:
            return tm.fwd_impl(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save)

        @fwd.register_fake
        def _(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save):
            x0 = inputs[0]
            T, shape = x0.shape[0], x0.shape[1:]
            mk = lambda sh: x0.new_empty(sh)  # noqa: E731
            res = [mk((T, *shape)) for _ in range(n_out)] + [mk(shape) for _ in range(n_st)]
            if store_seqs:
                res += [mk((T, *shape)) for _ in range(n_st)]
            if save and tm.saved:
                res.append(mk((len(tm.saved), T, *shape)))
            return res

        @lib_ops.custom_op(f"{ns}::bwd", mutates_args=())
        def bwd(reread: list[torch.Tensor], saved: torch.Tensor | None, params: list[torch.Tensor],
                param_vals: list[float], is_param_t: list[bool], g_outs: list[torch.Tensor | None],
                g_seqs: list[torch.Tensor | None], g_fins: list[torch.Tensor | None], need: list[bool],
                T: int, shape: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
            return tm.bwd_impl(reread, saved, params, param_vals, is_param_t, g_outs, g_seqs, g_fins, need, T,
                               shape, dtype)

        @bwd.register_fake
        def _(reread, saved, params, param_vals, is_param_t, g_outs, g_seqs, g_fins, need, T, shape, dtype):
            n_in = len(tm.inputs)
            like = next(t for t in [*reread, saved, *g_outs, *g_seqs, *g_fins, *params] if t is not None)
            res = [like.new_empty((T, *shape), dtype=dtype) for n in need[:n_in] if n]
            res += [like.new_empty(tuple(shape), dtype=torch.float32) for n in need[n_in:] if n]
            return res

        def setup_context(ctx, inputs, output):
            _setup(tm, ctx, *inputs, output)

        def backward(ctx, grads):
            return _backward(tm, ctx, grads, bwd)

        fwd.register_autograd(backward, setup_context=setup_context)
        self.op_fwd = fwd
        self.op_bwd = bwd

    # ------------------------------------------------------------------ the Program interface
    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool) -> RunResult:
        x0 = inputs[0]
        if x0.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise FlexDSLError(f"the Triton kernels take float32, float16 or bfloat16 inputs, not {x0.dtype}",
                               self.abi.name, hint="use backend='torch' for float64")
        shape = tuple(x0.shape[1:])
        xs = [x if x.shape == x0.shape else x.expand(x0.shape) for x in inputs]
        pr_t: list[torch.Tensor | None] = []
        pr_v: list[float] = []
        for v in params:
            if isinstance(v, torch.Tensor):
                pr_t.append(v)
                pr_v.append(0.0)
            else:
                pr_t.append(None)
                pr_v.append(float(v))
        st_t: list[torch.Tensor | None] = []
        st_v: list[float] = []
        for v in states:
            if isinstance(v, torch.Tensor):
                st_t.append(v.to(x0.device).expand(shape) if tuple(v.shape) != shape or v.device != x0.device else v)
                st_v.append(0.0)
            else:
                st_t.append(None)
                st_v.append(float(v))
        save = torch.is_grad_enabled() and (
            any(x.requires_grad for x in xs) or any(s is not None and s.requires_grad for s in st_t)
            or any(p is not None and p.requires_grad for p in pr_t))
        is_t = [t is not None for t in [*st_t, *pr_t]]
        res = _call(self, xs, [t for t in st_t if t is not None], [t for t in pr_t if t is not None], st_v, pr_v,
                    is_t, bool(store_seqs), bool(save))
        n_out, n_st = len(self.outputs), len(self.states)
        return RunResult(list(res[:n_out]), list(res[n_out:n_out + n_st]),
                         list(res[n_out + n_st:n_out + 2 * n_st]) if store_seqs else None)


def _setup(tm, ctx, xs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, output):
    """What the backward needs (shared by the custom op and the eager autograd.Function)."""
    n_out, n_st = len(tm.outputs), len(tm.states)
    x0 = xs[0]
    ctx.T, ctx.shape, ctx.dtype = x0.shape[0], tuple(x0.shape[1:]), x0.dtype
    ctx.store_seqs = store_seqs
    ctx.param_vals = list(param_vals)
    ctx.is_param_t = list(is_tensor[n_st:])
    st, _ = tm._unpack(states, state_vals, is_tensor[:n_st])
    pr, _ = tm._unpack(params, param_vals, is_tensor[n_st:])
    ctx.state_pos = [i for i, s in enumerate(st) if s is not None]
    ctx.param_pos = [i for i, p in enumerate(pr) if p is not None]
    ctx.param_shapes = [None if p is None else p.shape for p in pr]
    ctx.need_gx = [bool(x.requires_grad) and nz for x, nz in zip(xs, tm.grad_inputs)]
    ctx.need_gs = [s is not None and bool(s.requires_grad) and nz for s, nz in zip(st, tm.grad_states)]
    ctx.need_gp = [pr[i] is not None and bool(pr[i].requires_grad) and nz
                   for i, nz in zip(tm.learn_idx, tm.grad_params)]
    ctx.state_dtypes = [None if s is None else s.dtype for s in st]
    sav = output[n_out + n_st + (n_st if store_seqs else 0)] if (save and tm.saved) else None
    ctx.save_for_backward(*[xs[i] for i in tm.reread_idx], sav, *params)
    ctx.set_materialize_grads(False)


def _backward(tm, ctx, grads, bwd):
    n_out, n_st = len(tm.outputs), len(tm.states)
    saved = ctx.saved_tensors
    k = len(tm.reread_idx)
    reread, sav, params = list(saved[:k]), saved[k], list(saved[k + 1:])
    g_outs = list(grads[:n_out])
    g_fins = list(grads[n_out:n_out + n_st])
    g_seqs = list(grads[n_out + n_st:n_out + 2 * n_st]) if ctx.store_seqs else [None] * n_st
    need = [*ctx.need_gx, *ctx.need_gs, *ctx.need_gp]
    g_in: list = [None] * len(tm.inputs)
    g_st: list = [None] * n_st
    g_pr: list = [None] * len(ctx.param_shapes)
    if any(need) and not all(g is None for g in [*g_outs, *g_fins, *g_seqs]):
        res = iter(bwd(reread, sav, params, ctx.param_vals, ctx.is_param_t, g_outs, g_seqs, g_fins, need,
                       ctx.T, list(ctx.shape), ctx.dtype))
        for i, n in enumerate(ctx.need_gx):
            if n:
                g_in[i] = next(res)
        for i, n in enumerate(ctx.need_gs):
            if n:
                g_st[i] = next(res).to(ctx.state_dtypes[i])
        for i, n in zip(tm.learn_idx, ctx.need_gp):
            if n:
                g = next(res)
                pshape = ctx.param_shapes[i]
                g_pr[i] = g.sum().reshape(pshape) if _prod(pshape) == 1 else g.sum_to_size(pshape)
    g_st = [g_st[i] for i in ctx.state_pos]
    g_pr = [g_pr[i] for i in ctx.param_pos]
    return g_in, g_st, g_pr, None, None, None, None, None


class _Eager(torch.autograd.Function):
    """The eager path: the same kernels without the dispatcher's per-call cost of custom ops."""

    @staticmethod
    def forward(ctx, tm, n_x, n_s, state_vals, param_vals, is_t, store_seqs, *tensors):
        xs, sts, prs = list(tensors[:n_x]), list(tensors[n_x:n_x + n_s]), list(tensors[n_x + n_s:])
        res = tm.fwd_impl(xs, sts, prs, state_vals, param_vals, is_t, store_seqs, True)
        ctx.tm = tm
        _setup(tm, ctx, xs, sts, prs, state_vals, param_vals, is_t, store_seqs, True, res)
        n_keep = len(tm.outputs) + len(tm.states) * (2 if store_seqs else 1)
        if len(res) > n_keep:
            ctx.mark_non_differentiable(*res[n_keep:])
        return tuple(res)

    @staticmethod
    def backward(ctx, *grads):
        tm = ctx.tm
        g_in, g_st, g_pr, *_ = _backward(tm, ctx, grads, tm.bwd_impl)
        return (None,) * 7 + (*g_in, *g_st, *g_pr)


def _call(tm, xs, st_tensors, pr_tensors, st_v, pr_v, is_t, store_seqs, save):
    if torch.compiler.is_compiling():
        return tm.op_fwd(xs, st_tensors, pr_tensors, st_v, pr_v, is_t, store_seqs, save)
    if not save:
        return tm.fwd_impl(xs, st_tensors, pr_tensors, st_v, pr_v, is_t, store_seqs, False)
    return list(_Eager.apply(tm, len(xs), len(st_tensors), st_v, pr_v, is_t, store_seqs,
                             *xs, *st_tensors, *pr_tensors))


__all__ = ["TritonProgram", "LAUNCHES", "interpret"]
