"""The recurrent scan shared by the backends: one layer's time loop where the model's input port
receives `ix[t] + W s[t-1]` (`ix = W_in x + b`, computed before the loop in one product), `s`
being one of the model's outputs (the source, the spike by default).

    prog = program(ir, "triton", port=0, source=0, dense=True)
    outs, fins = scan(prog, ix, w, s0, inputs, states, params)      # autograd: BPTT

A backend's recurrent program runs the loop (forward, and the backward through the
recurrence with the neuron's derived VJP, giving `gI`, the gradient of the port's current at
every step); what follows from `gI` is the same for every backend and is done here, outside the
loop: `dW = gI^T S_prev` is one matrix product over all steps (`[H, T*B] @ [T*B, H]`; no
per-step outer product is ever formed), `d ix = gI`, `d s0 = gI[0] W`.

Programs are made from the compiled model's IR by the backend's `recurrent` module
(`backends/<name>/recurrent.py`: `load_recurrent(ir, key, port, source, dense)`), cached on
disk like every artefact and loaded once per process.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ..runtime import cache
from . import get
from .base import IR

# the backends with a recurrent scan (the module that makes its program)
IMPLEMENTATIONS = {"torch": "flexdsl.backends.torch.recurrent", "triton": "flexdsl.backends.triton.recurrent"}


class RecurrentProgram(Protocol):
    binary: bool  # the source is a spike (0/1)

    def forward(self, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
                states: Sequence[Any], params: Sequence[Any], save: bool) -> tuple[list, list, torch.Tensor, Any]:
        """(outputs [T, B, H] each, final states [B, H], S [T + 1, B, H]: s0 then the source
        of every step (the source output is S[1:]), what the backward needs (or None))."""
        ...

    def backward(self, saved: Any, w: torch.Tensor, g_outs: Sequence[torch.Tensor | None],
                 g_fins: Sequence[torch.Tensor | None], need: dict[str, Any]) -> tuple:
        """(gI [T, B, H], grads of the other inputs, of the initial states, of the params)."""
        ...


_PROGRAMS: dict[tuple, RecurrentProgram] = {}
_LOCK = threading.Lock()


def program(ir: IR, backend: str, port: int, source: int, dense: bool) -> RecurrentProgram:
    """The recurrent program of a compiled model on a backend (once per process)."""
    b = get(backend)
    key = cache.key(f"{b.name}-recurrent", b.version(), ir.text, ir.filename, str(ir.detach_reset))
    k = (b.name, key, port, source, dense)
    p = _PROGRAMS.get(k)
    if p is None:
        with _LOCK:
            p = _PROGRAMS.get(k)
            if p is None:
                mod = importlib.import_module(IMPLEMENTATIONS[b.name])
                p = mod.load_recurrent(ir, key, port, source, dense)
                _PROGRAMS[k] = p
    return p


class _Scan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, ix, w, s0, *tensors):  # type: ignore[override]
        prog, inputs, states, params, dense = call
        need = ctx.needs_input_grad
        save = any(need[1:])
        outs, fins, S, saved = prog.forward(ix, w, s0, inputs, states, params, save)
        ctx.call = call
        ctx.T = ix.shape[0]
        ctx.kinds = [("input", k) for k, v in enumerate(inputs) if isinstance(v, torch.Tensor)] + \
            [("state", k) for k, v in enumerate(states) if isinstance(v, torch.Tensor)] + \
            [("param", k) for k, v in enumerate(params) if isinstance(v, torch.Tensor)]
        ctx.saved = saved
        if save:
            ctx.save_for_backward(w, S)
        ctx.set_materialize_grads(False)
        ctx.n_out = len(outs)
        return (*outs, *fins)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        prog, inputs, states, params, dense = ctx.call
        w, S = ctx.saved_tensors
        n_out = ctx.n_out
        g_outs, g_fins = grads[:n_out], grads[n_out:]
        need_t = ctx.needs_input_grad[4:]
        need: dict[str, Any] = {"T": ctx.T, "inputs": [False] * len(inputs), "states": [False] * len(states),
                                "params": [False] * len(params)}
        for (kind, k), n in zip(ctx.kinds, need_t):
            need[kind + "s"][k] = bool(n)
        n_ix, n_w, n_s0 = ctx.needs_input_grad[1:4]
        if all(g is None for g in grads):
            return (None,) * (4 + len(need_t))
        gI, g_in, g_st, g_pr = prog.backward(ctx.saved, w, g_outs, g_fins, need)
        ctx.saved = None
        H = w.shape[0]
        gw = gs0 = None
        if n_w:
            prev = S[:-1].reshape(-1, H)
            gflat = gI.reshape(-1, H)
            gw = weight_grad(gflat, prev, prog.binary) if dense else (gflat * prev).sum(0)
        if n_s0:
            gs0 = gI[0].mm(w) if dense else gI[0] * w
        by = {"input": g_in, "state": g_st, "param": g_pr}
        rest = [by[kind][k] if n else None for (kind, k), n in zip(ctx.kinds, need_t)]
        return (None, gI if n_ix else None, gw, gs0, *rest)


def split3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bfloat16 (hi, mid, lo) with hi + mid + lo == t (float32) up to 2^-24 |t|."""
    hi = t.to(torch.bfloat16)
    r = t - hi.float()
    mid = r.to(torch.bfloat16)
    return hi, mid, (r - mid.float()).to(torch.bfloat16)


