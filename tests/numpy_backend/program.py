"""The NumPy backend's neuron program: the generated step over the T steps in NumPy (forward),
and the model's derived backward over them in reverse (an autograd Function): float64 inside,
torch tensors of the inputs' dtype at the edges."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch

from flexdsl.backends.base import RunResult

from .arrays import arr, full, grad_of, tensor
from .noise import draws


class NumpyProgram:
    computes_in = torch.float64

    def __init__(self, module: ModuleType, meta: dict[str, Any]) -> None:
        self.mod = module
        self.n_in, self.n_st, self.n_out = len(meta["inputs"]), len(meta["states"]), len(meta["outputs"])
        self.saved_states, self.reread = meta["saved_states"], meta["reread"]
        self.learn_idx = [meta["params"].index(p) for p in meta["learnable"]]
        self.draws = int(meta.get("draws", 0))

    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool, noise: Any = None) -> RunResult:
        vals = [*inputs, *states, *params]
        idx = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor)]
        call = (self, vals, idx, store_seqs, noise)
        res = _Run.apply(call, *(vals[i] for i in idx))
        n_out, n_st = self.n_out, self.n_st
        return RunResult(list(res[:n_out]), list(res[n_out:n_out + n_st]),
                         list(res[n_out + n_st:]) if store_seqs else None)

    def forward(self, vals: Sequence[Any], save: bool, noise: Any) -> tuple[list, list, list, Any]:
        """(outputs [T, *shape], final states, state sequences, what the backward reads) in float64."""
        n_in, n_st, n_out = self.n_in, self.n_st, self.n_out
        xs = [arr(x) for x in vals[:n_in]]
        T, shape = xs[0].shape[0], np.broadcast_shapes(*(x.shape[1:] for x in xs))
        st = [full(arr(s), shape) for s in vals[n_in:n_in + n_st]]
        prm = [arr(p) for p in vals[n_in + n_st:]]
        hv = self.mod._invariants(*prm)
        at = draws(self.draws, noise, T, shape)
        outs: list[list] = [[] for _ in range(n_out)]
        seqs: list[list] = [[] for _ in range(n_st)]
        kept: list[list] = [[] for _ in self.saved_states]
        rer: list[list] = [[] for _ in self.reread]
        for t in range(T):
            x_t = [x[t] for x in xs]
            res = [full(r, shape) for r in self.mod._fwd_step(*x_t, *st, *prm, *hv, *at(t))]
            if save:
                inner = iter(res[n_out + n_st:])
                for k, si in enumerate(self.saved_states):
                    kept[k].append(st[si] if si >= 0 else next(inner))
                for k, xi in enumerate(self.reread):
                    rer[k].append(x_t[xi])
            st = res[n_out:n_out + n_st]
            for i in range(n_out):
                outs[i].append(res[i])
            for i in range(n_st):
                seqs[i].append(st[i])
        stack = lambda a: np.stack(a) if a else np.zeros((0, *shape))  # noqa: E731
        saved = (prm, hv, [stack(k) for k in kept], [stack(r) for r in rer], shape, T, noise) if save else None
        return [stack(o) for o in outs], st, [stack(s) for s in seqs], saved

    def backward(self, saved: Any, g_outs: Sequence[Any], g_fins: Sequence[Any], g_seqs: Sequence[Any]
                 ) -> tuple[list, list, list]:
        """Per-element gradients (float64) of the inputs [T, *shape], the initial states and the
        learnable params (by index into the params; None elsewhere): the derived backward."""
        prm, hv, kept, rer, shape, T, noise = saved
        n_in, n_st = self.n_in, self.n_st
        at = draws(self.draws, noise, T, shape)
        go = [None if g is None else np.broadcast_to(arr(g), (T, *shape)) for g in g_outs]
        gs = [None if g is None else np.broadcast_to(arr(g), (T, *shape)) for g in g_seqs]
        g_next = [np.zeros(shape) if g is None else full(arr(g), shape) for g in g_fins]
        g_in = [np.zeros((T, *shape)) for _ in range(n_in)]
        acc = [np.zeros(shape) for _ in self.learn_idx]
        for t in range(T - 1, -1, -1):
            g_next = [g if s is None else g + s[t] for g, s in zip(g_next, gs)]
            g_o = [0.0 if g is None else g[t] for g in go]
            res = self.mod._bwd_step(*(r[t] for r in rer), *(k[t] for k in kept), *prm, *hv, *g_o, *g_next, *at(t))
            for k in range(n_in):
                g_in[k][t] = full(res[k], shape)
            g_next = [full(g, shape) for g in res[n_in:n_in + n_st]]
            for j, g in enumerate(res[n_in + n_st:]):
                acc[j] = acc[j] + full(g, shape)
        g_pr: list[Any] = [None] * len(prm)
        for j, i in enumerate(self.learn_idx):
            g_pr[i] = acc[j]
        return g_in, g_next, g_pr


class _Run(torch.autograd.Function):
    """A neuron call: NumPy's forward, the derived backward as its gradient."""

    @staticmethod
    def forward(ctx, call, *tensors):  # type: ignore[override]
        prog, vals, idx, store_seqs, noise = call
        save = any(ctx.needs_input_grad[1:])
        outs, fins, seqs, saved = prog.forward(vals, save, noise)
        ctx.call, ctx.saved = call, saved
        ctx.set_materialize_grads(False)
        dtype = vals[0].dtype
        return (*(tensor(o, dtype) for o in outs), *(tensor(f, dtype) for f in fins),
                *((tensor(s, dtype) for s in seqs) if store_seqs else ()))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        prog, vals, idx, store_seqs, _ = ctx.call
        n_out, n_st = prog.n_out, prog.n_st
        g_seqs = grads[n_out + n_st:] if store_seqs else [None] * n_st
        g_in, g_st, g_pr = prog.backward(ctx.saved, grads[:n_out], grads[n_out:n_out + n_st], g_seqs)
        per = [*g_in, *g_st, *g_pr]  # (None: no derived gradient, a param the step does not learn: zeros)
        return (None, *((grad_of(per[i] if per[i] is not None else np.zeros(()), vals[i]) if need else None)
                        for i, need in zip(idx, ctx.needs_input_grad[1:])))
