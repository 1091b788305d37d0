"""Delays in a recurrent layer (`RecurrentModule`'s mixin): the input synapses' delays run before
the scan (`_delayed_input`); a recurrent synapse with delays runs the layer's steps as a loop of the
neuron's own one-step calls over a kept history of the source (`_delayed_loop`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import delays as dl


class DelayedRecurrence(dl.DelayedSynapses):
    def _delayed_loop(self, x3: torch.Tensor, w_in: torch.Tensor | None, bias: torch.Tensor | None, w: torch.Tensor,
                      s0: torch.Tensor, inputs: list[Any], step_shape: torch.Size, seed: Any, generator: Any
                      ) -> list[torch.Tensor]:
        """The layer's steps where its recurrent synapses have delays: a loop over time, each step the
        neuron's own call (its kernels, autograd through them) on `ix[t] + rec(t)`, `rec(t)` the
        recurrent current of the source's values `1 + d` steps back (`delays.recurrent_current`),
        from a history of the last `max + 1` source values that the layer keeps across calls."""
        s = self.__dict__["_rec_delay"]
        T, flat, H = x3.shape[0], x3.shape[1], self.hidden
        ix = x3 if w_in is None else nn.functional.linear(x3, w_in)
        if bias is not None:
            ix = ix + bias
        hist = self._kept.get(s.name)
        if hist is not None and (hist.shape[1:] != (flat, H) or hist.device != x3.device):
            raise self._view.error(f"the {s.delay + 1} steps of `{s.name}`'s source kept from the last call have shape "
                                   f"{tuple(hist.shape[1:])} on {hist.device}, but this call's are {(flat, H)} on "
                                   f"{x3.device}", self._source_pos(), "call m.reset() before a batch of another size")
        if hist is None:  # (the source before the first step: zeros, or the feedback given)
            hist = torch.cat([s0.new_zeros((s.delay, flat, H)), s0.unsqueeze(0)])
        taps = self._taps(s, w.dtype)
        outs: list[list[torch.Tensor]] = []
        nm = self.neuron
        many = nm.step_mode == "m"
        src = [n for n, _ in self._view.compiled.checked.outputs].index(self.source)
        if seed is not None and generator is None:  # (one stream of draws over the steps)
            generator = torch.Generator(device=x3.device).manual_seed(int(seed))
        for t in range(T):
            cur = ix[t] + dl.recurrent_current(s, hist.to(ix.dtype), w, taps)
            args = [cur if i is None else i[t] for i in inputs]
            y = nm(*(a.unsqueeze(0) if many else a for a in args), generator=generator)
            y = list(y) if isinstance(y, tuple) else [y]
            y = [o[0] if many else o for o in y]
            outs.append(y)
            hist = torch.cat([hist[1:], y[src].unsqueeze(0)])
        if T:
            self._kept[s.name] = hist
            self._states["feedback"] = hist[-1].reshape(step_shape).clone()
        # (no steps: empty outputs of the graph, as the scan's are: a loss of them back-propagates)
        return [torch.stack([o[k] for o in outs]).reshape(T, *step_shape) if T else
                ix.reshape(0, *step_shape) for k in range(len(self._view.compiled.checked.outputs))]

    def _delayed_input(self, xs: torch.Tensor, w_in: torch.Tensor, bias: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(x, W_in, bias) for the scan where the input synapses have delays: axonal (and uniform)
        ones delay the input itself, which the scan multiplies by W_in; synaptic and dendritic ones
        give the port's current (W_in and the bias applied: None, None)."""
        s = self.__dict__["_in_delay"]
        if s.delay_kind in ("uniform", "axonal"):
            return self._delayed(s, xs, lambda xx, ww, bb: xx, w_in, None), w_in, bias
        w = w_in if xs.dtype == w_in.dtype else w_in.to(xs.dtype)
        b = bias if bias is None or bias.dtype == xs.dtype else bias.to(xs.dtype)
        return self._delayed(s, xs, nn.functional.linear, w, b), None, None


__all__ = ["DelayedRecurrence"]
