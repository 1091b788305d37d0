"""`flexdsl.conv_layer(model, in_channels, out_channels, kernel_size)`: `Conv2d -> BatchNorm2d -> neuron`
as one module for multi-step inputs `[T, B, C, H, W]`, built to keep little for its backward: the
convolution and the normalization run over all steps at once (T*B samples), the neuron over time on
its own kernels; the layer is a keep session (`runtime/recompute.py`): its 0/1 input is kept as bits
for the weight's gradient and, with `recompute="norm"` (the default), the normalization's output (the
neuron's input) is made again in the backward instead of kept (`"product"`: the convolution's output
too; None: neither). Outputs and gradients are those of the three modules run one after the other,
bit for bit.

    layer = flexdsl.conv_layer("lif", 64, 128, 3, padding=1)    # x [T, B, 64, H, W] -> spikes [T, B, 128, H, W]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import FlexDSLError
from . import recompute as _recompute


def _error(msg: str, call: str, at: str, hint: str) -> FlexDSLError:
    return FlexDSLError(msg, "<conv_layer>", 1, max(call.find(at), 0) + 1, call, hint=hint)


class ConvLayer(nn.Module):
    """`conv -> bn -> neuron` for `[T, B, C, H, W]` inputs (see the module doc); `reset()` clears the
    neuron's state; `conv`, `bn` (None without a normalization) and `neuron` are the parts."""

    def __init__(self, neuron: nn.Module, conv: nn.Conv2d, bn: nn.BatchNorm2d | None, recompute: str | None) -> None:
        super().__init__()
        self.conv, self.bn, self.neuron = conv, bn, neuron
        from .rewrite import save_spikes_as_bits

        save_spikes_as_bits(self, recompute=recompute)
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 5:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            call = f"layer(x)  # x: {shape}"
            raise _error(f"a conv layer takes a [T, B, C, H, W] tensor, not {shape}", call, "x:",
                         "the steps first, then the batch: x.unsqueeze(0) for one step")
        T, B = x.shape[:2]
        y = self.conv(x.flatten(0, 1))
        if self.bn is not None:
            y = self.bn(y)
        return self.neuron(y.view(T, B, *y.shape[1:]))

    def reset(self) -> None:
        self.neuron.reset()

    def extra_repr(self) -> str:
        return f"recompute={self.recompute!r}"


def conv_layer(model: Any, in_channels: int, out_channels: int, kernel_size: Any, *, stride: Any = 1,
               padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = False, norm: bool = True,
               eps: float = 1e-5, momentum: float | None = 0.1, recompute: str | None = "norm",
               backend: str = "auto", **neuron_options: Any) -> ConvLayer:
    """See the module doc; `model` is a model's name or path (loaded with `neuron_options`, as a
    layer's neuron: `detach_reset`, `param_shapes`, `surrogate`, `learnable`, params) or a loaded
    neuron module."""
    from .layer import _loaded_neuron

    if recompute not in _recompute.MODES:
        call = f"conv_layer(..., recompute={recompute!r})"
        raise _error(f"recompute={recompute!r} is not one of None, 'norm', 'product'", call, "recompute=",
                     "'norm' (default): the normalization's output made again in the backward; 'product': "
                     "the convolution's output too; None: only the input kept as bits")
    opts = dict(neuron_options)
    neuron = _loaded_neuron(model, backend, bool(opts.pop("detach_reset", False)), opts.pop("param_shapes", None),
                            opts.pop("surrogate", None), opts.pop("learnable", None), opts)
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                     groups=groups, bias=bias)
    bn = nn.BatchNorm2d(out_channels, eps=eps, momentum=momentum) if norm else None
    return ConvLayer(neuron, conv, bn, recompute)


__all__ = ["ConvLayer", "conv_layer"]