_MM32: list[bool] = []  # whether torch.mm(bf16, bf16, out_dtype=float32) runs here (CUDA, torch >= 2.8)


def _bf16_products(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
    """sum of a @ b over bfloat16 pairs, accumulated and returned in float32 (None where torch
    cannot: then the caller multiplies in float32)."""
    if _MM32 and not _MM32[0]:
        return None
    try:
        out = torch.mm(*pairs[0], out_dtype=torch.float32)
        for a, b in pairs[1:]:
            out += torch.mm(a, b, out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        _MM32[:] = [False]
        return None
    _MM32[:] = [True]
    return out


def _fast(t: torch.Tensor) -> bool:
    return t.is_cuda and t.dtype == torch.float32 and os.environ.get("FLEXDSL_RECURRENT_DW", "split") == "split"


def weight_grad(g: torch.Tensor, s: torch.Tensor, exact: bool) -> torch.Tensor:
    """`g^T s` ([H, M] @ [M, K]: a weight's gradient over all steps at once). Where `s` is exact in
    bfloat16 (spikes; `exact`) and on CUDA in float32: three bfloat16 products of the gradient's
    parts (summing to it up to 2^-24) with float32 accumulation, each product exact, instead of
    one float32 product (`FLEXDSL_RECURRENT_DW=fp32` keeps that)."""
    if exact and _fast(g):
        sb = s.to(torch.bfloat16)
        hi, mid, lo = split3(g)
        out = _bf16_products([(lo.t(), sb), (mid.t(), sb), (hi.t(), sb)])
        if out is not None:
            return out
    return g.t().mm(s)


class _InputProduct(torch.autograd.Function):
    """x W^T + b for an input exact in bfloat16 (spikes): W's three bfloat16 parts, three
    products with float32 accumulation (each exact), as accurate as one float32 product."""

    @staticmethod
    def forward(ctx, x2, xb, w, b):  # type: ignore[override]
        parts = split3(w)
        out = _bf16_products([(xb, p.t()) for p in reversed(parts)])
        if b is not None:
            out += b
        ctx.save_for_backward(xb, w)
        ctx.has_b = b is not None
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        xb, w = ctx.saved_tensors
        gx = g.mm(w) if ctx.needs_input_grad[0] else None
        gw = weight_grad(g, xb, True) if ctx.needs_input_grad[2] else None
        gb = g.sum(0) if ctx.has_b and ctx.needs_input_grad[3] else None
        return gx, None, gw, gb


def input_current(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`x W^T + b` for every step at once (`F.linear`); on CUDA in float32 with an input that is
    exact in bfloat16 (spikes, small integers), the exact bfloat16 products of `_InputProduct`."""
    if _fast(x) and w.dtype == torch.float32 and _MM32 != [False] and not torch.is_autocast_enabled("cuda"):
        xb = x.to(torch.bfloat16)
        if torch.equal(xb.float(), x):
            x2 = x.reshape(-1, x.shape[-1])
            out = _InputProduct.apply(x2, xb.reshape(-1, x.shape[-1]), w, b)
            if _MM32 == [True]:
                return out.reshape(*x.shape[:-1], w.shape[0])
    return torch.nn.functional.linear(x, w, b)


def scan(prog: RecurrentProgram, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
         states: Sequence[Any], params: Sequence[Any], dense: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The layer's T steps with autograd: (outputs [T, B, H] each, final states [B, H] each).
    `inputs` has None at the port (the other inputs are [T, B, H] tensors); states and params
    are tensors or floats."""
    tensors = [v for v in (*inputs, *states, *params) if isinstance(v, torch.Tensor)]
    res = _Scan.apply((prog, list(inputs), list(states), list(params), dense), ix, w, s0, *tensors)
    n_out = len(res) - len(states)
    return list(res[:n_out]), list(res[n_out:])


__all__ = ["IMPLEMENTATIONS", "RecurrentProgram", "program", "scan", "weight_grad", "input_current"]
