"""Values known to be 0/1 (spikes) and their packing as bits, shared by the layers' products
(`runtime/bits.py`) and the recurrent scan's saved spikes (`backends/recurrent.py`): `pack` keeps 8
values a byte, `unpack` gives them back exactly; `mark_binary`/`known_binary`/`is_binary` record
which tensors hold only 0 and 1 (a neuron's spike output, a tensor checked once), forgotten when
the tensor is written. `ENABLED = False` (also `flexdsl.runtime.bits.ENABLED`) saves everything as
it is.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

ENABLED = True  # (False: every product saves its input as it is; for measuring what the bits save)
_LOCAL = threading.local()  # .sessions: this thread's keep sessions (runtime/recompute.py), innermost last


def sessions() -> list[Any]:
    """The keep sessions of the rewritten networks whose forward runs in this thread, innermost last
    (each thread its own: two networks run by two threads never see each other's)."""
    try:
        return _LOCAL.sessions
    except AttributeError:
        _LOCAL.sessions = []
        return _LOCAL.sessions


def session() -> Any:
    """This thread's innermost keep session, or None."""
    s = sessions()
    return s[-1] if s else None


def record_product_kept(out: torch.Tensor, x: torch.Tensor, redo: Any, reads: Sequence[Any]) -> None:
    """Tell the innermost keep session (if any) that `out` = `redo(x)`, a product of an input `x` that
    autograd keeps for the weight's gradient (so holding it costs nothing)."""
    s = session()
    if s is not None and torch.is_grad_enabled() and any(isinstance(w, torch.Tensor) and w.requires_grad
                                                         for w in reads[:1]):
        s.product_kept(out, x, _as_then(redo, x.device.type), reads)


def record_product(out: torch.Tensor, x: torch.Tensor, bits: Any, redo: Any, reads: Sequence[Any]) -> None:
    """Tell the innermost keep session (if any) that `out` = `redo(x)` for the 0/1 `x` kept as `bits`
    (its recomputation reads `reads`, checked unchanged when it runs). Only a contiguous `x`: the bits
    give it back contiguous, and the product of the same layout is the forward's, bit for bit."""
    s = session()
    if s is not None and bits is not None and x.is_contiguous():
        s.product(out, bits, _as_then(redo, x.device.type), x.shape, x.dtype, reads)


def _as_then(redo: Any, device: str) -> Any:
    """`redo` run again under the autocast the forward ran it under (a product's output is then the
    same, in the same dtype)."""
    if not torch.is_autocast_enabled(device):
        return redo
    dtype = torch.get_autocast_dtype(device)

    def again(v: Any) -> Any:
        with torch.autocast(device, dtype=dtype):
            return redo(v)
    return again


# tensors known to hold only 0/1 (or known not to): id -> (a weak reference, the version when seen, whether
# all 0/1): spikes of neurons, checked tensors. (A plain dict by id with weak references that remove their
# entry: a lookup costs a dictionary get, not the weak key object `WeakIdKeyDictionary` makes per lookup.)
_KNOWN: dict[int, tuple[Any, int, bool]] = {}


def _forget(ref: Any, key: int) -> None:
    e = _KNOWN.get(key)
    if e is not None and e[0] is ref:
        del _KNOWN[key]


def _entry(t: torch.Tensor) -> tuple[int, bool] | None:
    """(version when seen, whether all 0/1) of `t` or, for a view, of its base; None if unknown."""
    e = _KNOWN.get(id(t))
    if e is not None and e[0]() is t:
        return e[1], e[2]
    base = t._base
    if base is not None:
        e = _KNOWN.get(id(base))
        if e is not None and e[0]() is base:
            return e[1], e[2]
    return None


def _remember(t: torch.Tensor, binary: bool) -> None:
    import weakref

    key = id(t)
    _KNOWN[key] = (weakref.ref(t, lambda r, key=key: _forget(r, key)), t._version, binary)


def mark_binary(t: torch.Tensor, binary: bool = True) -> None:
    """`t` holds only 0 and 1 (a neuron's spike output; with `binary=False`: it does not): a product
    of it, unchanged since, skips the check."""
    if not torch.compiler.is_compiling():
        _remember(t, binary)
        base = t._base
        if binary and base is not None and base.numel() == t.numel():  # (a view of all of its base: the base too)
            _remember(base, True)


def known_binary(t: Any) -> bool:
    """Whether `t` is known to hold only 0 and 1 (marked, and not written since; or a view of such a
    tensor: a view shares its base's version); under a trace (torch.compile) never: the registry is
    not traced, and a compiled graph saves what it needs."""
    if not _KNOWN or not isinstance(t, torch.Tensor) or torch.compiler.is_compiling():
        return False
    k = _entry(t)
    return k is not None and k == (t._version, True)


def is_binary(x: torch.Tensor) -> bool:
    """Whether every value of `x` is 0 or 1: known for a neuron's spike output or a tensor checked
    before and not written since (`mark_binary`), else one pass over it (a host sync on a GPU),
    whose answer is kept with the tensor."""
    k = _entry(x) if _KNOWN else None
    if k is not None and k[0] == x._version:
        return k[1]
    ok = bool(((x == 0) | (x == 1)).all())
    mark_binary(x, ok)
    return ok


DONATION: list[Any] = [None]  # (the donated tensor, its version): one at a time
TAKES_DONATIONS = [False]  # (True while the Triton kernels' eager op saves its tensors: `triton/launch.py`)


def donate(t: torch.Tensor) -> None:
    """`t` was made for one reader (a saved tensor recomputed for a backward) and is dead after it:
    that backward may write its input's gradient into `t` (`take_donation`). One donation is held
    at a time (a reference: a tensor's Python object does not survive autograd's hands otherwise),
    replaced by the next and dropped when the backward pass ends."""
    if DONATION[0] is None:
        try:
            torch.autograd.Variable._execution_engine.queue_callback(_drop_donation)
        except RuntimeError:  # (not inside a backward pass: nothing would take it)
            return
    DONATION[0] = (t, t._version)


def _drop_donation() -> None:
    DONATION[0] = None


def take_donation(t: torch.Tensor) -> bool:
    """Whether `t` is the donated tensor (its memory, not written since); the donation is used up."""
    d = DONATION[0]
    if d is None:
        return False
    v = d[0]
    # (autograd hands the backward another tensor object over the same memory; held here, that memory
    # cannot belong to anything else)
    if v.data_ptr() != t.data_ptr() or v.shape != t.shape or v.stride() != t.stride() or v.dtype != t.dtype:
        return False
    DONATION[0] = None
    return d[1] == v._version


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def pack(x: torch.Tensor) -> torch.Tensor:
    """The 0/1 values of `x` as bits: `uint8 [ceil(numel / 8)]`, value k in bit k % 8 of byte k // 8."""
    flat = x.reshape(-1)
    if flat.is_cuda and flat.is_floating_point():  # (one kernel)
        from .triton.packbits import pack as kernel

        return _made(kernel(flat.contiguous()))
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    sh = _SHIFTS.get(flat.device)
    if sh is None:
        sh = _SHIFTS[flat.device] = torch.arange(8, dtype=torch.uint8, device=flat.device)
    return _made(((flat.view(-1, 8) != 0).to(torch.uint8) << sh).sum(-1, dtype=torch.uint8))  # (one bit a value)


_PACKED: dict[int, Any] = {}  # id -> weak reference of the bits `pack` made (what a memory report counts as bits)


def _made(bits: torch.Tensor) -> torch.Tensor:
    k = id(bits)
    _PACKED[k] = weakref.ref(bits, lambda _r, k=k: _PACKED.pop(k, None))
    return bits


def is_packed(t: torch.Tensor) -> bool:
    """Whether `t` is bits `pack` made (a product's input saved as bits)."""
    r = _PACKED.get(id(t))
    return r is not None and r() is t


def unpack(packed: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """`pack`'s inverse: the values, exactly, as `dtype` in `shape`."""
    n = math.prod(shape)
    if packed.is_cuda and dtype.is_floating_point:  # (one kernel)
        from .triton.packbits import unpack as kernel

        return kernel(packed, n, dtype).reshape(shape)
    sh = _SHIFTS.get(packed.device)
    if sh is None:
        sh = _SHIFTS[packed.device] = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> sh) & 1
    return bits.reshape(-1)[:n].to(dtype).reshape(shape)


class _Refused(torch.autograd.Function):
    """First derivatives made with `create_graph=True` by a backward that read an input kept as bits:
    differentiating them again is an error (the bits are values, not the graph that made them: the
    input's part of a second derivative would be missing)."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *gg: Any) -> Any:
        from ..errors import FlexDSLError

        raise FlexDSLError(
            "a second derivative through a product that kept its 0/1 input as bits (the bits are the input's "
            "values, not the graph that made them)", "<backward>",
            hint="turn the bits off for this run (flexdsl.runtime.bits.ENABLED = False), or differentiate the "
                 "network without flexdsl.save_spikes_as_bits / sparse_input")


def first_derivative_only(backward: Any) -> Any:
    """`backward` run without building a graph (what `once_differentiable` does); where the caller
    wants one (`create_graph=True`), its gradients are tied to the incoming ones so that
    differentiating them again raises a FlexDSLError (`_Refused`), and only then: a gradient
    penalty that never goes back through this product runs as it did."""

    @functools.wraps(backward)
    def run(ctx: Any, *grads: Any) -> Any:
        with torch.no_grad():
            outs = backward(ctx, *grads)
        anchor = next((g for g in grads if isinstance(g, torch.Tensor) and g.requires_grad), None)
        if anchor is None or not torch.is_grad_enabled():
            return outs
        at = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor)]
        tied = _Refused.apply(anchor, *(outs[i] for i in at))
        outs = list(outs)
        for i, t in zip(at, tied):
            outs[i] = t
        return tuple(outs)
    return run


class SpikeLinear(torch.autograd.Function):
    """`x W^T + b` whose 0/1 input `x` is saved as bits for the weight's gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        out = torch.nn.functional.linear(x, w, b)
        ctx.shape, ctx.dtype, ctx.has_bias = x.shape, x.dtype, b is not None
        bits = pack(x) if ctx.needs_input_grad[1] else None
        ctx.save_for_backward(bits, w)
        record_product(out, x, bits, lambda v: torch.nn.functional.linear(v, w, b), (w, b))
        return out

    @staticmethod
    @first_derivative_only
    def backward(ctx, g: torch.Tensor):
        bits, w = ctx.saved_tensors
        return linear_grads(g, w, lambda dt: unpack(bits, ctx.shape, dt), ctx.shape, ctx.has_bias,
                            ctx.needs_input_grad, bits=bits)


def chunk_rows(rows: int, row_values: int, dtype: torch.dtype) -> int:
    """Rows of `row_values` values of an input kept as bits that a weight gradient unpacks at once
    (`FLEXDSL_BITS_CHUNK_MB`, default 8 MiB, a multiple of 8 rows: a chunk starts on a byte), `rows`
    where the whole input fits: one product, the terms in the plain product's order."""
    from ..settings import env_int

    budget = (env_int("FLEXDSL_BITS_CHUNK_MB") or 8) << 20
    per_row = max(row_values * torch.empty((), dtype=dtype).element_size(), 1)
    if rows * per_row <= budget:
        return rows
    return max(8, budget // per_row // 8 * 8)


def unpack_rows(bits: torch.Tensor, r0: int, r1: int, row_shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Rows `r0:r1` (`r0` a multiple of 8) of a tensor of rows of `row_shape` kept as `bits`."""
    n = math.prod(row_shape)
    return unpack(bits[r0 * n // 8:(r1 * n + 7) // 8], torch.Size((r1 - r0, *row_shape)), dtype)


def linear_grads(g: torch.Tensor, w: torch.Tensor, x_of: Any, shape: Sequence[int], has_bias: bool,
                 needs: Sequence[bool], bits: torch.Tensor | None = None) -> tuple[Any, Any, Any]:
    """The gradients (input, weight, bias) of `x W^T + b` for the output's gradient `g`, where `needs`
    says: the input's from `w`, the weight's from the input as `x_of(dtype)` gives it back (unpacked
    from bits, or as kept), of `shape`. With the input's `bits` given, a large input is unpacked a
    chunk of rows at a time (`chunk_rows`: the weight's gradient summed over the chunks)."""
    gx = gw = gb = None
    if needs[0]:
        gx = g @ w.to(g.dtype)
    g2 = g.reshape(-1, g.shape[-1])
    rows = g2.shape[0]
    step = chunk_rows(rows, shape[-1], g.dtype) if needs[1] and bits is not None else rows
    if needs[1] and step < rows:
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            part = unpack_rows(bits, r0, r1, (shape[-1],), g.dtype)
            gw = g2[r0:r1].T @ part if gw is None else gw.addmm_(g2[r0:r1].T, part)
        gw = gw.to(w.dtype)
    elif needs[1]:
        gw = (g2.T @ x_of(g.dtype).reshape(-1, shape[-1])).to(w.dtype)
    if has_bias and needs[2]:
        gb = g2.sum(0)
    return gx, gw, gb


def kept(t: torch.Tensor, rows: int = 0) -> Any:
    """A 0/1 tensor to keep for a backward as bits: its first `rows` rows as they are (a scan's s0,
    which need not be 0/1), the rest packed, as a tuple that `stash` walks (`value` gives the tensor
    back, exactly); a tensor too small to gain from it, as it is."""
    if t.numel() < 64:
        return t
    return ("bits", t[:rows].clone(), pack(t[rows:]), tuple(t.shape), t.dtype)


def value(v: Any) -> Any:
    """`kept`'s tensor back, or `v` itself where it is not bits."""
    if not (isinstance(v, tuple) and len(v) == 5 and v[0] == "bits"):
        return v
    _, head, bits, shape, dt = v
    rows = head.shape[0]
    if not rows:
        return unpack(bits, torch.Size(shape), dt)
    out = torch.empty(shape, dtype=dt, device=bits.device)
    out[:rows] = head
    out[rows:] = unpack(bits, torch.Size((shape[0] - rows, *shape[1:])), dt)
    return out


def bits_wanted(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether a product `x W^T` would keep a 0/1 `x` as bits: the bits on, a weight gradient to
    compute, no trace, graph capture, autocast or torch.func transform (`grad`, `vmap`: the plain
    product, which they differentiate), one dtype (whether `x` is 0/1 is the caller's)."""
    return (ENABLED and torch.is_grad_enabled() and w.requires_grad and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()
            and not torch.is_autocast_enabled(x.device.type) and x.dtype == w.dtype
            and not (x.is_cuda and torch.cuda.is_current_stream_capturing()))


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`torch.nn.functional.linear(x, w, b)`, saving `x` as bits where it is known to be 0/1
    (`known_binary`: no check made here) and `bits_wanted`."""
    if bits_wanted(x, w) and known_binary(x):
        return SpikeLinear.apply(x, w, b)
    return torch.nn.functional.linear(x, w, b)


__all__ = ["ENABLED", "SpikeLinear", "chunk_rows", "donate", "take_donation", "record_product", "record_product_kept", "unpack_rows", "bits_wanted", "kept", "linear", "linear_grads", "value", "is_binary", "is_packed", "known_binary", "mark_binary", "pack", "unpack"]
