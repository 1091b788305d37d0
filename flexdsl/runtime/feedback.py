"""An e-prop layer's readout (`flexdsl.recurrent(..., learning="eprop", readout=...)`): a linear map of
the layer's spikes whose error reaches the layer through its own weights (symmetric feedback) or a
fixed matrix (`feedback="random"`: Bellec et al.'s random e-prop)."""

from __future__ import annotations

import torch
from torch import nn


class _RandomFeedback(torch.autograd.Function):
    """`s W^T + b`, whose gradient to `s` goes through the fixed matrix `B` instead of `W`."""

    @staticmethod
    def forward(ctx, s, weight, bias, B):  # type: ignore[override]
        ctx.save_for_backward(s, weight, B)
        ctx.has_bias = bias is not None
        y = s @ weight.t()
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        s, weight, B = ctx.saved_tensors
        g2, s2 = g.reshape(-1, g.shape[-1]), s.reshape(-1, s.shape[-1])
        g_w = g2.t() @ s2 if weight.requires_grad else None
        g_b = g2.sum(0) if ctx.has_bias else None
        return g @ B.to(g.dtype), g_w, g_b, None


class Readout(nn.Module):
    """An e-prop layer's readout: `linear` (`nn.Linear(hidden, n_out)`) of the layer's spikes. With
    `feedback` (a fixed `[n_out, hidden]` matrix: Bellec's random e-prop) the learning signal reaching
    the layer is `(dE/dy) B` instead of `(dE/dy) W` (symmetric feedback)."""

    def __init__(self, linear: nn.Module, feedback: torch.Tensor | None,
                 at: tuple[str, int, int, str] | None = None) -> None:
        super().__init__()
        self.linear = linear
        self.register_buffer("feedback", feedback)
        self.__dict__["_at"] = at  # (where its errors point: the layer's model, file, line, column, text)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        B = self.feedback
        if self.linear.weight.device != s.device or (B is not None and B.device != s.device):
            from ..errors import FlexDSLError

            file, line, col, text = self.__dict__.get("_at") or ("<e-prop readout>", 0, 0, None)
            raise FlexDSLError(f"the e-prop readout's weight is on {self.linear.weight.device}"
                               + (f" and its feedback matrix on {B.device}" if B is not None else "")
                               + f", but the layer's spikes are on {s.device}", file, line, col, text,
                               hint=f"move the layer with its readout: m.to({str(s.device)!r})")
        if B is None:
            return self.linear(s)
        return _RandomFeedback.apply(s, self.linear.weight, self.linear.bias, B)


__all__ = ["Readout"]
