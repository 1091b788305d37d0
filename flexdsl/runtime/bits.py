"""Spikes saved for the backward as bits: a synapse group's product `x W^T + b` whose input `x` is
0/1 keeps `x` for the weight's gradient packed, 1 bit a value (`uint8`, 8 values a byte: 32x less
than float32), and unpacks it, exactly, where the gradient is computed. The input's gradient needs
only `W`. A tensor with any value other than 0 and 1 is saved as it is (the check is one pass over
it, where the product needs a weight gradient; none for a flexdsl neuron's spike output not written
since, which `mark_binary` records); so is one under CUDA-graph capture or torch.compile (whose
graphs save what they need themselves).

    y = spike_linear(x, w, b)        # = torch.nn.functional.linear(x, w, b), with x saved as bits
    packed = pack(x); x == unpack(packed, x.shape, x.dtype)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

ENABLED = True  # (False: every product saves its input as it is; for measuring what the bits save)


_KNOWN: Any = None  # tensors -> (their version when seen, whether all 0/1): spikes of neurons, checked ones


def _known() -> Any:
    global _KNOWN
    if _KNOWN is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _KNOWN = WeakIdKeyDictionary()
    return _KNOWN


def mark_binary(t: torch.Tensor, binary: bool = True) -> None:
    """`t` holds only 0 and 1 (a neuron's spike output; with `binary=False`: it does not): a product
    of it, unchanged since, skips the check."""
    if not torch.compiler.is_compiling():
        _known()[t] = (t._version, binary)


def known_binary(t: Any) -> bool:
    """Whether `t` is known to hold only 0 and 1 (marked, and not written since)."""
    k = _KNOWN.get(t) if _KNOWN is not None and isinstance(t, torch.Tensor) else None
    return k is not None and k == (t._version, True)


def is_binary(x: torch.Tensor) -> bool:
    """Whether every value of `x` is 0 or 1: known for a neuron's spike output or a tensor checked
    before and not written since (`mark_binary`), else one pass over it (a host sync on a GPU),
    whose answer is kept with the tensor."""
    k = _KNOWN.get(x) if _KNOWN is not None else None
    if k is not None and k[0] == x._version:
        return k[1]
    ok = bool(((x == 0) | (x == 1)).all())
    mark_binary(x, ok)
    return ok


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def pack(x: torch.Tensor) -> torch.Tensor:
    """The 0/1 values of `x` as bits: `uint8 [ceil(numel / 8)]`, value k in bit k % 8 of byte k // 8."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    sh = _SHIFTS.get(flat.device)
    if sh is None:
        sh = _SHIFTS[flat.device] = torch.arange(8, dtype=torch.uint8, device=flat.device)
    return (flat.view(-1, 8).to(torch.uint8) << sh).sum(-1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """`pack`'s inverse: the values, exactly, as `dtype` in `shape`."""
    n = 1
    for k in shape:
        n *= k
    sh = _SHIFTS.get(packed.device)
    if sh is None:
        sh = _SHIFTS[packed.device] = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> sh) & 1
    return bits.reshape(-1)[:n].to(dtype).reshape(shape)


class _SpikeLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        out = torch.nn.functional.linear(x, w, b)
        ctx.shape, ctx.dtype, ctx.has_bias = x.shape, x.dtype, b is not None
        ctx.save_for_backward(pack(x) if ctx.needs_input_grad[1] else None, w)
        return out

    @staticmethod
    @once_differentiable  # (a second derivative through the saved bits would miss the input's part: an error)
    def backward(ctx, g: torch.Tensor):
        packed, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = g @ w.to(g.dtype)
        g2 = g.reshape(-1, g.shape[-1])
        if ctx.needs_input_grad[1]:
            x = unpack(packed, ctx.shape, g.dtype).reshape(-1, ctx.shape[-1])
            gw = (g2.T @ x).to(w.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


class _SpikeConv(torch.autograd.Function):
    """A convolution (1-3 spatial dims) whose 0/1 input is saved as bits; its backward is ATen's
    `convolution_backward`, what autograd runs for the plain convolution."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: tuple, padding: tuple,
                dilation: tuple, groups: int) -> torch.Tensor:
        out = torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)
        ctx.shape, ctx.dtype, ctx.has_bias = x.shape, x.dtype, b is not None
        ctx.conv = (stride, padding, dilation, groups)
        ctx.save_for_backward(pack(x), w)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        packed, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        x = unpack(packed, ctx.shape, ctx.dtype)
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            g, x, w, [w.shape[0]] if ctx.has_bias else None, stride, padding, dilation, False, [0] * len(stride),
            groups, mask)
        return gx, gw, gb, None, None, None, None


def _plain(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether a product saves its input as it is: no weight gradient, bits off, a trace or graph
    capture, autocast, mixed dtypes, or an input that is not all 0/1."""
    return (not ENABLED or not torch.is_grad_enabled() or not w.requires_grad or torch.compiler.is_compiling()
            or torch.is_autocast_enabled(x.device.type) or x.dtype != w.dtype
            or (x.is_cuda and torch.cuda.is_current_stream_capturing()) or not is_binary(x))


def spike_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`torch.nn.functional.linear(x, w, b)` with `x` saved as bits where it is all 0/1 and the
    weight has a gradient to compute (see the module doc); else the plain product."""
    if _plain(x, w):
        return torch.nn.functional.linear(x, w, b)
    return _SpikeLinear.apply(x, w, b)


def spike_conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: Any, padding: Any, dilation: Any,
               groups: int) -> torch.Tensor:
    """`torch.nn.functional.conv{1,2,3}d` with `x` saved as bits, as `spike_linear` (a padding given
    as text, "same"/"valid", runs the plain convolution)."""
    n = w.dim() - 2
    if isinstance(padding, str) or x.dim() != n + 2 or _plain(x, w):
        return getattr(torch.nn.functional, f"conv{n}d")(x, w, b, stride, padding, dilation, groups)
    def tup(v: Any) -> tuple:
        return tuple(v) if isinstance(v, tuple | list) else (v,) * n

    return _SpikeConv.apply(x, w, b, tup(stride), tup(padding), tup(dilation), groups)




def synapse_product(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, one_to_one: bool) -> torch.Tensor:
    """A synapse group's current of presynaptic values `x` (dense: `x W^T + b`, with `x` saved for
    the weight's gradient as bits where it is 0/1 spikes; one to one: `x * w + b`)."""
    if one_to_one:
        return x * w if b is None else torch.addcmul(b, x, w)
    return spike_linear(x, w, b)


__all__ = ["is_binary", "known_binary", "mark_binary", "pack", "spike_conv", "spike_linear", "synapse_product",
           "unpack"]
