"""The recurrent scan shared by the backends: one layer's time loop where the model's input port
receives `ix[t] + W s[t-1]` (`ix = W_in x + b`, computed before the loop in one product), `s`
being one of the model's outputs (the source, the spike by default).

    prog = program(ScanSpec(ir, port=0, source=0, dense=True), backend)   # a backend's name
    outs, fins = scan(prog, ix, w, s0, inputs, states, params)      # autograd: BPTT

A backend's recurrent program runs the loop (forward, and the backward through the
recurrence with the neuron's derived VJP, giving `gI`, the gradient of the port's current at
every step); what follows from `gI` is the same for every backend and is done here, outside the
loop: `dW = gI^T S_prev` is one matrix product over all steps (`[H, T*B] @ [T*B, H]`; no
per-step outer product is ever formed), `d ix = gI`, `d s0 = gI[0] W`.

Programs are made from the compiled model's IR by the backend's `load_scan(spec, key)` (a
backend whose capabilities say `scans`; the built-in ones delegate to `backends/<name>/recurrent.py`),
cached on disk like every artefact and loaded once per process.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import FlexDSLError
from . import REFERENCE, capabilities, get, layercall, packed, replay
from . import choose as choose_backend
from .base import IR, Need, NoiseKey, RecurrentProgram, ScanSpec, key_ints, key_tensor
from .exact import exact_bf16, exact_in_bf16, fused_products, small_ints
from .recurrent_ops import keeps, register_ops
from .stash import stash, unstash

_PROGRAMS: dict[tuple, RecurrentProgram] = {}
_LOCK = threading.Lock()


def scan_key(ir: IR, b: Any) -> str:
    """The cache key of backend `b`'s layer scan of a model."""
    return ir.cache_key(f"{b.name}-recurrent", b.version())


def program(spec: ScanSpec, backend: str) -> RecurrentProgram:
    """The layer scan of `spec` on the backend named `backend` (once per process): its
    `load_scan` (the reference backend's where that gives None: it cannot here, e.g. its kernels
    could not be built), with the layer's custom ops registered."""
    b = get(backend)
    if not capabilities(b).scans:
        raise FlexDSLError(f"backend `{b.name}` does not run layer scans", "<flexdsl.recurrent>")
    ir = spec.ir
    key = scan_key(ir, b)
    k = (b.name, key, spec.port, spec.source, spec.dense)
    p = _PROGRAMS.get(k)
    if p is None:
        with _LOCK:
            p = _PROGRAMS.get(k)
            if p is None:
                p = b.load_scan(spec, key)  # type: ignore[attr-defined]
                if p is None:
                    ref = get(REFERENCE)
                    p = ref.load_scan(spec, scan_key(ir, ref))  # type: ignore[attr-defined]
                ck = ir.checked
                name = "".join(ch for ch in f"{b.name}_{key[:16]}_{spec.port}_{spec.source}_{int(spec.dense)}"
                               if ch.isalnum() or ch == "_")
                p.ops = register_ops(p, name, len(ck.inputs), len(ck.states), len(ck.outputs), spec.dense)
                _PROGRAMS[k] = p
    return p


def choose(backend: str, like: torch.Tensor, need: Need | None = None) -> str:
    """The scan a layer's call runs on: `backend`, or for "auto" the first preferred backend
    whose capabilities say layer scans on tensors like `like` (`need`: and the rest of the
    call's needs), that is available and accepts them (the Triton kernels for CUDA tensors of a
    kernel dtype, the CPU kernels for float32 and float64 CPU tensors), else the reference scan."""
    if backend != "auto":
        return backend
    b = choose_backend("auto", [like], need if need is not None else Need.of(like, scans=True))
    return b.name if capabilities(b).scans else REFERENCE


