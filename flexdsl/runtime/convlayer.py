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

import math
from typing import Any

import torch
from torch import nn

from ..errors import FlexDSLError
from . import recompute as _recompute


def _error(msg: str, call: str, at: str, hint: str) -> FlexDSLError:
    return FlexDSLError(msg, "<conv_layer>", 1, max(call.find(at), 0) + 1, call, hint=hint)


def _arg_error(name: str, value: Any, msg: str, hint: str) -> FlexDSLError:
    call = f"conv_layer(..., {name}={value!r})"
    return _error(f"{name}={value!r}: {msg}", call, f"{name}=", hint)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pair(name: str, v: Any, least: int) -> tuple[int, int]:
    """An int or two ints (height, width), each at least `least`."""
    vs = tuple(v) if isinstance(v, tuple | list) else (v, v)
    if len(vs) != 2 or not all(_is_int(u) and u >= least for u in vs):
        what = "positive" if least > 0 else "non-negative"
        raise _arg_error(name, v, f"give a {what} int or two (height, width)", f"e.g. {name}={max(least, 1)} or "
                         f"{name}=({max(least, 1)}, {max(least, 1)})")
    return vs[0], vs[1]


def _check_args(in_channels: Any, out_channels: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                groups: Any, bias: Any, norm: Any, eps: Any, momentum: Any) -> None:
    """The arguments of `conv_layer` as `nn.Conv2d` and `nn.BatchNorm2d` take them, else a located error
    (they failed in torch, bare, or were taken: `in_channels=0`, `kernel_size=0`, `eps=-1`)."""
    for name, v in (("in_channels", in_channels), ("out_channels", out_channels)):
        if not _is_int(v) or v <= 0:
            raise _arg_error(name, v, "channels are a positive int", f"e.g. {name}=16")
    _pair("kernel_size", kernel_size, 1)
    _pair("stride", stride, 1)
    _pair("dilation", dilation, 1)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise _arg_error("padding", padding, "padding given as text is 'same' or 'valid'",
                             "'same' keeps H and W (stride 1), 'valid' pads nothing; or an int: padding=1")
        if padding == "same" and _pair("stride", stride, 1) != (1, 1):
            raise _arg_error("padding", padding, f"needs stride 1 (stride={stride!r})",
                             "give the padding as an int (padding=1 for a 3x3 kernel), or stride=1")
    else:
        _pair("padding", padding, 0)
    if not _is_int(groups) or groups <= 0 or in_channels % groups or out_channels % groups:
        raise _arg_error("groups", groups, f"groups is a positive int that divides in_channels ({in_channels}) and "
                         f"out_channels ({out_channels})", "groups=1 (every input channel to every output), or "
                         "groups=in_channels for a depthwise convolution")
    for name, v in (("bias", bias), ("norm", norm)):
        if not isinstance(v, bool):
            raise _arg_error(name, v, "give True or False", f"{name}=True")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < float("inf"):
        raise _arg_error("eps", eps, "the normalization's eps is a positive number", "e.g. eps=1e-5 (the default)")
    if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, int | float)
                                 or not 0 <= momentum <= 1):
        raise _arg_error("momentum", momentum, "the running statistics' momentum is a number in [0, 1] or None",
                         "e.g. momentum=0.1 (the default); None: a cumulative average")


def _out_size(conv: nn.Conv2d, size: tuple) -> tuple[int, ...]:
    if isinstance(conv.padding, str):
        return size if conv.padding == "same" else tuple(
            n - d * (k - 1) for n, k, d in zip(size, conv.kernel_size, conv.dilation))
    return tuple((n + 2 * p - d * (k - 1) - 1) // st + 1
                 for n, k, d, p, st in zip(size, conv.kernel_size, conv.dilation, conv.padding, conv.stride))


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
        self._check_call(x)
        T, B = x.shape[:2]
        y = self.conv(x.flatten(0, 1))
        if self.bn is not None:
            y = self.bn(y)
        return self.neuron(y.view(T, B, *y.shape[1:]))

    def _check_call(self, x: torch.Tensor) -> None:
        """`x` as the convolution takes it (a floating-point tensor of its dtype and device, its
        channels, at least the kernel's extent), else a located error (they were torch's, bare)."""
        conv, shape = self.conv, tuple(x.shape)
        call = f"layer(x)  # x: {shape} {x.dtype} on {x.device}"
        w = conv.weight
        if not x.is_floating_point():
            raise _error(f"a conv layer takes a floating-point tensor, not {x.dtype}", call, "x:",
                         "x.float() (spikes as 0.0/1.0)")
        if x.device != w.device or (x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type)):
            raise _error(f"the input is {x.dtype} on {x.device}, the layer's weights {w.dtype} on {w.device}", call,
                         "x:", f"move one of them: layer.to({x.dtype}) or x.to({w.dtype}), layer.to(x.device)")
        if shape[2] != conv.in_channels:
            raise _error(f"the input has {shape[2]} channels (x.shape[2]); the layer takes {conv.in_channels}", call,
                         "x:", "the channels third: [T, B, C, H, W]")
        if not isinstance(conv.padding, str):
            for axis, size, k, d, p in zip("HW", shape[3:], conv.kernel_size, conv.dilation, conv.padding):
                if size + 2 * p < d * (k - 1) + 1:
                    raise _error(f"the input's {axis} is {size}, padded {size + 2 * p}: less than the kernel's extent "
                                 f"{d * (k - 1) + 1}", call, "x:", "a larger input, more padding or a smaller kernel")
        if self.bn is not None and self.bn.training and x.numel() and \
                shape[0] * shape[1] * math.prod(_out_size(conv, shape[3:])) == 1:
            raise _error("one value per channel: a batch normalization in training needs more", call, "x:",
                         "a larger batch (or more steps), or layer.eval()")

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
    _check_args(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, norm, eps, momentum)
    opts = dict(neuron_options)
    neuron = _loaded_neuron(model, backend, bool(opts.pop("detach_reset", False)), opts.pop("param_shapes", None),
                            opts.pop("surrogate", None), opts.pop("learnable", None), opts)
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                     groups=groups, bias=bias)
    bn = nn.BatchNorm2d(out_channels, eps=eps, momentum=momentum) if norm else None
    return ConvLayer(neuron, conv, bn, recompute)


__all__ = ["ConvLayer", "conv_layer"]
