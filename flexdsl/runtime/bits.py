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

import math
import os
import sys
import types
from typing import Any

import torch

from ..backends import packed as _packed
from ..backends.packed import SpikeLinear as _SpikeLinear
from ..backends.packed import is_binary, known_binary, mark_binary, pack, unpack


class _Module(types.ModuleType):
    """`flexdsl.runtime.bits.ENABLED` reads and sets the one switch (`backends/packed.py`)."""

    @property
    def ENABLED(self) -> bool:  # noqa: N802 - the module constant's name
        return _packed.ENABLED

    @ENABLED.setter
    def ENABLED(self, value: bool) -> None:  # noqa: N802
        _packed.ENABLED = bool(value)


sys.modules[__name__].__class__ = _Module


class _SpikeConv(torch.autograd.Function):
    """A convolution (1-3 spatial dims) whose 0/1 input is saved as bits; its backward is ATen's
    `convolution_backward`, what autograd runs for the plain convolution."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: tuple, padding: tuple,
                dilation: tuple, groups: int) -> torch.Tensor:
        out = torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)
        ctx.shape, ctx.dtype, ctx.has_bias = x.shape, x.dtype, b is not None
        ctx.conv = (stride, padding, dilation, groups)
        bits = pack(x)
        ctx.save_for_backward(bits, w)
        _packed.record_product(out, x, bits, lambda v: torch.ops.aten.convolution(
            v, w, b, stride, padding, dilation, False, [0] * len(stride), groups), (w, b))
        return out

    @staticmethod
    @_packed.first_derivative_only
    def backward(ctx, g: torch.Tensor):
        bits, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        k = len(stride)
        conv = (stride, padding, dilation, False, [0] * k, groups)
        bias = [w.shape[0]] if ctx.has_bias else None
        rows, row = ctx.shape[0], tuple(ctx.shape[1:])
        # (chunks only where FLEXDSL_BITS_CHUNK_MB is set: a convolution's backward per chunk costs host time)
        chunked = ctx.needs_input_grad[1] and os.environ.get("FLEXDSL_BITS_CHUNK_MB", "").strip()
        step = _packed.chunk_rows(rows, math.prod(row), ctx.dtype) if chunked else rows
        if step >= rows:  # (the whole input at once: what autograd runs for the plain convolution)
            x = unpack(bits, ctx.shape, ctx.dtype)
            mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
            gx, gw, gb = torch.ops.aten.convolution_backward(g, x, w, bias, *conv, mask)
            return gx, gw, gb, None, None, None, None
        # a large input: the weight's gradient summed over chunks of samples unpacked one at a time
        gx = gb = gw = None
        if ctx.needs_input_grad[0] or (ctx.has_bias and ctx.needs_input_grad[2]):
            shape_only = g.new_empty((1,)).expand(ctx.shape)
            gx, _, gb = torch.ops.aten.convolution_backward(
                g, shape_only, w, bias, *conv, [ctx.needs_input_grad[0], False, ctx.has_bias and ctx.needs_input_grad[2]])
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            x = _packed.unpack_rows(bits, r0, r1, row, ctx.dtype)
            part = torch.ops.aten.convolution_backward(g[r0:r1], x, w, None, *conv, [False, True, False])[1]
            gw = part if gw is None else gw.add_(part)
        return gx, gw, gb, None, None, None, None


_STOP_AFTER = 2  # (inputs in a row, not all 0/1, after which a rewritten product stops checking its input)


def _plain(x: torch.Tensor, w: torch.Tensor, owner: dict | None = None) -> bool:
    """Whether a product saves its input as it is: no weight gradient, bits off, a trace or graph
    capture, autocast, mixed dtypes, or an input that is not all 0/1. An input not known to be 0/1
    is checked (a pass and, on a GPU, a host sync); a rewritten module (`owner`, its `__dict__`) whose
    last two checked inputs were not all 0/1 (an image, SEW-ResNet's sums of spikes) stops checking:
    its input is saved as it is, which is always right."""
    if not _packed.bits_wanted(x, w):
        return True
    if known_binary(x):
        return False
    if owner is not None and owner.get("_flexdsl_real_inputs", 0) >= _STOP_AFTER:
        return True
    s = _packed.session()
    if s is not None and s.check_later(x, owner):
        return True  # (saved as it is, then as bits once the check (on a GPU: queued on the device) says 0/1)
    ok = is_binary(x)
    if owner is not None:
        owner["_flexdsl_real_inputs"] = 0 if ok else owner.get("_flexdsl_real_inputs", 0) + 1
    return not ok


def spike_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, owner: dict | None = None) -> torch.Tensor:
    """`torch.nn.functional.linear(x, w, b)` with `x` saved as bits where it is all 0/1 and the
    weight has a gradient to compute (see the module doc); else the plain product."""
    if _plain(x, w, owner):
        out = torch.nn.functional.linear(x, w, b)
        _packed.record_product_kept(out, x, lambda v: torch.nn.functional.linear(v, w, b), (w, b))
        return out
    return _SpikeLinear.apply(x, w, b)


def spike_conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: Any, padding: Any, dilation: Any,
               groups: int, owner: dict | None = None) -> torch.Tensor:
    """`torch.nn.functional.conv{1,2,3}d` with `x` saved as bits, as `spike_linear` (a padding given
    as text, "same"/"valid", runs the plain convolution)."""
    n = w.dim() - 2
    if isinstance(padding, str) or x.dim() != n + 2 or _plain(x, w, owner):
        conv = getattr(torch.nn.functional, f"conv{n}d")
        out = conv(x, w, b, stride, padding, dilation, groups)
        _packed.record_product_kept(out, x, lambda v: conv(v, w, b, stride, padding, dilation, groups), (w, b))
        return out
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