class _Scan(torch.autograd.Function):
    """The layer eagerly: the input product (when fused: an input exact in bfloat16 and W_in in
    three bfloat16 parts, exact products) and the recurrent scan, with BPTT."""

    @staticmethod
    def forward(ctx, call, x, w, s0, w_in, b, *tensors):  # type: ignore[override]
        prog, inputs, states, params, dense, xb, noise, s0_exact = call
        save = any(ctx.needs_input_grad[1:])
        outs, fins, sv = layercall.forward(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, save, noise, s0_exact)
        ctx.call, ctx.sv = call, None
        if sv is not None:
            # every tensor the backward needs goes through save_for_backward: autograd frees them after
            # the backward (kept with retain_graph=True: a second backward gets them again), and an
            # in-place change before the backward is an error, not wrong gradients; the spikes (the
            # source after s0, and an input known to be 0/1) are kept as bits
            S = packed.kept(sv.S, 1) if prog.binary and packed.ENABLED else sv.S
            xs = [packed.kept(t) if t is not None and packed.ENABLED and packed.known_binary(x) else t
                  for t in (sv.x, sv.xb)]
            held, ts = stash((sv.w, S, sv.w_in, xs[0], xs[1], sv.saved))
            ctx.save_for_backward(*ts)
            ctx.sv = dataclasses.replace(sv, w=None, S=None, w_in=None, x=None, xb=None, saved=held)
        ctx.set_materialize_grads(False)
        if save:  # (views of the scan's buffers as differentiable outputs could not be changed in place)
            outs = [o.clone() if o._base is not None else o for o in outs]
            fins = [f.clone() if f._base is not None else f for f in fins]
        return (*outs, *fins)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph=True: the derived backward is first order
            layercall.first_order()
        prog, inputs, states, params, dense, _, _, _ = ctx.call
        if ctx.sv is None:
            return (None,) * len(ctx.needs_input_grad)
        w, S, w_in, x, xb, saved = unstash(ctx.sv.saved, ctx.saved_tensors)  # (S, x, xb may be `packed.kept`)
        sv = dataclasses.replace(ctx.sv, w=w, S=S, w_in=w_in, x=x, xb=xb, saved=saved)
        return (None, *layercall.backward(prog, sv, inputs, states, params, dense, grads, ctx.needs_input_grad[1:]))


