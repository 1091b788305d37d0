"""The Triton backend's launcher: a `TritonProgram` runs the generated kernels of one model,
with arguments built from the kernel ABI, through one `torch.library.custom_op` family per
model (so `torch.compile(fullgraph=True)` and CUDA graphs see opaque ops with fake
implementations) and a symbolic backward.

Launch heuristics, visible here and settable by environment variables:
- `FLEXDSL_TRITON_BLOCK` lanes per program (default 1024 for small kernels, 256 for big ones,
  whose registers would spill); the interpreter (`TRITON_INTERPRET=1`) uses few big programs;
- `FLEXDSL_TRITON_WARPS` warps per program (default 4);
- `FLEXDSL_TRITON_BLOCK_RC`, `FLEXDSL_TRITON_WARPS_RC`: the same for the recompute backward (default
  128 or 64 lanes, by how many values a chunk keeps in registers, and 2 warps);
- `FLEXDSL_TRITON_TRAINING=save|recompute` forces a training plan (default: the schedule's choice,
  stated in the kernels' header); `FLEXDSL_CHUNK` fixes the recompute chunk (default 8, or 4 for
  big models);
- `FLEXDSL_TRITON_FAST_LAUNCH=0` turns off the cache of compiled kernels that skips Triton's
  per-call argument binding (tens of microseconds a launch).
T is a runtime loop bound and N a runtime size: a new T or shape compiles nothing.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from ...errors import FlexDSLError
from ...settings import env_choice, env_int
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
        self.fast = env_choice("FLEXDSL_TRITON_FAST_LAUNCH") != "0"

    def launch(self, grid: tuple[int], values: dict[str, list], key: tuple, device: torch.device) -> None:
        """Launch with the arguments in ABI order. `key` must determine Triton's specialization
        of this launch (the dtypes and 16-byte alignment of the tensors that are not fresh
        allocations, ints ==1 / %16, which args are None, the constexpr values): with it, a
        cache of compiled kernels skips Triton's per-call argument binding."""
        self.launch_full(grid, [values[r][i] for r, i in self.index], key, device)

    def launch_full(self, grid: tuple[int], full: list, key: tuple, device: torch.device) -> None:
        """Launch with the full argument list, in ABI order."""
        if interpret() or not self.fast:
            self.fn[grid](*full, num_warps=self.warps)
            return
        key = (self.warps, *key)
        ck = self.cache.get(key)
        if ck is None:
            ck = self.fn[grid](*full, num_warps=self.warps)
            if hasattr(ck, "run"):
                self.cache[key] = ck
            return
        try:
            stream = _stream(device.index or 0)
            ck.run(grid[0], 1, 1, stream, ck.function, ck.packed_metadata, ck.launch_metadata(grid, stream, *full),
                   None, None, *full)
        except (TypeError, AttributeError):  # another Triton's launcher API: use the public path
            self.fast = False
            self.fn[grid](*full, num_warps=self.warps)


def _bits(vals: Sequence[float]) -> bytes:
    """Floats as a cache key: their bits (0.0 and -0.0 differ, a NaN equals itself), so that a
    key always determines what the cached value was computed from."""
    return struct.pack(f"{len(vals)}d", *vals)


def _spec(t: Any) -> Any:
    """What Triton specializes a non-constexpr argument on."""
    if t is None:
        return None
    if type(t) is float:
        return 0
    if type(t) is int:  # (Triton passes ints beyond 32 bits as i64: another kernel)
        return (t == 1, t % 16 == 0, -0x80000000 <= t <= 0x7FFFFFFF)
    return (t.dtype, t.data_ptr() % 16 == 0)


class _Plan:
    """A kernel launch with everything fixed but the call's own tensors: the argument list,
    where each call's tensors go (`slots`: position -> (kind, index)), the grid and the
    specialization key. Recorded from a first launch per call signature (shape, dtype, flags,
    float params and states), so that a later call only allocates its outputs, fills the slots
    and launches."""

    def __init__(self, kernel: _Kernel, values: dict[str, list], per_call: tuple[str, ...], grid: tuple[int],
                 key: tuple) -> None:
        self.kernel, self.grid, self.key = kernel, grid, key
        self.full = [values[r][i] for r, i in kernel.index]
        # each slot by its ABI role and index, never by the tensor's identity: one tensor may fill
        # two slots of the call that records the plan (m(a, a), one gradient for two outputs) and
        # two different tensors in a later call
        self.slots = [(j, r, i) for j, (r, i) in enumerate(kernel.index)
                      if r in per_call and self.full[j] is not None]
        for j, _, _ in self.slots:
            self.full[j] = None

    def launch(self, tensors: dict[str, list], device: torch.device) -> None:
        full = self.full.copy()
        for j, kind, i in self.slots:
            full[j] = tensors[kind][i]
        self.kernel.launch_full(self.grid, full, self.key, device)


