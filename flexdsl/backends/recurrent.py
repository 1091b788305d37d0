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
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..errors import FlexDSLError
from ..settings import env_choice
from . import REFERENCE, capabilities, get, replay
from . import choose as choose_backend
from .base import IR, Need, NoiseKey, ScanSpec, key_ints, key_tensor
from .exact import exact_bf16, exact_in_bf16, fused_products, small_ints
from .recurrent_ops import keeps, register_ops
from .stash import stash, unstash

_exact_bf16 = exact_bf16  # (the name `recurrent_ops` reads)


class RecurrentProgram(Protocol):
    binary: bool  # the source is a spike (0/1)
    ops: tuple  # its custom ops (`register_ops`), set when loaded: the layer under torch.compile

    def forward(self, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
                states: Sequence[Any], params: Sequence[Any], save: bool, noise: NoiseKey | None = None,
                s0_exact: bool | None = None) -> tuple[list, list, torch.Tensor, Any]:
        """(outputs [T, B, H] each, final states [B, H], S [T + 1, B, H]: s0 then the source
        of every step (the source output is S[1:]), what the backward needs (or None)); `noise`:
        the key of a noisy model's draws (the backward replays them); `s0_exact`: whether s0 is
        exact in bfloat16, where the caller knows (None: the program checks if it needs to)."""
        ...

    # optional (the layer's custom op then keeps the forward's values for its backward, else it
    # runs the forward again): `saved_shapes(T, shape)`, the shapes of the tensors `saved_tensors(saved)`
    # lists, in the dtype of `ix`; `restore(tensors, inputs, params, like, noise)`, `saved` again (`like`:
    # a [B, H] tensor of the call's dtype and device)

    def backward(self, saved: Any, w: torch.Tensor, g_outs: Sequence[torch.Tensor | None],
                 g_fins: Sequence[torch.Tensor | None], need: dict[str, Any]) -> tuple:
        """(gI [T, B, H], grads of the other inputs, of the initial states, of the params, extras:
        "parts" (gI as three bfloat16 parts [3, T, B, H]) and "sb" (S in bfloat16) where the
        program has them and `need["parts"]` asks)."""
        ...


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
                p.ops = register_ops(p, name, len(ck.inputs), len(ck.states), len(ck.outputs), spec.dense,
                                     sys.modules[__name__])
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