class _Guess:
    """Whether x and s0 are exact in bfloat16, found on the device without waiting for it: the
    conversions and their verdicts are launched, the verdicts copied to pinned host memory behind an
    event, and the layer launched as if both were exact; `confirmed()` then waits for that event
    only (long passed by then) and the caller runs the layer again, checking first, where they
    were not. A program that met an inexact input once checks first from then on (a layer fed
    analog values pays its check, not two runs). A feedback known to be zeros (`s0_zero`: the
    layer made it) is not checked."""

    def __init__(self, xb: torch.Tensor | None, s0_exact: bool | None, host: torch.Tensor, event) -> None:
        self.xb, self.s0_exact, self.host, self.event = xb, s0_exact, host, event

    @staticmethod
    def wanted(prog: RecurrentProgram, x: torch.Tensor, w_in, b, s0: torch.Tensor, dense: bool,
               s0_zero: bool) -> tuple[bool, bool] | None:
        """(check x, check s0) where the guess applies (the Triton products, something to check,
        the program not checking first), else None."""
        want_x = w_in is not None and layercall.fusable(x, w_in, b)
        want_s0 = not s0_zero and bool(prog.binary and dense and layercall.fast_products(s0))
        if fused_products(x, prog) is None or not (want_x or want_s0) or getattr(prog, "check_first", False):
            return None
        return want_x, want_s0

    @staticmethod
    def convert(prog: RecurrentProgram, x: torch.Tensor, s0: torch.Tensor, want: tuple[bool, bool]
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the verdicts [2] int32 on the device, x in bfloat16 or None): launched, not waited for."""
        kern = fused_products(x, prog)
        flags = torch.zeros(2, dtype=torch.int32, device=x.device)
        xb = kern.to_bf16(x, flags[0:1]) if want[0] else None
        if want[1]:
            kern.to_bf16(s0, flags[1:2], small_ints(prog, s0))
        return flags, xb

    @staticmethod
    def launch(prog: RecurrentProgram, x: torch.Tensor, w_in, b, s0: torch.Tensor, dense: bool,
               s0_zero: bool = False) -> _Guess | None:
        want = _Guess.wanted(prog, x, w_in, b, s0, dense, s0_zero)
        if want is None:
            return None
        flags, xb = _Guess.convert(prog, x, s0, want)
        host, event = flags, None
        if flags.is_cuda:
            host = torch.empty(2, dtype=torch.int32, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(x.device))
        return _Guess(xb, True if (want[1] or s0_zero) else None, host, event)

    def confirmed(self) -> bool:
        if self.event is not None:
            self.event.synchronize()
        return not any(self.host.tolist())


def scan(prog: RecurrentProgram, x: torch.Tensor, w_in: torch.Tensor | None, b: torch.Tensor | None,
         w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any], states: Sequence[Any], params: Sequence[Any],
         dense: bool, noise: Any = None, s0_zero: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The layer's T steps with autograd: (outputs [T, B, H] each, final states [B, H] each).
    `x` is the layer's input `[T, B, F]`, multiplied by `w_in` (`[H, F]`, or None: `x` is the
    port's current) plus `b` before the loop; `inputs` has None at the port (the other inputs are
    [T, B, H] tensors); states and params are tensors or floats; `noise` keys a noisy model's draws
    (`base.NoiseKey`, a tensor under torch.compile; its elements are those of the [B, H] step);
    `s0_zero`: s0 holds zeros (the caller made it so; it is not checked). Under torch.compile the
    layer is one custom op (`register_ops`), its input product included unless autocast makes it.
    Small calls without gradients replay CUDA graphs (`replay.py`), with the same results."""
    if torch.compiler.is_compiling():
        if w_in is not None and torch.is_autocast_enabled(x.device.type):  # (autocast: the graph's product)
            x, w_in, b = torch.nn.functional.linear(x, w_in, b), None, None
        tensors, vals, kinds = pack_args(inputs, states, params)
        if noise is not None:  # (the key of the draws: one more tensor, kind 3)
            tensors.append(key_tensor(noise))
            kinds.append(3)
        # (keep: the forward op returns what the backward reads, where the program says what that is)
        keep = keeps(prog) and replay.tracks_grad((x, w, s0, w_in, b, *tensors))
        res = prog.ops[0](x, w, s0, w_in, b, tensors, vals, kinds, keep)
        n_kept = 1 + len(prog.saved_shapes(x.shape[0], (x.shape[1], w.shape[0]))) if keep else 0
        n_out = len(res) - n_kept - len(states)
        return list(res[:n_out]), list(res[n_out:n_out + len(states)])
    if isinstance(noise, torch.Tensor):
        noise = NoiseKey(*key_ints(noise))

    def run(xx: torch.Tensor, ss: torch.Tensor, ins: Sequence[Any], sts: Sequence[Any], xb: torch.Tensor | None,
            s0_exact: bool | None, checked: bool) -> tuple:
        wi, bb = w_in, b
        if wi is not None:
            if xb is None and not checked and layercall.fusable(xx, wi, bb):
                xb = exact_bf16(xx, prog)
            if xb is None:
                xx, wi, bb = layercall.linear(xx, wi, bb, prog), None, None
        elif bb is not None:
            xx, bb = xx + bb, None
        tensors = [v for v in (*ins, *sts, *params) if isinstance(v, torch.Tensor)]
        if not replay.tracks_grad((xx, w, ss, wi, bb, *tensors)):
            # nothing to differentiate (no_grad, inference mode: the Function's needs_input_grad would
            # still say the weights need it): the forward alone, keeping nothing for a backward
            outs, fins, _ = layercall.forward(prog, xx, w, ss, wi, bb, xb, list(ins), list(sts), list(params), dense, False,
                                     noise, s0_exact)
            return (*outs, *fins)
        return _Scan.apply((prog, list(ins), list(sts), list(params), dense, xb, noise, s0_exact), xx, w, ss,
                           wi, bb, *tensors)

    s0_known = True if s0_zero else None  # (what is known of s0's exactness before any check)

    def split(res: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        n_out = len(res) - len(states)
        return list(res[:n_out]), list(res[n_out:])

    own = (v for v in (x, w_in, b, w, s0, *inputs, *states, *params) if isinstance(v, torch.Tensor))  # (lazy)
    if replay.eligible(prog, x, own, noise, w.shape[0]):
        want = _Guess.wanted(prog, x, w_in, b, s0, dense, s0_zero)

        def convert(xx: torch.Tensor, ss: torch.Tensor) -> tuple:
            if want is None:
                return None, (None, s0_known)
            flags, xb = _Guess.convert(prog, xx, ss, want)
            return flags, (xb, True if want[1] else s0_known)

        def compute(xx, ss, ins, sts, conv) -> tuple:
            return run(xx, ss, ins, sts, conv[0], conv[1], want is not None)

        key = replay.graph_key(x, w_in, b, w, s0, s0_zero, inputs, states, params, dense)
        res = replay.replay(prog, key, x, s0, s0_zero, inputs, states, want is not None, convert, compute)
        if res is not None:
            return split(res)
    guess = _Guess.launch(prog, x, w_in, b, s0, dense, s0_zero)
    if guess is None:
        return split(run(x, s0, inputs, states, None, s0_known, False))
    res = run(x, s0, inputs, states, guess.xb, guess.s0_exact, True)
    if not guess.confirmed():  # (x or s0 not exact after all: again, checking first from now on)
        prog.check_first = True  # type: ignore[attr-defined]
        res = run(x, s0, inputs, states, None, s0_known, False)
    return split(res)


# ------------------------------------------------------------------ the layer as one graph node
def pack_args(inputs, states, params) -> tuple[list[torch.Tensor], list[float], list[int]]:
    """The inputs, states and params as a custom op takes them: the tensors, the floats, and per
    entry its kind (0: a float, 1: a tensor, 2: None, the port)."""
    tensors, vals, kinds = [], [], []
    for v in (*inputs, *states, *params):
        if v is None:
            kinds.append(2)
        elif isinstance(v, torch.Tensor):
            tensors.append(v)
            kinds.append(1)
        else:
            vals.append(float(v))
            kinds.append(0)
    return tensors, vals, kinds


__all__ = ["RecurrentProgram", "program", "scan_key", "choose", "scan", "pack_args", "exact_in_bf16"]