# torch.library ops cannot be unregistered: one pair per model key and process, calling the newest
# program of that key (programs of one key are the same kernels), so that an evicted program is freed
_OPS: dict[str, tuple[Any, Any]] = {}
_OWNER: dict[str, TritonProgram] = {}


class _Owner:
    """The program the ops of namespace `ns` run: the newest loaded."""

    def __init__(self, ns: str) -> None:
        self.ns = ns

    def __getattr__(self, name: str) -> Any:
        return getattr(_OWNER[self.ns], name)


class TritonProgram:
    computes_in = torch.float32  # whatever the I/O dtype: the precision params and states are used in

    def __init__(self, module: ModuleType, abi: KernelABI, key: str) -> None:
        self.mod = module
        self.abi = abi
        self.key = key
        self.name = abi.name
        self.inputs, self.states, self.params = abi.inputs, abi.states, abi.params
        self.learnable, self.outputs = abi.learnable, abi.outputs
        self.saved, self.reread = abi.saved, abi.reread
        self.reread_idx = [self.inputs.index(x) for x in self.reread]
        self.rc_idx = [self.inputs.index(x) for x in abi.rc_inputs]
        self.grad_inputs, self.grad_states, self.grad_params = abi.grad_inputs, abi.grad_states, abi.grad_params
        self.learn_idx = [self.params.index(p) for p in self.learnable]
        self.has_hoisted = bool(abi.hoisted_fwd or abi.hoisted_bwd or abi.hoisted_rc)
        # ~8 lanes per thread for small models, fewer for big ones (whose registers would spill);
        # the kernels' argument count (params, states, saved values...) measures the size
        big = len(abi.fwd) + len(abi.bwd) >= 84
        self.block = env_int("FLEXDSL_TRITON_BLOCK") or (256 if big else 1024)
        # the recompute backward keeps a chunk's values in registers: fewer lanes per program, the
        # fewer the more it keeps (measured on an H100: LIF best at 128 lanes of 2 warps, Izhikevich at 64)
        kept = (len(abi.saved) + len(abi.reread)) * abi.chunk
        self.block_rc = env_int("FLEXDSL_TRITON_BLOCK_RC") or (128 if kept <= 8 else 64)
        warps = env_int("FLEXDSL_TRITON_WARPS") or 4
        self.k_fwd = _Kernel(module.fwd_kernel, abi.fwd, warps)
        self.k_bwd = _Kernel(module.bwd_kernel, abi.bwd, warps)
        self.k_bwd_rc = _Kernel(module.bwd_rc_kernel, abi.bwd_rc,
                                env_int("FLEXDSL_TRITON_WARPS_RC") or 2)
        # "save" or "recompute" per I/O element size (4 or 2 bytes): the schedule's choice, or
        # FLEXDSL_TRITON_TRAINING for both
        forced = env_choice("FLEXDSL_TRITON_TRAINING")
        self.plans = {4: forced or abi.training, 2: forced or abi.training16}
        self._host_cache: dict = {}
        self._plans: dict[tuple, _Plan] = {}
        self.interpret = interpret()
        self.fast_keys = not self.interpret and self.k_fwd.fast  # (the interpreter launches no compiled kernel)
        self._float_modes = [0] * len(self.params)
        self._float_initmodes = [0] * len(self.states)
        self._nones_st = [None] * len(self.states)
        self._zeros_hf = [0.0] * len(abi.hoisted_fwd)
        self._register_ops()

    @property
    def warps(self) -> int:
        return self.k_fwd.warps

    @warps.setter
    def warps(self, value: int) -> None:
        self.k_fwd.warps = self.k_bwd.warps = int(value)

    @property
    def training(self) -> str:
        """The training plan with float32 I/O; setting it forces the plan for every dtype."""
        return self.plans[4]

    @training.setter
    def training(self, value: str) -> None:
        self.plans = {4: value, 2: value}

    def default_plans(self) -> None:
        """Back to the schedule's choices."""
        self.plans = {4: self.abi.training, 2: self.abi.training16}

    def recompute(self, dtype: torch.dtype) -> bool:
        """Whether training with this I/O dtype recomputes (else saves)."""
        plan = self.plans[4 if dtype == torch.float32 else 2]
        if plan not in ("save", "recompute"):
            raise ValueError(f"FLEXDSL_TRITON_TRAINING must be 'save' or 'recompute', not {plan!r}")
        return plan == "recompute"

    # ------------------------------------------------------------------ launch helpers
    def _block(self, N: int, rc: bool = False) -> int:
        if self.interpret:  # few big programs: the interpreter runs programs one after another
            return max(16, min(4096, 1 << max(0, N - 1).bit_length()))
        return self.block_rc if rc else self.block

    def _host(self, params, param_vals) -> tuple[bool, dict]:
        """Loop invariants in float64 on the host when every param is a Python float (as the
        torch path computes them), else (False, {}): the kernel computes them."""
        if not self.has_hoisted or any(p is not None for p in params):
            return False, {}
        key = _bits(param_vals)
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

    def _params(self, params, param_vals, shape, N, dev) -> tuple[list, list]:
        """The kernel arguments of the params and their MODEs (all-float params: the values)."""
        if not any(p is not None for p in params):
            return list(param_vals), self._float_modes
        pargs, modes = [], []
        for p, v in zip(params, param_vals):
            a, mode = self._param(p, v, shape, N, dev)
            pargs.append(a)
            modes.append(mode)
        return pargs, modes

    @staticmethod
    def _unpack(tensors, vals, is_t):
        if not tensors:
            return [None] * len(is_t), vals
        it = iter(tensors)
        return [next(it) if k else None for k in is_t], vals

    def chunks(self, T: int) -> int:
        return cdiv(T, self.abi.chunk)

    def fwd_impl(self, inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save,
                 recompute=False):
        """The forward kernel. With `save`, the last result is what the backward reads: the saved
        values [K, T, *shape] or, with `recompute`, the float32 checkpoints [C - 1, S, N] (the
        states at steps K, 2K, ...; the backward starts the first chunk from the initial states)."""
        n_st = len(self.states)
        states, state_vals = self._unpack(states, state_vals, is_tensor[:n_st])
        params, param_vals = self._unpack(params, param_vals, is_tensor[n_st:])
        return self._fwd(inputs, states, params, state_vals, param_vals, store_seqs, save, recompute)

    def _fwd(self, inputs, states, params, state_vals, param_vals, store_seqs, save, recompute):
        """fwd_impl with states and params as lists (None where a value is a float)."""
        x0 = inputs[0]
        T = x0.shape[0]
        shape = x0.shape[1:]
        N = x0.numel() // T if T else _prod(shape)
        dev, dtype = x0.device, x0.dtype
        n_st = len(self.states)
        outs = [torch.empty(x0.shape, dtype=dtype, device=dev) for _ in self.outputs]
        fins = [torch.empty(shape, dtype=dtype, device=dev) for _ in self.states]
        seqs = [torch.empty(x0.shape, dtype=dtype, device=dev) for _ in self.states] if store_seqs else []
        sav = ckpt = None
        if save and recompute:
            ckpt = torch.empty((max(self.chunks(T) - 1, 0), n_st, N), dtype=torch.float32, device=dev)
        elif save and self.saved:
            sav = torch.empty((len(self.saved), *x0.shape), dtype=dtype, device=dev)
        extra = sav if sav is not None else ckpt
        result = outs + fins + seqs + ([extra] if extra is not None else [])
        if N == 0:
            return result
        # a call like an earlier one (float states and params, contiguous aligned inputs): its plan
        sig = None
        if not any(t is not None for t in (*states, *params)) and all(
                x.is_contiguous() and x.data_ptr() % 16 == 0 for x in inputs):
            sig = (T, N, dtype, dev, store_seqs, sav is not None, ckpt is not None, self.block, self.k_fwd.warps,
                   _bits(state_vals), _bits(param_vals), *(x.dtype for x in inputs))
            plan = self._plans.get(sig)
            if plan is not None:
                plan.launch({"in": inputs, "out": outs, "fin": fins, "seq": seqs, "saved": [sav], "ckpt": [ckpt]},
                            dev)
                LAUNCHES["fwd"] += 1
                return result
        xs, strides = [], []
        for x in inputs:  # (a contiguous [T, *shape] tensor is already [T, N] in memory)
            x2 = x if x.is_contiguous() else x.reshape(T, N)
            if not x2.is_contiguous() and x2.stride(1) != 1:
                x2 = x2.contiguous()
            xs.append(x2)
            strides.append(N if x2 is x else x2.stride(0))
        if any(s is not None for s in states):
            inits, initmodes = [], []
            for s, v in zip(states, state_vals):
                if s is None:
                    inits.append(float(v))
                    initmodes.append(0)
                else:
                    inits.append(s.to(dev).expand(shape).reshape(N))
                    initmodes.append(2)
        else:
            inits, initmodes = state_vals, self._float_initmodes
        pargs, modes = self._params(params, param_vals, shape, N, dev)
        host, hv = self._host(params, param_vals)
        block = self._block(N)
        values = {
            "in": xs, "stride": strides, "init": inits, "param": pargs, "out": outs, "fin": fins,
            "seq": seqs if store_seqs else self._nones_st,
            "hoisted": [hv.get(y, 0.0) for y in self.abi.hoisted_fwd] if host else self._zeros_hf,
            "saved": [sav], "ckpt": [ckpt], "N": [N], "T": [T], "initmode": initmodes, "mode": modes,
            "host": [host], "store_seqs": [bool(store_seqs)], "save": [sav is not None],
            "checkpoint": [ckpt is not None], "round": [sav is not None], "block": [block],
        }
        if self.fast_keys:
            key = (dtype, bool(store_seqs), sav is not None, ckpt is not None, host, block, N == 1, N % 16 == 0,
                   *map(_spec, xs), *map(_spec, strides), *map(_spec, inits), *map(_spec, pargs), *initmodes,
                   *modes)
        else:
            key = ()
        grid = (cdiv(N, block),)
        self.k_fwd.launch(grid, values, key, dev)
        if sig is not None:
            self._remember(sig, _Plan(self.k_fwd, values, ("in", "out", "fin", "seq", "saved", "ckpt"), grid, key))
        LAUNCHES["fwd"] += 1
        return result

    def _remember(self, sig: tuple, plan: _Plan) -> None:
        if len(self._plans) > 64:
            self._plans.clear()
        self._plans[sig] = plan

    def bwd_impl(self, reread, saved, params, param_vals, is_param_t, g_outs, g_seqs, g_fins, need, T, shape, dtype,
                 recompute=False, states=(), state_vals=(), is_state_t=()):
        """The backward kernel: `reread` are the inputs it reads again (per the plan), `saved`
        the forward's saved values or, with `recompute`, its checkpoints (then `states` and
        `state_vals` are the initial states, where the first chunk starts)."""
        params, param_vals = self._unpack(params, param_vals, is_param_t)
        st, state_vals = self._unpack(states, state_vals, is_state_t) if recompute else ([], [])
        return self._bwd(reread, saved, params, param_vals, g_outs, g_seqs, g_fins, need, T, tuple(shape), dtype,
                         recompute, st, list(state_vals))

    def _bwd(self, reread, saved, params, param_vals, g_outs, g_seqs, g_fins, need, T, shape, dtype, recompute,
             states=(), state_vals=()):
        """bwd_impl with params (and, recomputing, the initial states) as lists, None where a
        value is a float."""
        N = _prod(shape)
        n_in, n_st = len(self.inputs), len(self.states)
        need_gx, need_gs, need_gp = need[:n_in], need[n_in:n_in + n_st], need[n_in + n_st:]
        dev = _device_of([saved, *reread, *g_outs, *g_seqs, *g_fins, *params])
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
        if not recompute:
            states, state_vals = (), ()
        elif not states:
            states, state_vals = self._nones_st, [0.0] * len(self.states)
        sig = None
        if not any(p is not None for p in (*params, *states)) and all(
                t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (*reread, *g_outs, *g_seqs, *g_fins)
                if t is not None):
            sig = ("bwd", T, N, dtype, dev, recompute, self.block_rc if recompute else self.block,
                   (self.k_bwd_rc if recompute else self.k_bwd).warps, *need, _bits(param_vals), _bits(state_vals),
                   *(x.dtype for x in reread),
                   *((None if g is None else g.dtype) for g in (*g_outs, *g_seqs, *g_fins)),
                   None if saved is None else saved.dtype)
            plan = self._plans.get(sig)
            if plan is not None:
                idx = self.rc_idx if recompute else self.reread_idx
                xs_call: list[Any] = [None] * n_in
                for i, x in zip(idx, reread):
                    xs_call[i] = x
                plan.launch({"in": xs_call, "saved": [saved], "ckpt": [saved], "gout": g_outs, "gseq": g_seqs,
                             "gfin": g_fins, "gx": gx, "gs": gs, "gp": gp}, dev)
                LAUNCHES["bwd_rc" if recompute else "bwd"] += 1
                return result
        xs: list[Any] = [None] * n_in
        strides = [0] * n_in
        for i, x in zip(self.rc_idx if recompute else self.reread_idx, reread):
            x2 = x if x.is_contiguous() else x.reshape(T, N)
            if not x2.is_contiguous() and x2.stride(1) != 1:
                x2 = x2.contiguous()
            xs[i], strides[i] = x2, N if x2 is x else x2.stride(0)
        pargs, modes = self._params(params, param_vals, shape, N, dev)
        inits = [float(v) if s is None else s.to(dev).expand(shape).reshape(N) for s, v in zip(states, state_vals)]
        initmodes = [0 if s is None else 2 for s in states]

        def flat(g, lead):
            if g is None or g.is_contiguous():  # (flat in memory already)
                return g
            return g.reshape(*lead, N).contiguous()

        host, hv = self._host(params, param_vals)
        block = self._block(N, recompute)
        hoisted = self.abi.hoisted_rc if recompute else self.abi.hoisted_bwd
        gout = [flat(g, (T,)) for g in g_outs]
        gseq = [flat(g, (T,)) for g in g_seqs] if any(g is not None for g in g_seqs) else self._nones_st
        gfin = [flat(g, ()) for g in g_fins]
        values = {
            "in": xs, "stride": strides, "saved": [saved], "ckpt": [saved], "param": pargs,
            "gout": gout, "gseq": gseq, "gfin": gfin, "gx": gx, "gs": gs, "gp": gp,
            "hoisted": [hv.get(y, 0.0) for y in hoisted] if host else [0.0] * len(hoisted),
            "N": [N], "T": [T], "C": [self.chunks(T)], "init": inits, "initmode": initmodes, "mode": modes,
            "hasgout": [g is not None for g in gout], "hasgseq": [g is not None for g in gseq],
            "hasgfin": [g is not None for g in gfin], "needgx": need_gx, "needgs": need_gs, "needgp": need_gp,
            "host": [host], "block": [block],
        }
        if self.fast_keys:
            key = (dtype, host, block, N == 1, N % 16 == 0, *map(_spec, xs), *map(_spec, strides), _spec(saved),
                   *map(_spec, pargs), *modes, *map(_spec, inits), *initmodes, *map(_spec, gout), *map(_spec, gseq), *map(_spec, gfin), *need)
        else:
            key = ()
        kernel = self.k_bwd_rc if recompute else self.k_bwd
        grid = (cdiv(N, block),)
        kernel.launch(grid, values, key, dev)
        if sig is not None:
            self._remember(sig, _Plan(kernel, values, ("in", "saved", "ckpt", "gout", "gseq", "gfin", "gx", "gs",
                                                        "gp"), grid, key))
        LAUNCHES["bwd_rc" if recompute else "bwd"] += 1
        return result

    # ------------------------------------------------------------------ custom ops
    def _register_ops(self) -> None:
        ns = f"flexdsl_{''.join(ch for ch in self.name.lower() if ch.isascii() and ch.isalnum())[:24]}_{self.key[:16]}"
        _OWNER[ns] = self  # the ops of a key are registered once per process and run its newest program
        if ns in _OPS:
            self.op_fwd, self.op_bwd = _OPS[ns]
            return
        tm: Any = _Owner(ns)
        n_out, n_st = len(self.outputs), len(self.states)
        lib_ops = torch.library

        @lib_ops.custom_op(f"{ns}::fwd", mutates_args=())
        def fwd(inputs: list[torch.Tensor], states: list[torch.Tensor], params: list[torch.Tensor],
                state_vals: list[float], param_vals: list[float], is_tensor: list[bool], store_seqs: bool,
                save: bool, recompute: bool) -> list[torch.Tensor]:
            return tm.fwd_impl(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save,
                               recompute)

        @fwd.register_fake
        def _(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute):
            x0 = inputs[0]
            T, shape = x0.shape[0], x0.shape[1:]
            mk = lambda sh: x0.new_empty(sh)  # noqa: E731
            res = [mk((T, *shape)) for _ in range(n_out)] + [mk(shape) for _ in range(n_st)]
            if store_seqs:
                res += [mk((T, *shape)) for _ in range(n_st)]
            if save and recompute:
                res.append(x0.new_empty((max(tm.chunks(T) - 1, 0), n_st, _prod(shape)), dtype=torch.float32))
            elif save and tm.saved:
                res.append(mk((len(tm.saved), T, *shape)))
            return res

        @lib_ops.custom_op(f"{ns}::bwd", mutates_args=())
        def bwd(reread: list[torch.Tensor], saved: torch.Tensor | None, params: list[torch.Tensor],
                param_vals: list[float], is_param_t: list[bool], g_outs: list[torch.Tensor | None],
                g_seqs: list[torch.Tensor | None], g_fins: list[torch.Tensor | None], need: list[bool],
                T: int, shape: list[int], dtype: torch.dtype, recompute: bool, states: list[torch.Tensor],
                state_vals: list[float], is_state_t: list[bool]) -> list[torch.Tensor]:
            return tm.bwd_impl(reread, saved, params, param_vals, is_param_t, g_outs, g_seqs, g_fins, need, T,
                               shape, dtype, recompute, states, state_vals, is_state_t)

        @bwd.register_fake
        def _(reread, saved, params, param_vals, is_param_t, g_outs, g_seqs, g_fins, need, T, shape, dtype,
              recompute, states, state_vals, is_state_t):
            n_in = len(tm.inputs)
            like = next(t for t in [*reread, saved, *g_outs, *g_seqs, *g_fins, *params] if t is not None)
            res = [like.new_empty((T, *shape), dtype=dtype) for n in need[:n_in] if n]
            res += [like.new_empty(tuple(shape), dtype=torch.float32) for n in need[n_in:] if n]
            return res

        def setup_context(ctx, inputs, output):
            _setup(tm, ctx, *inputs, output)

        def backward(ctx, grads):
            if not torch.compiler.is_compiling():
                _first_order_only(tm)

            def run(reread, sav, params, states, g_outs, g_seqs, g_fins, need):
                return bwd(reread, sav, [p for p in params if p is not None], ctx.param_vals,
                           [p is not None for p in params], g_outs, g_seqs, g_fins, need, ctx.T, list(ctx.shape),
                           ctx.dtype, ctx.recompute, [s for s in states if s is not None], ctx.state_vals,
                           [s is not None for s in states])

            g_in, g_st, g_pr = _backward(tm, ctx, grads, run)
            return g_in, g_st, g_pr, None, None, None, None, None, None

        fwd.register_autograd(backward, setup_context=setup_context)
        self.op_fwd = fwd
        self.op_bwd = bwd
        _OPS[ns] = (fwd, bwd)

    # ------------------------------------------------------------------ the Program interface
    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool) -> RunResult:
        x0 = inputs[0]
        if x0.device.type != "cuda" and not self.interpret:
            raise FlexDSLError(f"the Triton kernels run on CUDA tensors, but the input is on {x0.device}",
                               self.abi.name, hint="move the module and the input to a GPU (m.to('cuda')), use "
                                                   "backend='auto' (the torch path for CPU tensors), or set "
                                                   "TRITON_INTERPRET=1 before importing flexdsl to run the "
                                                   "kernels in Triton's interpreter")
        if x0.dtype not in _DTYPES:
            raise FlexDSLError(f"the Triton kernels take float32, float16 or bfloat16 inputs, not {x0.dtype}",
                               self.abi.name, hint="use backend='torch' for float64")
        if not torch.compiler.is_compiling() and any(
                transformed(t) for t in (*inputs, *states, *params) if isinstance(t, torch.Tensor)):
            raise FlexDSLError("torch.func transforms (grad, vmap, jacrev, jvp, functional_call with them...) do "
                               f"not go through the Triton kernels of {self.name}", self.abi.name,
                               hint="use backend='torch' for this model (backend='auto' picks it for inputs under a "
                                    "transform)")
        if len(inputs) > 1:
            full = (x0.shape[0], *torch.broadcast_shapes(*(x.shape[1:] for x in inputs)))
            xs = [x if x.shape == full else x.expand(full) for x in inputs]
        else:
            xs = list(inputs)
        shape = xs[0].shape[1:]
        grad = torch.is_grad_enabled()
        save = grad and any(x.requires_grad for x in xs)
        st: list[Any] = []
        st_vals: list[float] = []
        for v in states:
            if isinstance(v, torch.Tensor):
                if v.shape != shape or v.device != x0.device:
                    v = v.to(x0.device).expand(shape)
                save = save or (grad and v.requires_grad)
                st.append(v)
                st_vals.append(0.0)
            else:
                st.append(None)
                st_vals.append(float(v))
        pr: list[Any] = []
        pr_vals: list[float] = []
        for v in params:
            if isinstance(v, torch.Tensor):
                save = save or (grad and v.requires_grad)
                pr.append(v)
                pr_vals.append(0.0)
            else:
                pr.append(None)
                pr_vals.append(float(v))
        store_seqs = bool(store_seqs)
        recompute = save and self.recompute(x0.dtype)
        if torch.compiler.is_compiling():
            is_t = [t is not None for t in [*st, *pr]]
            res = self.op_fwd(xs, [t for t in st if t is not None], [t for t in pr if t is not None], st_vals,
                              pr_vals, is_t, store_seqs, save, recompute)
        elif not save:
            res = self._fwd(xs, st, pr, st_vals, pr_vals, store_seqs, False, False)
        else:
            res = _Eager.apply((self, xs, st, pr, st_vals, pr_vals, store_seqs, recompute), *xs,
                               *(t for t in st if t is not None), *(t for t in pr if t is not None))
        n_out, n_st = len(self.outputs), len(self.states)
        return RunResult(list(res[:n_out]), list(res[n_out:n_out + n_st]),
                         list(res[n_out + n_st:n_out + 2 * n_st]) if store_seqs else None)


