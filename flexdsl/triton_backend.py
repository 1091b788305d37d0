"""The Triton runtime: generated kernels loaded from a disk cache, launched through one
`torch.library.custom_op` family per compiled model (so `torch.compile(fullgraph=True)` and
CUDA graphs see opaque ops with fake implementations), with a symbolic backward.

    forward_triton(module, inputs)   # called by NeuronModule.forward for backend "triton"/"auto"

Generated source is written to `$FLEXDSL_CACHE_DIR/triton` (default `~/.cache/flexdsl/triton`) as
`<model>_<hash>.py` (hash of the model text, detach_reset, the flexdsl compiler sources and the
triton/torch versions) and imported from there: a later process skips sympy entirely for the
kernels, and `triton.jit` gets a real file for `inspect.getsource`. Triton itself caches the
compiled binaries (`~/.triton/cache`). T is a runtime loop bound and N a runtime size: a new T
or shape compiles nothing (Triton specializes integer arguments only by divisibility by 16).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from . import diskcache

# kernel launches by kind ("fwd", "bwd"): lets tests check that the Triton path really ran
LAUNCHES: Counter = Counter()

_LOCK = threading.Lock()
_MODELS: dict[str, TritonModel] = {}
_SRC_HASH: list[str] = []


def cache_dir() -> Path:
    return diskcache.cache_dir("triton")


def _compiler_hash() -> str:
    """The flexdsl compiler's hash (diskcache) with the triton and torch versions."""
    if not _SRC_HASH:
        import triton

        _SRC_HASH.append(f"{diskcache.compiler_hash()}|{triton.__version__}|{torch.__version__}")
    return _SRC_HASH[0]


_INTERPRET: list[bool] = []


def _interpret() -> bool:
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


def _key(compiled) -> str:
    h = hashlib.sha256()
    h.update(compiled.text.encode())
    h.update(f"|{compiled.detach_reset}|{_compiler_hash()}".encode())
    return h.hexdigest()[:20]


def _load_source(compiled, key: str) -> tuple[Path, str]:
    name = "".join(ch if ch.isalnum() else "_" for ch in compiled.name.lower())
    path = cache_dir() / f"{name}_{key}.py"
    if path.exists():
        return path, path.read_text()
    src = compiled.triton_source
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(src)
    os.replace(tmp, path)
    return path, src


