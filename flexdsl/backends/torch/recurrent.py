"""The torch backend's recurrent scan: the layer's time loop in Python, the neuron's step and
its derived backward printed from the schedule (`_fwd_step`, `_bwd_step`, with the loop
invariants computed once per call), so that a step costs the model's arithmetic and one
matrix product, with no autograd graph per step.

It runs everywhere (CPU, CUDA, float64 included) and is the reference the Triton scan is tested
against. The contract (`backends.recurrent.RecurrentProgram`):

    outs, fins, S, saved = prog.forward(ix, w, s0, inputs, states, params, save)
    gI, g_inputs, g_states, g_params = prog.backward(saved, w, g_outs, g_fins, need)

`ix` is the port's current `[T, B, H]` (W_in x + b), `w` the recurrent weight (`[H, H]`, or
`[H]` one-to-one), `s0` the source's previous value `[B, H]`; `S` is `[T + 1, B, H]`: `s0`, then
the source output of every step (the output itself is the view `S[1:]`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...frontend.parse import source_lines
from ...store import cache
from ...store.generated import load_module
from ..base import IR, NoiseKey
from ..random import NoiseStream


def emit_recurrent(ir: IR) -> tuple[str, dict[str, Any]]:
    """The generated module: `_invariants(*params)`, `_fwd_step(...)` and `_bwd_step(...)`."""
    from ..printer import lhs_rhs_lines  # (the printers import sympy: only when the scan is emitted, not
    from .emit import NOISE_ARG, module_head  # when a process loads it from the disk cache)

    TorchPrinter = _scan_printer()

    step, bw, sch = ir.step, ir.backward, ir.schedule
    pr = TorchPrinter()  # (`like`: a tensor argument whose dtype a `where` of two numbers takes)
    S = pr._print
    src = source_lines(step.checked.source)
    params = [S(p.symbol) for p in step.params]
    hoisted = sch.hoisted
    hnames = [S(y) for y, _ in hoisted]
    inner = [s for s in sch.saved if s not in step.states]
    ins = [S(x) for x in step.inputs]
    states = [S(s) for s in step.states]
    noise = NOISE_ARG[:bool(step.draws)]  # a noisy model's steps take their draws
    lines = [
        *module_head(step, "the recurrent layer's torch step (forward and derived backward)"),
        f"def _invariants({', '.join(params)}):",
        "    # the step's values that depend on params only: once per call",
        *lhs_rhs_lines(pr, hoisted),
        f"    return ({''.join(h + ', ' for h in hnames)})",
        "",
        "",
        f"def _fwd_step({', '.join([*ins, *states, *params, *hnames, *noise])}):",
        "    # one step: (outputs, next states, the values the backward reads)",
        *lhs_rhs_lines(TorchPrinter(like=ins[0] if ins else None), sch.fwd_body, step.origins, src),
        "    return (" + "".join(S(v) + ", " for v in [*(v for _, v in step.outputs), *step.next_states, *inner]) + ")",
        "",
        "",
    ]
    g_out = [S(g) for g in bw.grad_outputs]
    g_next = [S(g) for g in bw.grad_next_states]
    saved = [S(s) for s in sch.saved]
    reread = [S(x) for x in sch.reread]
    bpr = TorchPrinter(like=g_out[0] if g_out else (g_next[0] if g_next else None))
    lines += [
        f"def _bwd_step({', '.join([*reread, *saved, *params, *hnames, *g_out, *g_next, *noise])}):",
        "    # the derived vector-Jacobian product of one step: (grads of inputs, of previous states, of",
        "    # learnable params), from the saved values",
        *lhs_rhs_lines(bpr, sch.recompute),
        *lhs_rhs_lines(bpr, sch.bwd_body),
        "    return (" + "".join(S(v) + ", " for v in [*bw.grad_inputs, *bw.grad_states, *bw.grad_params]) + ")",
        "",
    ]
    meta = {"inputs": [x.name for x in step.inputs], "states": [s.name for s in step.states],
            "outputs": [n for n, _ in step.outputs], "saved": [s.name for s in sch.saved],
            "saved_states": [step.states.index(s) if s in step.states else -1 for s in sch.saved],
            "reread": [step.inputs.index(x) for x in sch.reread], "learnable": [p.name for p in step.learnable],
            "params": [p.name for p in step.params], "n_hoisted": len(hoisted), "draws": step.draws}
    return "\n".join(lines) + "\n", meta


def _scan_printer() -> type:
    """The torch printer for the scan's steps: the spike of a named value written inline,
    `(u >= 0).to(u.dtype)` (what `ops.heaviside_ge` computes), so that a step costs no Python call
    for it (the loop runs it twice a step)."""
    from .emit import TorchPrinter

    class ScanPrinter(TorchPrinter):
        def _inline(self, e: Any, kind: str) -> str:
            u = self._print(e.args[0])
            if self.fire_args is None and u.isidentifier():
                return f"({u} {'>=' if kind == 'ge' else '>'} 0).to({u}.dtype)"
            return self._fire(e, kind)

        def _print_SpikeGE(self, e: Any) -> str:
            return self._inline(e, "ge")

        def _print_SpikeGT(self, e: Any) -> str:
            return self._inline(e, "gt")

    return ScanPrinter


def _full(v: Any, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """A step's value as a `[*shape]` tensor of `like`'s dtype (generated code may return a number,
    or a tensor of a broadcastable shape, for a value that does not depend on every input)."""
    if not isinstance(v, torch.Tensor):
        return torch.full(shape, float(v), dtype=like.dtype, device=like.device)
    if v.dtype != like.dtype:
        v = v.to(like.dtype)
    return v if v.shape == shape else v.expand(shape)


def _not_full(res: Sequence[Any], shape: torch.Size, dtype: torch.dtype) -> list[int]:
    """The indices of a step's results that `_full` must make `[*shape]` tensors of `dtype` (the same
    at every step of a call: a result's shape follows from the model and the call's arguments)."""
    return [k for k, r in enumerate(res) if not (isinstance(r, torch.Tensor) and r.shape == shape
                                                and r.dtype == dtype)]


def _tensors(params: Sequence[Any], dev: torch.device) -> list[torch.Tensor]:
    """The params as the generated step takes them (a number: a 0-d float64 tensor)."""
    return [p if isinstance(p, torch.Tensor) else torch.tensor(float(p), dtype=torch.float64, device=dev)
            for p in params]


class TorchRecurrentProgram:
    """The recurrent scan of one model, port and source on the torch backend."""

    def __init__(self, module, meta: dict[str, Any], port: int, source: int, dense: bool) -> None:
        self.mod = module
        self.port, self.source, self.dense = port, source, dense
        self.binary = meta["outputs"][source] == "spike"  # the source is 0/1
        self.n_in, self.n_st, self.n_out = len(meta["inputs"]), len(meta["states"]), len(meta["outputs"])
        self.saved_states = meta["saved_states"]
        self.reread = meta["reread"]
        params = meta["params"]
        self.learn_idx = [params.index(p) for p in meta["learnable"]]
        self.draws = int(meta.get("draws", 0))

    def _stream(self, noise: NoiseKey | None, T: int, shape, dtype, dev) -> NoiseStream | None:
        if not self.draws:
            return None
        if noise is None:
            raise ValueError("a noisy model's recurrent scan needs the call's NoiseKey")
        return NoiseStream(noise.seed, noise.t0, tuple(shape), dtype, dev, T)

    def forward(self, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
                states: Sequence[Any], params: Sequence[Any], save: bool, noise: NoiseKey | None = None,
                s0_exact: bool | None = None):
        T, shape = ix.shape[0], ix.shape[1:]
        dev, dtype = ix.device, ix.dtype
        stream = self._stream(noise, T, shape, dtype, dev)
        prm = _tensors(params, dev)
        hv = self.mod._invariants(*prm)
        st = [_full(s, shape, ix) for s in states]
        n_out, n_st, port = self.n_out, self.n_st, self.port
        outs: list[list[torch.Tensor]] = [[] for _ in range(n_out)]
        kept: list[list[torch.Tensor]] = [[] for _ in self.saved_states] if save else []
        rer: list[list[torch.Tensor]] = [[] for _ in self.reread] if save else []
        wt = w.t() if self.dense else w
        fwd = self.mod._fwd_step
        s = s0
        xs: list[Any] = [None] * self.n_in
        fix: list[int] | None = None  # the results that are not [*shape] tensors of the dtype (found at step 0)
        for t in range(T):
            cur = torch.addmm(ix[t], s, wt) if self.dense else torch.addcmul(ix[t], s, w)
            for k in range(self.n_in):
                xs[k] = cur if k == port else inputs[k][t]
            res = fwd(*xs, *st, *prm, *hv, *([stream.at(t)] if stream is not None else []))
            if fix is None:
                fix = _not_full(res, shape, dtype)
            if fix:
                res = list(res)
                for k in fix:
                    res[k] = _full(res[k], shape, ix)
            for k in range(n_out):
                outs[k].append(res[k])
            if save:
                j = n_out + n_st
                for k, si in enumerate(self.saved_states):
                    if si >= 0:
                        kept[k].append(st[si])
                    else:
                        kept[k].append(res[j])
                        j += 1
                for k, xi in enumerate(self.reread):
                    rer[k].append(xs[xi])
            st = res[n_out:n_out + n_st]
            s = res[self.source]
        S = torch.stack([s0, *outs[self.source]]) if T else s0.unsqueeze(0)
        o = [S[1:] if k == self.source else (torch.stack(v) if T else ix.new_zeros((0, *shape)))
             for k, v in enumerate(outs)]
        saved = None
        if save:
            empty = ix.new_empty((0, *shape))
            saved = (prm, hv, [torch.stack(v) if T else empty for v in kept],
                     [torch.stack(v) if T else empty for v in rer], shape, dtype, noise)
        return o, st, S, saved

    # what a training forward keeps, as tensors (the layer's custom op returns them: `recurrent_ops`)
    def saved_shapes(self, T: int, shape: Sequence[int]) -> list[tuple[int, ...]]:
        return [(T, *shape)] * (len(self.saved_states) + len(self.reread))

    def saved_tensors(self, saved) -> list[torch.Tensor]:
        return [*saved[2], *saved[3]]

    def restore(self, tensors: Sequence[torch.Tensor], inputs: Sequence[Any], params: Sequence[Any],
                like: torch.Tensor, noise: NoiseKey | None):
        prm = _tensors(params, like.device)
        K = len(self.saved_states)
        return prm, self.mod._invariants(*prm), list(tensors[:K]), list(tensors[K:]), like.shape, like.dtype, noise

    def backward(self, saved, w: torch.Tensor, g_outs: Sequence[torch.Tensor | None],
                 g_fins: Sequence[torch.Tensor | None], need: dict[str, Any]):
        """(gI [T, B, H], grads of the other inputs [T, B, H], of the initial states, of the
        param values (each the size of the param value it was given))."""
        prm, hv, kept, rer, shape, dtype, noise = saved
        T = need["T"]
        dev = w.device
        stream = self._stream(noise, T, shape, dtype, dev)  # (the forward's draws)
        zero = torch.zeros((), dtype=dtype, device=dev)
        like = torch.empty((), dtype=dtype, device=dev)
        g_next = [zero if g is None else g for g in g_fins]
        gI = torch.empty((T, *shape), dtype=dtype, device=dev)
        g_in = [torch.empty((T, *shape), dtype=dtype, device=dev) if n and k != self.port else None
                for k, n in enumerate(need["inputs"])]
        acc: list[Any] = [None] * len(self.learn_idx)
        n_in, n_st = self.n_in, self.n_st
        bwd = self.mod._bwd_step
        g_rec = None
        # per step: the values the step's backward rereads, then the saved ones; the outputs' grads
        # (unbound once: no Python call per step to gather them)
        steps = list(zip(*[r.unbind(0) for r in [*rer, *kept]])) or [()] * T
        gos = list(zip(*[(zero,) * T if g is None else g.unbind(0) for g in g_outs])) or [()] * T
        fix: list[int] | None = None
        for t in range(T - 1, -1, -1):
            go = list(gos[t])
            if g_rec is not None:
                go[self.source] = go[self.source] + g_rec
            res = bwd(*steps[t], *prm, *hv, *go, *g_next, *([stream.at(t)] if stream is not None else []))
            if fix is None:
                fix = _not_full(res[:n_in], shape, dtype)
            if fix:
                res = list(res)
                for k in fix:
                    res[k] = _full(res[k], shape, like)
            gi = res[self.port]
            gI[t] = gi
            for k, g in enumerate(g_in):
                if g is not None:
                    g[t] = res[k]
            g_next = list(res[n_in:n_in + n_st])
            for k, g in enumerate(res[n_in + n_st:]):
                if need["params"][self.learn_idx[k]] and isinstance(g, torch.Tensor):
                    acc[k] = g if acc[k] is None else acc[k] + g
            g_rec = gi.mm(w) if self.dense else gi * w
        g_st = [(_full(g, shape, like) if n else None) for g, n in zip(g_next, need["states"])]
        g_pr: list[Any] = [None] * len(prm)
        for k, i in enumerate(self.learn_idx):
            if need["params"][i]:
                p = prm[i]
                g = acc[k] if acc[k] is not None else torch.zeros((), dtype=p.dtype, device=dev)
                g_pr[i] = (g.sum() if p.numel() == 1 else g.sum_to_size(p.shape)).reshape(p.shape).to(p.dtype)
        return gI, g_in, g_st, g_pr, {}


def load_recurrent(ir: IR, key: str, port: int, source: int, dense: bool) -> TorchRecurrentProgram:
    art = cache.get_or_make(key, lambda: cache.Artefact("torchrec", *emit_recurrent(ir)))
    return TorchRecurrentProgram(load_module("torchrec", key, art.source), art.meta, port, source, dense)


__all__ = ["emit_recurrent", "TorchRecurrentProgram", "load_recurrent"]