_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_is_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)


def transformed(t: torch.Tensor) -> bool:
    """Whether `t` is a tensor of a torch.func transform (no memory of its own to launch on)."""
    return _is_wrapped is not None and bool(_is_wrapped(t))


def _setup(tm, ctx, xs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute, output):
    """What the backward needs (the custom op's setup_context)."""
    n_st = len(tm.states)
    st, _ = tm._unpack(states, state_vals, is_tensor[:n_st])
    pr, _ = tm._unpack(params, param_vals, is_tensor[n_st:])
    _keep(tm, ctx, xs, st, pr, state_vals, param_vals, store_seqs, save, recompute, output)


def _keep(tm, ctx, xs, st, pr, state_vals, param_vals, store_seqs, save, recompute, output):
    """Keep on `ctx` what the backward needs; `st` and `pr` hold the state and param tensors
    (None where a value is a float). Recomputing, the initial states are kept too (a reference,
    no copy): the backward starts the first chunk from them."""
    n_out, n_st = len(tm.outputs), len(tm.states)
    x0 = xs[0]
    ctx.T, ctx.shape, ctx.dtype = x0.shape[0], tuple(x0.shape[1:]), x0.dtype
    ctx.store_seqs = store_seqs
    ctx.recompute = recompute
    ctx.param_vals = param_vals
    ctx.state_vals = list(state_vals)
    ctx.pr_none = [p is None for p in pr]
    ctx.st_kept = [recompute and s is not None for s in st]
    ctx.st = [s is not None for s in st]
    ctx.param_shapes = [None if p is None else p.shape for p in pr]
    ctx.need = [*(x.requires_grad and nz for x, nz in zip(xs, tm.grad_inputs)),
                *(s is not None and s.requires_grad and nz for s, nz in zip(st, tm.grad_states)),
                *(pr[i] is not None and pr[i].requires_grad and nz for i, nz in zip(tm.learn_idx, tm.grad_params))]
    ctx.state_dtypes = [None if s is None else s.dtype for s in st]
    extra = save and (recompute or bool(tm.saved))
    sav = output[n_out + n_st + (n_st if store_seqs else 0)] if extra else None
    idx = tm.rc_idx if recompute else tm.reread_idx
    ctx.n_reread = len(idx)
    ctx.save_for_backward(*[xs[i] for i in idx], sav, *(p for p in pr if p is not None),
                          *(s for s, k in zip(st, ctx.st_kept) if k))
    ctx.set_materialize_grads(False)


