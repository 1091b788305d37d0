"""The NumPy backend's layer scan (`flexdsl.backends.recurrent.RecurrentProgram`): the layer's
time loop in NumPy, the port receiving `ix[t] + W s[t-1]`, the step and its derived backward the
generated module's (`emit.py`), backpropagation through time in reverse; float64 inside, torch
tensors of the call's dtype at the edges."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch

from .arrays import arr, full, grad_of, tensor
from .noise import draws
from .program import NumpyProgram


class NumpyScan(NumpyProgram):
    """The scan of one model, port and source."""

    def __init__(self, module: ModuleType, meta: dict[str, Any], port: int, source: int, dense: bool) -> None:
        super().__init__(module, meta)
        self.port, self.source, self.dense = port, source, dense
        self.binary = meta["outputs"][source] == "spike"  # the source is 0/1
        self.ops: tuple = ()

    def forward(self, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],  # type: ignore[override]
                states: Sequence[Any], params: Sequence[Any], save: bool, noise: Any = None,
                s0_exact: bool | None = None) -> tuple[list, list, torch.Tensor, Any]:
        T, shape, dtype = ix.shape[0], tuple(ix.shape[1:]), ix.dtype
        n_st, n_out, port = self.n_st, self.n_out, self.port
        x, wn = arr(ix), arr(w)
        others = [None if k == port else arr(inputs[k]) for k in range(self.n_in)]
        st = [full(arr(s), shape) for s in states]
        prm = [arr(p) for p in params]
        hv = self.mod._invariants(*prm)
        at = draws(self.draws, noise, T, shape)
        S = np.empty((T + 1, *shape))
        S[0] = arr(s0)
        outs = [np.empty((T, *shape)) for _ in range(n_out)]
        kept = [np.empty((T, *shape)) for _ in self.saved_states]
        rer = [np.empty((T, *shape)) for _ in self.reread]
        for t in range(T):
            cur = x[t] + (S[t] @ wn.T if self.dense else S[t] * wn)
            xs = [cur if k == port else others[k][t] for k in range(self.n_in)]
            res = [full(r, shape) for r in self.mod._fwd_step(*xs, *st, *prm, *hv, *at(t))]
            if save:
                inner = iter(res[n_out + n_st:])
                for k, si in enumerate(self.saved_states):
                    kept[k][t] = st[si] if si >= 0 else next(inner)
                for k, xi in enumerate(self.reread):
                    rer[k][t] = xs[xi]
            for k in range(n_out):
                outs[k][t] = res[k]
            S[t + 1] = res[self.source]
            st = res[n_out:n_out + n_st]
        St = tensor(S, dtype)
        o = [St[1:] if k == self.source else tensor(v, dtype) for k, v in enumerate(outs)]
        saved = (prm, hv, kept, rer, shape, T, noise, list(params)) if save else None
        return o, [tensor(s, dtype) for s in st], St, saved

    def backward(self, saved: Any, w: torch.Tensor, g_outs: Sequence[torch.Tensor | None],  # type: ignore[override]
                 g_fins: Sequence[torch.Tensor | None], need: dict[str, Any]) -> tuple:
        """(gI [T, B, H], grads of the other inputs, of the initial states, of the params, {})."""
        prm, hv, kept, rer, shape, T, noise, params = saved
        n_in, n_st, port, dtype = self.n_in, self.n_st, self.port, w.dtype
        wn = arr(w)
        at = draws(self.draws, noise, T, shape)
        go = [None if g is None else np.broadcast_to(arr(g), (T, *shape)) for g in g_outs]
        g_next = [np.zeros(shape) if g is None else full(arr(g), shape) for g in g_fins]
        gI = np.empty((T, *shape))
        g_in = [np.zeros((T, *shape)) for _ in range(n_in)]
        acc = [np.zeros(shape) for _ in self.learn_idx]
        g_rec = None
        for t in range(T - 1, -1, -1):
            g_o = [0.0 if g is None else g[t] for g in go]
            if g_rec is not None:
                g_o[self.source] = g_o[self.source] + g_rec
            res = self.mod._bwd_step(*(r[t] for r in rer), *(k[t] for k in kept), *prm, *hv, *g_o, *g_next, *at(t))
            for k in range(n_in):
                g_in[k][t] = full(res[k], shape)
            gI[t] = g_in[port][t]
            g_next = [full(g, shape) for g in res[n_in:n_in + n_st]]
            for j, g in enumerate(res[n_in + n_st:]):
                acc[j] = acc[j] + full(g, shape)
            g_rec = gI[t] @ wn if self.dense else gI[t] * wn
        g_inputs = [tensor(g_in[k], dtype) if n and k != port else None for k, n in enumerate(need["inputs"])]
        g_st = [tensor(g, dtype) if n else None for g, n in zip(g_next, need["states"])]
        g_pr: list[Any] = [None] * len(params)
        for j, i in enumerate(self.learn_idx):
            if need["params"][i]:
                g_pr[i] = grad_of(acc[j], params[i])
        return tensor(gI, dtype), g_inputs, g_st, g_pr, {}