def get_model(compiled) -> TritonModel:
    """The Triton side of a compiled model (kernels + ops), built once per process."""
    tm = compiled.__dict__.get("_triton_model")
    if tm is not None:
        return tm
    with _LOCK:
        key = _key(compiled)
        tm = _MODELS.get(key)
        if tm is None:
            tm = TritonModel(compiled, key)
            _MODELS[key] = tm
    compiled.__dict__["_triton_model"] = tm
    return tm


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class TritonModel:
    def __init__(self, compiled, key: str) -> None:
        path, self.source = _load_source(compiled, key)
        modname = f"flexdsl_triton_{path.stem}"
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        self.mod = mod
        self.key = key
        self.name = mod.NAME
        self.inputs, self.states, self.params = mod.INPUTS, mod.STATES, mod.PARAMS
        self.learnable, self.outputs = mod.LEARNABLE, mod.OUTPUTS
        self.saved, self.reread = mod.SAVED, mod.REREAD
        self.reread_idx = [self.inputs.index(x) for x in self.reread]
        self.grad_inputs, self.grad_states, self.grad_params = mod.GRAD_INPUTS, mod.GRAD_STATES, mod.GRAD_PARAMS
        self.learn_idx = [self.params.index(p) for p in self.learnable]
        n_lines = self.source.count("\n")
        # launch shape: ~8 lanes per thread for small models, fewer for big ones (registers)
        self.block = int(os.environ.get("FLEXDSL_TRITON_BLOCK", 0)) or (1024 if n_lines < 400 else 256)
        self.warps = int(os.environ.get("FLEXDSL_TRITON_WARPS", 0)) or 4
        self._host_cache: dict = {}
        self._launch_cache: dict = {}
        self._init_cache: dict = {}
        self._fast = os.environ.get("FLEXDSL_TRITON_FAST_LAUNCH", "1") == "1"
        self._register_ops()

    # ------------------------------------------------------------------ launch helpers
    def _block(self, N: int) -> int:
        if _interpret():  # few big programs: the interpreter runs programs one after another
            return max(16, min(4096, 1 << max(0, N - 1).bit_length()))
        return self.block

    def _launch(self, kernel, grid, args, consts) -> None:
        """Launch; on a GPU, a cache of compiled kernels keyed like Triton's own specialization
        (tensor dtype and 16-byte alignment, ints ==1 / %16 / 64-bit, None, floats, constexprs)
        skips the per-call argument binding of `kernel[grid](...)` (tens of microseconds)."""
        if _interpret() or not self._fast:
            kernel[grid](*args, **consts, num_warps=self.warps)
            return
        key = [id(kernel), self.warps]
        dev = 0
        for a in args:
            if isinstance(a, torch.Tensor):
                dev = a.device.index or 0
                key.append((a.dtype, a.data_ptr() % 16 == 0))
            elif a is None or isinstance(a, float):
                key.append(a is None)
            else:
                key.append((a == 1, a % 16 == 0, a >= 2**31 or a < -2**31))
        key.append(tuple(consts.items()))
        key = tuple(key)
        ck = self._launch_cache.get(key)
        if ck is None:
            ck = kernel[grid](*args, **consts, num_warps=self.warps)
            names = list(kernel.arg_names)
            tail = names[len(args):]
            if all(n in consts for n in tail) and hasattr(ck, "run"):
                self._launch_cache[key] = (ck, tail)
            return
        ck, tail = ck
        full = [*args, *(consts[n] for n in tail)]
        try:
            stream = _stream(dev)
            ck.run(grid[0], 1, 1, stream, ck.function, ck.packed_metadata, ck.launch_metadata(grid, stream, *full),
                   None, None, *full)
        except (TypeError, AttributeError):  # another Triton's launcher API: use the public path
            self._fast = False
            kernel[grid](*args, **consts, num_warps=self.warps)

    def _host(self, params, param_vals) -> tuple[bool, dict]:
        """Loop invariants in float64 on the host when every param is a Python float (as the
        torch path computes them), else (False, {}): the kernel computes them."""
        if any(p is not None for p in params) or not (self.mod.HOISTED_FWD or self.mod.HOISTED_BWD):
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
        return p.detach().expand(shape).reshape(N), 2

    def _unpack(self, tensors, vals, is_t):
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
        if N == 0:
            return outs + fins + seqs + ([sav] if sav is not None else [])
        args: list[Any] = []
        for x in inputs:
            x2 = x.reshape(T, N)
            if x2.stride(1) != 1:
                x2 = x2.contiguous()
            args += [x2, x2.stride(0)]
        consts: dict[str, Any] = {}
        for name, s, v in zip(self.states, states, state_vals):
            if s is None:
                args.append(float(v))
                consts[f"_{name}_INIT"] = 0
            else:
                args.append(s.to(dev).expand(shape).reshape(N))
                consts[f"_{name}_INIT"] = 2
        for name, p, v in zip(self.params, params, param_vals):
            a, mode = self._param(p, v, shape, N, dev)
            args.append(a)
            consts[f"_{name}_MODE"] = mode
        args += outs
        args += fins
        args += seqs if store_seqs else [None] * len(self.states)
        host, hv = self._host(params, param_vals)
        args += [hv.get(y, 0.0) for y in self.mod.HOISTED_FWD]
        args += [sav, N, T]
        block = self._block(N)
        grid = (triton_cdiv(N, block),)
        consts.update(_HOST=host, _STORE_SEQS=bool(store_seqs), _SAVE=sav is not None, _BLOCK=block)
        self._launch(self.mod.fwd_kernel, grid, args, consts)
        LAUNCHES["fwd"] += 1
        return outs + fins + seqs + ([sav] if sav is not None else [])

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
        args: list[Any] = []
        it = iter(reread)
        for i in range(n_in):
            if i in self.reread_idx:
                x2 = next(it).reshape(T, N)
                if x2.stride(1) != 1:
                    x2 = x2.contiguous()
                args += [x2, x2.stride(0)]
            else:
                args += [None, 0]
        args.append(saved)
        consts: dict[str, Any] = {}
        for name, p, v in zip(self.params, params, param_vals):
            a, mode = self._param(p, v, shape, N, dev)
            args.append(a)
            consts[f"_{name}_MODE"] = mode

        def flat(g, lead):
            if g is None:
                return None
            g = g.reshape(*lead, N)
            return g if g.is_contiguous() else g.contiguous()

        for o, g in zip(self.outputs, g_outs):
            args.append(flat(g, (T,)))
            consts[f"_HAS_G_{o}"] = g is not None
        for s, g in zip(self.states, g_seqs):
            args.append(flat(g, (T,)))
            consts[f"_HAS_GSEQ_{s}"] = g is not None
        for s, g in zip(self.states, g_fins):
            args.append(flat(g, ()))
            consts[f"_HAS_GFIN_{s}"] = g is not None
        args += gx
        args += gs
        args += gp
        host, hv = self._host(params, param_vals)
        args += [hv.get(y, 0.0) for y in self.mod.HOISTED_BWD]
        args += [N, T]
        for x, n in zip(self.inputs, need_gx):
            consts[f"_NEED_GX_{x}"] = bool(n)
        for s, n in zip(self.states, need_gs):
            consts[f"_NEED_GS_{s}"] = bool(n)
        for p, n in zip(self.learnable, need_gp):
            consts[f"_NEED_GP_{p}"] = bool(n)
        block = self._block(N)
        grid = (triton_cdiv(N, block),)
        consts.update(_HOST=host, _BLOCK=block)
        self._launch(self.mod.bwd_kernel, grid, args, consts)
        LAUNCHES["bwd"] += 1
        return result

    # ------------------------------------------------------------------ custom ops
    def _register_ops(self) -> None:
        ns = f"flexdsl_{''.join(ch for ch in self.name.lower() if ch.isalnum())}_{self.key[:12]}"
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


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _device_of(ts) -> torch.device:
    for t in ts:
        if t is not None:
            return t.device
    return torch.device("cpu")