def _backward(tm, ctx, grads, run):
    """The gradients of a call: (of the inputs, of the state tensors, of the param tensors).
    `run(reread, saved, params, states, g_outs, g_seqs, g_fins, need)` launches the backward
    kernel (`params` and `states` with None where a value was a float or is not needed)."""
    n_out, n_st, n_in = len(tm.outputs), len(tm.states), len(tm.inputs)
    saved = ctx.saved_tensors
    k = ctx.n_reread
    reread, sav = list(saved[:k]), saved[k]
    it = iter(saved[k + 1:])
    params = [None if none else next(it) for none in ctx.pr_none]
    states = [next(it) if kept else None for kept in ctx.st_kept]
    g_outs = list(grads[:n_out])
    g_fins = list(grads[n_out:n_out + n_st])
    g_seqs = list(grads[n_out + n_st:n_out + 2 * n_st]) if ctx.store_seqs else tm._nones_st
    need = ctx.need
    g_in: list = [None] * n_in
    g_st: list = [None] * n_st
    g_pr: list = [None] * len(ctx.param_shapes)
    if any(need) and not all(g is None for g in [*g_outs, *g_fins, *g_seqs]):
        res = iter(run(reread, sav, params, states, g_outs, g_seqs, g_fins, need))
        for i in range(n_in):
            if need[i]:
                g_in[i] = next(res)
        for i in range(n_st):
            if need[n_in + i]:
                g_st[i] = next(res).to(ctx.state_dtypes[i])
        for i, n in zip(tm.learn_idx, need[n_in + n_st:]):
            if n:
                g = next(res)
                pshape = ctx.param_shapes[i]
                g_pr[i] = g.sum().reshape(pshape) if _prod(pshape) == 1 else g.sum_to_size(pshape)
    return (g_in, [g for g, t in zip(g_st, ctx.st) if t],
            [g for g, none in zip(g_pr, ctx.pr_none) if not none])