def split3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bfloat16 (hi, mid, lo) with hi + mid + lo == t (float32) up to 2^-24 |t|."""
    hi = t.to(torch.bfloat16)
    r = t - hi.float()
    mid = r.to(torch.bfloat16)
    return hi, mid, (r - mid.float()).to(torch.bfloat16)


_MM32: list[bool] = []  # whether torch.mm(bf16, bf16, out_dtype=float32) runs here (CUDA, torch >= 2.8)


def _bf16_products(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], init: torch.Tensor | None = None
                   ) -> torch.Tensor | None:
    """init + the sum of a @ b over bfloat16 pairs, accumulated and returned in float32 (each
    product of bfloat16 values is exact); None where torch cannot (the caller then multiplies in
    float32)."""
    if _MM32 == [False]:
        return None
    try:
        out = None
        if init is not None:
            out = init.expand(pairs[0][0].shape[0], pairs[0][1].shape[1]).contiguous()
        for a, b in pairs:
            if out is None:
                out = torch.mm(a, b, out_dtype=torch.float32)
            else:
                try:
                    out = torch.addmm(out, a, b, out_dtype=torch.float32)
                except (RuntimeError, TypeError):
                    out += torch.mm(a, b, out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        _MM32[:] = [False]
        return None
    _MM32[:] = [True]
    return out


def fast_products(t: torch.Tensor) -> bool:
    """Whether float32 products of spikes run as exact bfloat16 products here (CUDA, and not
    turned off by FLEXDSL_RECURRENT_PRODUCTS=fp32)."""
    off = env_choice("FLEXDSL_RECURRENT_PRODUCTS") == "fp32"  # (checked on every device)
    return t.is_cuda and t.dtype == torch.float32 and _MM32 != [False] and not off


def weight_grad(g: torch.Tensor, s: torch.Tensor, exact: bool, parts: torch.Tensor | None = None) -> torch.Tensor:
    """`g^T s` ([H, M] @ [M, K]: a weight's gradient over all steps at once). Where `s` is exact in
    bfloat16 (spikes; `exact`, then `s` may be given in bfloat16) and on CUDA in float32: three
    bfloat16 products of the gradient's parts (`parts` [3, M, H] if the kernel wrote them, summing
    to it up to 2^-24) with float32 accumulation, each product exact."""
    if exact and fast_products(g):
        sb = s if s.dtype == torch.bfloat16 else s.to(torch.bfloat16)
        ps = list(parts) if parts is not None else split3(g)
        out = _bf16_products([(p.t(), sb) for p in reversed(ps)])
        if out is not None:
            return out
    return g.t().mm(s.to(g.dtype))


def _input_product(xb: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor | None, prog: Any) -> torch.Tensor | None:
    """xb W_in^T + b in float32 from exact bfloat16 products (xb [M, F] exact in bfloat16, W_in in
    its three parts): one fused Triton kernel on CUDA, else three torch products (None where torch
    has none either)."""
    kern = fused_products(xb, prog)
    if kern is not None:
        return kern.split3_mm(xb, w_in, b.contiguous() if b is not None else None)
    return _bf16_products([(xb, p.t()) for p in reversed(split3(w_in))], init=b)


@dataclass
class _Saved:
    """What the backward of a call needs besides the call's own inputs."""

    T: int
    saved: Any  # the program's
    S: torch.Tensor  # s0, then the source of every step
    w: torch.Tensor
    w_in: torch.Tensor | None
    x: torch.Tensor | None  # the layer's input where the input product was made here in float
    xb: torch.Tensor | None  # x in bfloat16 when the input product was fused (exact products)
    s_exact: bool  # S exact in bfloat16 (spikes): the weight gradient takes exact bfloat16 products
    linear: bool  # the input product (or the bias) was made here, not by the caller


_MM_BF16_MIN = 1 << 24  # (inputs of fewer values: the launches cost more than cuBLAS's slower kernel)


def _linear(x: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor | None, prog: Any) -> torch.Tensor:
    """`W_in x + b` as torch computes it. Under autocast to bfloat16 on CUDA with no gradient to
    track (inference) and a large input, the same product in one Triton kernel on rows padded to 64
    elements (`products.mm_bf16`: cuBLAS takes slower kernels for a 700-wide bfloat16 row); the
    input's conversion is the one autocast makes."""
    kern = fused_products(x, prog) if x.numel() >= _MM_BF16_MIN else None
    if (kern is not None and torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16
            and env_choice("FLEXDSL_RECURRENT_PRODUCTS") != "fp32" and x.dtype in (torch.float32, torch.bfloat16)
            and not replay.tracks_grad((x, w_in, b))):
        y = kern.mm_bf16(x.reshape(-1, x.shape[-1]), w_in, b)
        return y.reshape(*x.shape[:-1], w_in.shape[0])
    return torch.nn.functional.linear(x, w_in, b)