# ---------------------------------------------------------------------- module entry point
def forward_triton(m, inputs):
    """NeuronModule.forward on the Triton kernels (step_mode "m": [T, *shape]; "s": [*shape])."""
    c = m._compiled
    tm = get_model(c)
    single = m.step_mode == "s"
    xs = [x.unsqueeze(0) for x in inputs] if single else list(inputs)
    x0 = xs[0]
    if x0.dim() < 1:
        raise ValueError(f"{c.name}: inputs must be [T, *shape] in step_mode 'm'")
    shape = tuple(x0.shape[1:])
    xs = [x if tuple(x.shape) == tuple(x0.shape) else x.expand(x0.shape) for x in xs]
    pr_t: list[torch.Tensor | None] = []
    pr_v: list[float] = []
    for name in tm.params:
        v = getattr(m, name)
        if isinstance(v, torch.Tensor):
            pr_t.append(v)
            pr_v.append(0.0)
        else:
            pr_t.append(None)
            pr_v.append(float(v))
    inits = None
    st_t: list[torch.Tensor | None] = []
    st_v: list[float] = []
    for name in tm.states:
        v = m._states[name]
        if v is None:
            if inits is None:  # initial values, cached per param values (no AST walk per call)
                key = (id(m._compiled), tuple(pr_v)) if all(p is None for p in pr_t) else None
                inits = tm._init_cache.get(key) if key is not None else None
                if inits is None:
                    inits = {s: m._initial_value(s) for s in tm.states}
                    if key is not None and not any(isinstance(x, torch.Tensor) for x in inits.values()):
                        if len(tm._init_cache) > 64:
                            tm._init_cache.clear()
                        tm._init_cache[key] = inits
            v = inits[name]
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
    res = _call(tm, xs, [t for t in st_t if t is not None], [t for t in pr_t if t is not None], st_v, pr_v, is_t,
                bool(m.store_state_seqs), bool(save))
    n_out, n_st = len(tm.outputs), len(tm.states)
    outs = res[:n_out]
    fins = res[n_out:n_out + n_st]
    for name, f in zip(tm.states, fins):
        m._states[name] = f
    if m.store_state_seqs:
        m.state_seqs = dict(zip(tm.states, res[n_out + n_st:n_out + 2 * n_st]))
    if single:
        outs = [o[0] for o in outs]
    return outs[0] if n_out == 1 else tuple(outs)


__all__ = ["forward_triton", "get_model", "LAUNCHES", "cache_dir"]