def _first_order_only(tm) -> None:
    """The backward kernel's gradients are not differentiable: under create_graph=True (grad
    mode on in a backward) they would silently act as constants, and second-order gradients
    through the kernels would be zero."""
    if torch.is_grad_enabled():
        raise FlexDSLError("second-order gradients (create_graph=True) cannot go through the Triton kernels of "
                           f"{tm.name}: their backward is a kernel, and its results are not differentiable",
                           tm.abi.name, hint="use backend='torch' for this model (its backward is differentiable)")


class _Eager(torch.autograd.Function):
    """The eager path: the same kernels without the dispatcher's per-call cost of custom ops."""

    @staticmethod
    def forward(ctx, call, *tensors):
        tm, xs, st, pr, st_vals, pr_vals, store_seqs, recompute = call
        res = tm._fwd(xs, st, pr, st_vals, pr_vals, store_seqs, True, recompute)
        ctx.tm = tm
        _keep(tm, ctx, xs, st, pr, st_vals, pr_vals, store_seqs, True, recompute, res)
        n_keep = len(tm.outputs) + len(tm.states) * (2 if store_seqs else 1)
        if len(res) > n_keep:
            ctx.mark_non_differentiable(*res[n_keep:])
        return tuple(res)

    @staticmethod
    def backward(ctx, *grads):
        tm = ctx.tm
        _first_order_only(tm)

        def run(reread, sav, params, states, g_outs, g_seqs, g_fins, need):
            return tm._bwd(reread, sav, params, ctx.param_vals, g_outs, g_seqs, g_fins, need, ctx.T, ctx.shape,
                           ctx.dtype, ctx.recompute, states, ctx.state_vals)

        g_in, g_st, g_pr = _backward(tm, ctx, grads, run)
        return (None, *g_in, *g_st, *g_pr)


__all__ = ["TritonProgram", "LAUNCHES", "interpret", "transformed"]
