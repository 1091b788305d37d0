"""The Triton backend's program: a `TritonProgram` runs the generated kernels of one model, with
arguments built from the kernel ABI (`args.py`), launch plans recorded per call signature
(`kernel.py`), and the custom ops and autograd of `glue.py` (one custom-op pair, built by `backends/ops.py`,
per model, so `torch.compile(fullgraph=True)` and CUDA graphs see opaque ops with fake
implementations; the backward is the derived one). Kernels: `fwd` (inference, state sequences,
training saves or checkpoints), `bwd` (the saving plan's backward) and `bwd_rc` (the recompute
plan's backward).

Launch heuristics, visible here and settable by environment variables:
- `FLEXDSL_TRITON_BLOCK` lanes per program (default 1024 for small kernels, 256 for big ones,
  whose registers would spill); the interpreter (`TRITON_INTERPRET=1`) uses few big programs;
- `FLEXDSL_TRITON_WARPS` warps per program (default 4);
- `FLEXDSL_TRITON_BLOCK_RC`, `FLEXDSL_TRITON_WARPS_RC`: the same for the recompute backward (default
  128 or 64 lanes, by how many values a chunk keeps in registers, and 2 warps);
- `FLEXDSL_TRITON_TRAINING=save|recompute` forces a training plan (default: the schedule's choice,
  stated in the kernels' header); `FLEXDSL_CHUNK` fixes the recompute chunk (default 8, or 4 for
  big models);
- `FLEXDSL_TRITON_INDUCTOR=0`: under torch.compile on CUDA, the custom ops of `glue.py` instead of
  the `triton_op`s of `inductor.py` (whose kernels Inductor's code launches);
- `FLEXDSL_TRITON_FAST_LAUNCH=0` turns off the cache of compiled kernels that skips Triton's
  per-call argument binding (tens of microseconds a launch).
T is a runtime loop bound and N a runtime size: a new T or shape compiles nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from ...errors import FlexDSLError
from ...settings import env_choice, env_int
from ..base import NoiseKey, RunResult, key_ints, key_tensor, transformed
from . import inductor
from .abi import NOISE_ROLES, KernelABI
from .args import (
    HostInvariants,
    alloc,
    arg_key,
    bwd_key,
    fits,
    flat_grad,
    flat_input,
    fwd_key,
    param_args,
    state_args,
    step_order,
    unpack,
)
from .glue import Call, Eager, Grads, register_ops
from .kernel import LAUNCHES, Kernel, LaunchPlan, LaunchPlans, bits, cdiv, device_of, interpret, prod, wrapped


def _donated(x: Any, T: int, shape: tuple, order: Any, dtype: torch.dtype) -> torch.Tensor | None:
    """`x` (an input the backward reads again) as the buffer of its own gradient, where it was donated
    (`packed.donate`: recomputed for this backward alone) and is laid out as the gradient would be. The
    kernels read a lane's input at a step before they write its gradient there (the recompute plan
    re-runs a chunk's steps before walking back through them), so the two may share memory."""
    if x is None or torch.compiler.is_compiling() or wrapped():  # (traced: fake tensors, no donations)
        return None
    from .. import packed

    if packed.DONATION[0] is None:
        return None
    if (order is not None or x.dtype != dtype or tuple(x.shape) != (T, *shape) or not x.is_contiguous()
            or x.data_ptr() % 16):
        return None

    return x if packed.take_donation(x) else None

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TritonProgram:
    computes_in = torch.float32  # whatever the I/O dtype: the precision params and states are used in
    reads_any_float = True  # a tensor param or initial state of any floating dtype is loaded in float32

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
        self.host = HostInvariants(module, bool(abi.hoisted_fwd or abi.hoisted_bwd or abi.hoisted_rc))
        # ~8 lanes per thread for small models, fewer for big ones (whose registers would spill);
        # the kernels' argument count (params, states, saved values...) measures the size
        big = len(abi.fwd) + len(abi.bwd) >= 84
        self.block = env_int("FLEXDSL_TRITON_BLOCK") or (256 if big else 1024)
        # the recompute backward keeps a chunk's values in registers: fewer lanes per program, the
        # fewer the more it keeps (measured on an H100: LIF best at 128 lanes of 2 warps, Izhikevich at 64)
        kept = (len(abi.saved) + len(abi.reread)) * abi.chunk
        self.block_rc = env_int("FLEXDSL_TRITON_BLOCK_RC") or (128 if kept <= 8 else 64)
        warps = env_int("FLEXDSL_TRITON_WARPS") or 4
        self.k_fwd = Kernel(module.fwd_kernel, abi.fwd, warps)
        self.k_bwd = Kernel(module.bwd_kernel, abi.bwd, warps)
        self.k_bwd_rc = Kernel(module.bwd_rc_kernel, abi.bwd_rc, env_int("FLEXDSL_TRITON_WARPS_RC") or 2)
        # "save" or "recompute" per I/O element size (4 or 2 bytes): the schedule's choice, or
        # FLEXDSL_TRITON_TRAINING for both
        forced = env_choice("FLEXDSL_TRITON_TRAINING")
        self.train_plans = {4: forced or abi.train_plan, 2: forced or abi.train_plan16}
        self.launch_plans = LaunchPlans()
        self.interpret = interpret()
        self.fast_keys = not self.interpret and self.k_fwd.fast  # (the interpreter launches no compiled kernel)
        self._float_modes = [0] * len(self.params)
        self._float_initmodes = [0] * len(self.states)
        self._nones_st = [None] * len(self.states)
        self._zeros_hf = [0.0] * len(abi.hoisted_fwd)
        self.op_fwd, self.op_bwd = register_ops(self)
        # the ops Inductor traces into on CUDA (not for the interpreter, nor a noisy model: inductor.py)
        self.op_fwd_cuda = None if self.interpret or abi.draws else inductor.register_triton_ops(self)[0]

    @property
    def warps(self) -> int:
        return self.k_fwd.warps

    @warps.setter
    def warps(self, value: int) -> None:
        self.k_fwd.warps = self.k_bwd.warps = int(value)

    @property
    def train_plan(self) -> str:
        """The training plan with float32 I/O; setting it forces the plan for every dtype."""
        return self.train_plans[4]

    @train_plan.setter
    def train_plan(self, value: str) -> None:
        self.train_plans = {4: value, 2: value}

    def default_train_plans(self) -> None:
        """Back to the cost model's choices."""
        self.train_plans = {4: self.abi.train_plan, 2: self.abi.train_plan16}

    def recompute(self, dtype: torch.dtype) -> bool:
        """Whether training with this I/O dtype recomputes (else saves)."""
        plan = self.train_plans[4 if dtype == torch.float32 else 2]
        if plan not in ("save", "recompute"):
            raise ValueError(f"FLEXDSL_TRITON_TRAINING must be 'save' or 'recompute', not {plan!r}")
        return plan == "recompute"

    def _block(self, N: int, rc: bool = False) -> int:
        if self.interpret:  # few big programs: the interpreter runs programs one after another
            return max(16, min(4096, 1 << max(0, N - 1).bit_length()))
        return self.block_rc if rc else self.block

    def chunks(self, T: int) -> int:
        return cdiv(T, self.abi.chunk)

    def call(self, xs, state_vals, param_vals, is_tensor, store_seqs: bool, recompute: bool,
             noise: NoiseKey | None = None) -> Call:
        """The `Call` record of a call (`is_tensor`: per state, then per param; `noise`: the key of a
        noisy model's draws, whose steps run in C order: its elements are numbered in it)."""
        n_st = len(self.states)
        x0 = xs[0]
        if self.abi.draws and noise is None:
            raise ValueError(f"{self.name} draws random numbers: its program needs the call's NoiseKey")
        key = (noise.seed, noise.t0) if noise is not None else (0, 0)
        return Call(x0.shape[0], tuple(x0.shape[1:]), x0.dtype, list(param_vals), list(is_tensor[n_st:]),
                    list(state_vals), list(is_tensor[:n_st]), bool(store_seqs), bool(recompute),
                    None if self.abi.draws else step_order(x0), *key)

    # ------------------------------------------------------------------ forward
    def fwd_impl(self, inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save,
                 recompute=False, key=None):
        """The forward op: the kernel, with states and params as the custom op passes them (the
        tensors, their float values, which are tensors). With `save`, the last result is what
        the backward reads: the saved values [K, T, *shape] or, with `recompute`, the float32
        checkpoints [C - 1, S, N] (the states at steps K, 2K, ...; the backward starts the first
        chunk from the initial states)."""
        call = self.call(inputs, state_vals, param_vals, is_tensor, store_seqs, recompute,
                         NoiseKey(*key_ints(key)) if key is not None else None)
        return self._fwd(inputs, unpack(states, (), call.state_is_t), unpack(params, (), call.param_is_t), call,
                         save)

    def _fwd(self, inputs, states, params, call: Call, save: bool):
        """The forward kernel with states and params as lists (None where a value is a float)."""
        x0 = inputs[0]
        T, shape = x0.shape[0], x0.shape[1:]
        N = x0.numel() // T if T else prod(shape)
        dev, dtype = x0.device, x0.dtype
        store_seqs, recompute, order = call.store_seqs, call.recompute, call.order
        outs = [alloc((T,), shape, order, dtype, dev) for _ in self.outputs]
        fins = [alloc((), shape, order, dtype, dev) for _ in self.states]
        seqs = [alloc((T,), shape, order, dtype, dev) for _ in self.states] if store_seqs else []
        sav = ckpt = None
        if save and recompute:
            ckpt = torch.empty((max(self.chunks(T) - 1, 0), len(self.states), N), dtype=torch.float32, device=dev)
        elif save and self.saved:
            sav = torch.empty((len(self.saved), *x0.shape), dtype=dtype, device=dev)
        extra = sav if sav is not None else ckpt
        result = outs + fins + seqs + ([extra] if extra is not None else [])
        if N == 0:
            return result
        tensors = {"in": inputs, "out": outs, "fin": fins, "seq": seqs, "saved": [sav], "ckpt": [ckpt]}
        if self.abi.draws:  # (the key of the draws changes from call to call: a slot of the plan)
            tensors.update(call.key_values())
        # a call like an earlier one (inputs flat in memory and aligned): its plan. Float states and
        # params are part of the signature by their bits; tensor ones (under torch.compile every
        # param is a tensor) by their kernel MODE, dtype and alignment, and are the call's own
        # arguments
        traced = wrapped()  # (in a triton_op's body: tensors without data, no plans)
        if traced:
            aligned = False
        elif order is None:
            aligned = all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in inputs)
        else:
            aligned = all(fits(x, 1, shape, order, N) and x.data_ptr() % 16 == 0 for x in inputs)
        floats = not any(t is not None for t in (*states, *params))
        sig = None
        if floats and aligned:
            sig = (T, N, dtype, dev, store_seqs, sav is not None, ckpt is not None, self.block, self.k_fwd.warps,
                   bits(call.state_vals), bits(call.param_vals), order, *(x.dtype for x in inputs))
        elif not floats:
            inits, initmodes = state_args(states, call.state_vals, shape, N, dev, self._float_initmodes, order)
            pargs, modes = param_args(params, call.param_vals, shape, N, dev, self._float_modes, order)
            tensors["init"], tensors["param"] = inits, pargs
            if aligned:
                sig = ("t", T, N, dtype, dev, store_seqs, sav is not None, ckpt is not None, self.block,
                       self.k_fwd.warps, order, *initmodes, *modes, *map(arg_key, inits), *map(arg_key, pargs),
                       *(x.dtype for x in inputs))
        plan = self.launch_plans.get(sig)
        if plan is not None:
            plan.launch(tensors, dev)
            LAUNCHES["fwd"] += 1
            return result
        flat = [flat_input(x, T, N, order) for x in inputs]
        if floats:
            inits, initmodes = state_args(states, call.state_vals, shape, N, dev, self._float_initmodes)
            pargs, modes = param_args(params, call.param_vals, shape, N, dev, self._float_modes)
        host, hv = self.host(params, call.param_vals)
        block = self._block(N)
        values = {
            "in": [x for x, _ in flat], "stride": [s for _, s in flat], "init": inits, "param": pargs,
            "out": outs, "fin": fins, "seq": seqs if store_seqs else self._nones_st,
            "hoisted": [hv.get(y, 0.0) for y in self.abi.hoisted_fwd] if host else self._zeros_hf,
            "saved": [sav], "ckpt": [ckpt], "N": [N], "T": [T], "initmode": initmodes, "mode": modes,
            "host": [host], "store_seqs": [bool(store_seqs)], "save": [sav is not None],
            "checkpoint": [ckpt is not None], "round": [sav is not None], "block": [block],
            **call.key_values(),
        }
        key = fwd_key(values, dtype, N) if self.fast_keys and not traced else ()
        grid = (cdiv(N, block),)
        self.k_fwd.launch(grid, values, key, dev)
        if sig is not None:
            self.launch_plans.remember(sig, LaunchPlan(self.k_fwd, values, tuple(tensors), grid, key))
        LAUNCHES["fwd"] += 1
        return result

    # ------------------------------------------------------------------ backward
    def bwd(self, call: Call, reread, saved, params, states, grads: Grads, need):
        """The backward kernel: `reread` are the inputs it reads again (per the plan), `saved`
        the forward's saved values or, recomputing, its checkpoints (then `states` are the
        initial states, where the first chunk starts); `params` and `states` as lists, None
        where a value is a float."""
        T, shape, dtype, recompute, order = call.T, tuple(call.shape), call.dtype, call.recompute, call.order
        N = prod(shape)
        n_in, n_st = len(self.inputs), len(self.states)
        need_gx, need_gs, need_gp = need[:n_in], need[n_in:n_in + n_st], need[n_in + n_st:]
        dev = device_of([saved, *reread, *grads.outs, *grads.seqs, *grads.fins, *params])
        donors = dict(zip(self.rc_idx if recompute else self.reread_idx, reread))
        gx = [None] * n_in
        for i, n in enumerate(need_gx):
            if n:
                d = _donated(donors.get(i), T, shape, order, dtype)
                gx[i] = d if d is not None else alloc((T,), shape, order, dtype, dev)
        gs = [alloc((), shape, order, torch.float32, dev) if n else None for n in need_gs]
        gp = [alloc((), shape, order, torch.float32, dev) if n else None for n in need_gp]
        result = [g for g in [*gx, *gs, *gp] if g is not None]
        if N == 0:
            return result
        if T == 0:  # nothing to run backward through: the initial states get the final states' grads
            for i, g in enumerate(gs):
                if g is not None:
                    g.copy_(grads.fins[i] if grads.fins[i] is not None else torch.zeros((), device=dev))
            for g in gp:
                if g is not None:
                    g.zero_()
            return result
        state_vals: Sequence[float] = call.state_vals
        if not recompute:
            states, state_vals = (), ()
        elif not states:
            states, state_vals = self._nones_st, [0.0] * len(self.states)
        out: dict[str, list] = {"gx": gx, "gs": gs, "gp": gp}
        args = None
        if any(p is not None for p in (*params, *states)):  # (the kernel arguments of tensor params and states)
            args = (param_args(params, call.param_vals, shape, N, dev, self._float_modes, order),
                    state_args(states, state_vals, shape, N, dev, [0] * len(states), order))
            out["param"], out["init"] = args[0][0], args[1][0]
        traced = wrapped()  # (in a triton_op's body: tensors without data, no plans)
        sig = None if traced else self._bwd_signature(call, reread, saved, args, state_vals, grads, need, N, dev)
        plan = self.launch_plans.get(sig)
        if plan is not None:
            xs_call: list[Any] = [None] * n_in
            for i, x in zip(self.rc_idx if recompute else self.reread_idx, reread):
                xs_call[i] = x
            tensors = {"in": xs_call, "saved": [saved], "ckpt": [saved], "gout": grads.outs, "gseq": grads.seqs,
                       "gfin": grads.fins, **out}
            if self.abi.draws:
                tensors.update(call.key_values())
            plan.launch(tensors, dev)
            LAUNCHES["bwd_rc" if recompute else "bwd"] += 1
            return result
        values = self._bwd_values(call, reread, saved, params, states, state_vals, grads, need, N, dev, args)
        values.update(out)
        key = bwd_key(values, dtype, N, need) if self.fast_keys and not traced else ()
        kernel = self.k_bwd_rc if recompute else self.k_bwd
        grid = (cdiv(N, values["block"][0]),)
        kernel.launch(grid, values, key, dev)
        if sig is not None:
            self.launch_plans.remember(sig, LaunchPlan(kernel, values, ("in", "saved", "ckpt", "gout", "gseq",
                                                                        "gfin", *out, *NOISE_ROLES), grid, key))
        LAUNCHES["bwd_rc" if recompute else "bwd"] += 1
        return result

    def _bwd_signature(self, call: Call, reread, saved, args, state_vals, grads: Grads, need, N, dev
                       ) -> tuple | None:
        """The launch plan's key of a backward like an earlier one (contiguous aligned tensors),
        else None. `args`: None where every param and state is a float (their bits are in the
        key), else the kernel arguments and MODEs of the params and of the states (tensors by
        dtype and alignment)."""
        g_all = (*grads.outs, *grads.seqs, *grads.fins)
        order, shape = call.order, call.shape
        if order is None:
            if not all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (*reread, *g_all) if t is not None):
                return None
        elif not all(fits(t, t.dim() - len(shape), shape, order, N) and t.data_ptr() % 16 == 0
                     for t in (*reread, *g_all) if t is not None):
            return None
        rc = call.recompute
        if args is None:
            pr: tuple = (bits(call.param_vals), bits(state_vals))
        else:
            (pargs, modes), (inits, initmodes) = args
            pr = ("t", *modes, *initmodes, *map(arg_key, pargs), *map(arg_key, inits))
        return ("bwd", call.T, N, call.dtype, dev, rc, order, self.block_rc if rc else self.block,
                (self.k_bwd_rc if rc else self.k_bwd).warps, *need, *pr,
                *(x.dtype for x in reread), *((None if g is None else g.dtype) for g in g_all),
                None if saved is None else saved.dtype)

    def _bwd_values(self, call: Call, reread, saved, params, states, state_vals, grads: Grads, need, N, dev,
                    args=None) -> dict[str, list]:
        """The backward kernel's arguments by role (the gradients it writes added by the caller;
        `args`: the params' and states' arguments where already made)."""
        T, shape, rc = call.T, tuple(call.shape), call.recompute
        n_in, n_st = len(self.inputs), len(self.states)
        xs: list[Any] = [None] * n_in
        strides = [0] * n_in
        order = call.order
        for i, x in zip(self.rc_idx if rc else self.reread_idx, reread):
            xs[i], strides[i] = flat_input(x, T, N, order)
        if args is None:
            args = (param_args(params, call.param_vals, shape, N, dev, self._float_modes, order),
                    state_args(states, state_vals, shape, N, dev, [0] * len(states), order))
        (pargs, modes), (inits, initmodes) = args
        host, hv = self.host(params, call.param_vals)
        hoisted = self.abi.hoisted_rc if rc else self.abi.hoisted_bwd
        gout = [flat_grad(g, (T,), N, shape, order) for g in grads.outs]
        gseq = [flat_grad(g, (T,), N, shape, order) for g in grads.seqs] if any(g is not None for g in grads.seqs) \
            else self._nones_st
        gfin = [flat_grad(g, (), N, shape, order) for g in grads.fins]
        return {
            "in": xs, "stride": strides, "saved": [saved], "ckpt": [saved], "param": pargs,
            "gout": gout, "gseq": gseq, "gfin": gfin,
            "hoisted": [hv.get(y, 0.0) for y in hoisted] if host else [0.0] * len(hoisted),
            "N": [N], "T": [T], "C": [self.chunks(T)], "init": inits, "initmode": initmodes, "mode": modes,
            "hasgout": [g is not None for g in gout], "hasgseq": [g is not None for g in gseq],
            "hasgfin": [g is not None for g in gfin], "needgx": need[:n_in], "needgs": need[n_in:n_in + n_st],
            "needgp": need[n_in + n_st:], "host": [host], "block": [self._block(N, rc)], **call.key_values(),
        }

    # ------------------------------------------------------------------ the Program interface
    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool, noise: NoiseKey | None = None) -> RunResult:
        x0 = inputs[0]
        self._check_call(inputs, states, params)
        if len(inputs) > 1:
            full = (x0.shape[0], *torch.broadcast_shapes(*(x.shape[1:] for x in inputs)))
            xs = [x if x.shape == full else x.expand(full) for x in inputs]
        else:
            xs = list(inputs)
        shape = xs[0].shape[1:]
        grad = torch.is_grad_enabled()
        save = grad and any(x.requires_grad for x in xs)
        st: list[Any] = []
        for v in states:
            if isinstance(v, torch.Tensor) and (v.shape != shape or v.device != x0.device):
                v = v.to(x0.device).expand(shape)
            st.append(v if isinstance(v, torch.Tensor) else None)
        pr = [v if isinstance(v, torch.Tensor) else None for v in params]
        save = save or (grad and any(t is not None and t.requires_grad for t in (*st, *pr)))
        st_vals = [0.0 if isinstance(v, torch.Tensor) else float(v) for v in states]
        pr_vals = [0.0 if isinstance(v, torch.Tensor) else float(v) for v in params]
        recompute = save and self.recompute(x0.dtype)
        is_t = [t is not None for t in [*st, *pr]]
        if torch.compiler.is_compiling():
            # (sizes Dynamo made symbolic keep the custom ops: the triton_op's body would specialize them)
            new = self.op_fwd_cuda is not None and x0.is_cuda and inductor.ENABLED[0] and \
                not any(isinstance(d, torch.SymInt) for d in x0.shape)
            op = self.op_fwd_cuda if new else self.op_fwd
            res = op(xs, [t for t in st if t is not None], [t for t in pr if t is not None], st_vals, pr_vals, is_t,
                     bool(store_seqs), save, recompute, *([key_tensor(noise)] if noise is not None else []))
        else:
            call = self.call(xs, st_vals, pr_vals, is_t, bool(store_seqs), recompute, noise)
            if not save:
                res = self._fwd(xs, st, pr, call, False)
            else:
                from .. import packed

                packed.TAKES_DONATIONS[0] = True  # (what it saves: its backward may write its input's gradient
                try:                              # into an input recomputed for it alone, `_donated`)
                    res = Eager.apply((self, xs, st, pr, call), *xs, *(t for t in st if t is not None),
                                      *(t for t in pr if t is not None))
                finally:
                    packed.TAKES_DONATIONS[0] = False
        n_out, n_st = len(self.outputs), len(self.states)
        return RunResult(list(res[:n_out]), list(res[n_out:n_out + n_st]),
                         list(res[n_out + n_st:n_out + 2 * n_st]) if store_seqs else None)

    def _check_call(self, inputs, states, params) -> None:
        """Where the kernels cannot run: a located error that says what to do."""
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


__all__ = ["TritonProgram", "LAUNCHES", "interpret"]