def _fusable(x: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether x W_in^T may run as exact bfloat16 products (CUDA, float32, no autocast)."""
    return (fast_products(x) and w_in.dtype == torch.float32 and (b is None or b.dtype == torch.float32)
            and not torch.is_autocast_enabled("cuda"))


def _forward(prog: RecurrentProgram, x, w, s0, w_in, b, xb, inputs, states, params, dense: bool, save: bool,
             noise: NoiseKey | None = None, s0_exact: bool | None = None) -> tuple[list, list, _Saved | None]:
    """The layer's forward: the port's current `ix` (x itself; or x W_in^T + b, from bfloat16
    parts when `xb` is given), then the program's scan. (outputs, final states, what the
    backward needs when `save`)."""
    # whether s0 is exact in bfloat16 (the spikes of an earlier call, zeros; not a value given by hand):
    # decided here once, for the scan's products and the weight gradient's (one synchronisation,
    # before anything is launched: the scan's preparation then overlaps the input product)
    if s0_exact is None and prog.binary and dense and fast_products(s0):
        s0_exact = exact_in_bf16(s0, prog)
    linear = xb is None and (w_in is not None or b is not None)
    if xb is not None:  # the input product, fused: x W_in^T + b from bfloat16 parts
        ix = _input_product(xb.reshape(-1, xb.shape[-1]), w_in, b, prog)
        if ix is None:  # (torch has no bfloat16 products into float32 here: the same values in float32)
            ix = torch.nn.functional.linear(xb.reshape(-1, xb.shape[-1]).float(), w_in, b)
        ix = ix.reshape(*xb.shape[:-1], w_in.shape[0])
    elif w_in is not None:
        ix = torch.nn.functional.linear(x, w_in, b)
    else:
        ix = x if b is None else x + b
    outs, fins, S, saved = prog.forward(ix, w, s0, inputs, states, params, save, s0_exact=s0_exact,
                                        **({"noise": noise} if noise is not None else {}))
    if not save:
        return outs, fins, None
    return outs, fins, _saved(prog, x, w, w_in, xb, linear, S, saved, dense, s0_exact)


def _saved(prog: RecurrentProgram, x, w, w_in, xb, linear: bool, S: torch.Tensor, saved: Any, dense: bool,
           s0_exact: bool | None) -> _Saved:
    # S (s0, then the spikes) exact in bfloat16: the spikes are, s0 unless given other values
    # (s0_exact was decided wherever this can hold: w and s0 share device and dtype)
    s_exact = bool(prog.binary and dense and fast_products(w) and s0_exact)
    return _Saved(S.shape[0] - 1, saved, S, w, w_in, x if linear and w_in is not None else None, xb, s_exact, linear)


def restore(prog: RecurrentProgram, x, w, s0, w_in, b, kept: Sequence[torch.Tensor], inputs, states, params,
            dense: bool, noise: NoiseKey | None) -> _Saved:
    """What `_forward(..., save=True)` gave, from what it kept (`kept`: S, then the program's
    `saved_tensors`) and the call's own arguments: the backward of the layer's custom op, whose
    forward returned them (`recurrent_ops`). The values `_forward` derived from the arguments
    (x in bfloat16, whether s0 is exact in it) are derived again, the same way."""
    xb = exact_bf16(x, prog) if w_in is not None and _fusable(x, w_in, b) else None
    s0_exact = exact_in_bf16(s0, prog) if prog.binary and dense and fast_products(s0) else None
    S = kept[0]
    saved = prog.restore(list(kept[1:]), inputs, params, S[0], noise)
    linear = xb is None and (w_in is not None or b is not None)
    return _saved(prog, x, w, w_in, xb, linear, S, saved, dense, s0_exact)


def _backward(prog: RecurrentProgram, sv: _Saved, inputs, states, params, dense: bool, grads, need) -> list:
    """The gradients of (x, w, s0, w_in, b, *the tensors of inputs, states and params) where
    `need` says (None elsewhere): BPTT by the program, then the products that follow from `gI`."""
    n_x, n_w, n_s0, n_win, n_b, *need_t = need
    w, S, w_in = sv.w, sv.S, sv.w_in
    n_st = len(states)
    g_outs, g_fins = grads[:len(grads) - n_st], grads[len(grads) - n_st:]
    for g in grads:  # (a loop, not a generator: no Python call per gradient)
        if g is not None:
            break
    else:
        return [None] * (5 + len(need_t))
    kinds = _tensor_kinds(inputs, states, params)
    req: dict[str, Any] = {"T": sv.T, "inputs": [False] * len(inputs), "states": [False] * len(states),
                           "params": [False] * len(params),
                           "parts": fast_products(w) and dense and prog.binary and (n_w or n_win)}
    for (kind, k), n in zip(kinds, need_t):
        req[kind + "s"][k] = bool(n)
    gI, g_in, g_st, g_pr, extra = prog.backward(sv.saved, w, g_outs, g_fins, req)
    parts, sb = extra.get("parts"), extra.get("sb")
    H = w.shape[0]
    gflat = gI.reshape(-1, H)
    pflat = parts.reshape(3, -1, H) if parts is not None else None
    gw = gs0 = gx = gwin = gb = None
    if n_w:
        if dense:
            prev = (sb if sb is not None else S)[:-1].reshape(-1, H)
            gw = weight_grad(gflat, prev, sv.s_exact, pflat)
        else:
            gw = (gflat * S[:-1].reshape(-1, H)).sum(0)
    if n_s0:
        gs0 = gI[0].mm(w) if dense else gI[0] * w
    xk = sv.xb if sv.xb is not None else sv.x  # (the input the product was made of, if made here)
    if xk is not None and w_in is not None:
        x2 = xk.reshape(-1, xk.shape[-1])
        if n_win:
            gwin = weight_grad(gflat, x2, sv.xb is not None, pflat)
        if n_x:
            gx = gI.matmul(w_in)
    elif n_x:
        gx = gI
    if n_b and (sv.xb is not None or sv.linear):
        gb = gflat.sum(0)
    by = {"input": g_in, "state": g_st, "param": g_pr}
    rest = [by[kind][k] if n else None for (kind, k), n in zip(kinds, need_t)]
    return [gx, gw, gs0, gwin, gb, *rest]


def _tensor_kinds(inputs, states, params) -> list[tuple[str, int]]:
    """(kind, index) of each tensor among the inputs, states and params, in that order."""
    return [("input", k) for k, v in enumerate(inputs) if isinstance(v, torch.Tensor)] + \
        [("state", k) for k, v in enumerate(states) if isinstance(v, torch.Tensor)] + \
        [("param", k) for k, v in enumerate(params) if isinstance(v, torch.Tensor)]


class _Scan(torch.autograd.Function):
    """The layer eagerly: the input product (when fused: an input exact in bfloat16 and W_in in
    three bfloat16 parts, exact products) and the recurrent scan, with BPTT."""

    @staticmethod
    def forward(ctx, call, x, w, s0, w_in, b, *tensors):  # type: ignore[override]
        prog, inputs, states, params, dense, xb, noise, s0_exact = call
        save = any(ctx.needs_input_grad[1:])
        outs, fins, sv = _forward(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, save, noise, s0_exact)
        ctx.call, ctx.sv = call, None
        if sv is not None:
            # every tensor the backward needs goes through save_for_backward: autograd frees them after
            # the backward (kept with retain_graph=True: a second backward gets them again), and an
            # in-place change before the backward is an error, not wrong gradients
            held, ts = stash((sv.w, sv.S, sv.w_in, sv.x, sv.xb, sv.saved))
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
            _first_order()
        prog, inputs, states, params, dense, _, _, _ = ctx.call
        if ctx.sv is None:
            return (None,) * len(ctx.needs_input_grad)
        w, S, w_in, x, xb, saved = unstash(ctx.sv.saved, ctx.saved_tensors)
        sv = dataclasses.replace(ctx.sv, w=w, S=S, w_in=w_in, x=x, xb=xb, saved=saved)
        return (None, *_backward(prog, sv, inputs, states, params, dense, grads, ctx.needs_input_grad[1:]))


def _first_order() -> None:
    raise FlexDSLError("second derivatives through a recurrent layer are not available: its backward is the "
                       "model's derived first-order backward", "<flexdsl.recurrent>",
                       hint="differentiate once (without create_graph=True)")


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
        want_x = w_in is not None and _fusable(x, w_in, b)
        want_s0 = not s0_zero and bool(prog.binary and dense and fast_products(s0))
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
            if xb is None and not checked and _fusable(xx, wi, bb):
                xb = exact_bf16(xx, prog)
            if xb is None:
                xx, wi, bb = _linear(xx, wi, bb, prog), None, None
        elif bb is not None:
            xx, bb = xx + bb, None
        tensors = [v for v in (*ins, *sts, *params) if isinstance(v, torch.Tensor)]
        if not replay.tracks_grad((xx, w, ss, wi, bb, *tensors)):
            # nothing to differentiate (no_grad, inference mode: the Function's needs_input_grad would
            # still say the weights need it): the forward alone, keeping nothing for a backward
            outs, fins, _ = _forward(prog, xx, w, ss, wi, bb, xb, list(ins), list(sts), list(params), dense, False,
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


__all__ = ["RecurrentProgram", "program", "scan_key", "choose", "scan", "pack_args", "weight_grad", "split3",
           "exact_in_bf16", "restore",
           "fast_products"]
