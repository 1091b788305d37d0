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


def weight_grad(g: torch.Tensor, s: torch.Tensor, binary: bool) -> torch.Tensor:
    """`g^T s` ([H, M] @ [M, H]: dW_rec over all steps at once). On CUDA with float32 gradients
    and spikes (exact in bfloat16), three bfloat16 products with float32 accumulation and output,
    of the gradient's bfloat16 parts (which sum to it up to 2^-24), instead of one float32 product
    (`FLEXDSL_RECURRENT_DW=fp32` keeps that)."""
    if binary and g.is_cuda and g.dtype == torch.float32 and os.environ.get("FLEXDSL_RECURRENT_DW", "split") == "split":
        try:
            sb = s.to(torch.bfloat16)
            hi = g.to(torch.bfloat16)
            r = g - hi.float()
            mid = r.to(torch.bfloat16)
            lo = (r - mid.float()).to(torch.bfloat16)
            out = torch.mm(lo.t(), sb, out_dtype=torch.float32)
            out += torch.mm(mid.t(), sb, out_dtype=torch.float32)
            out += torch.mm(hi.t(), sb, out_dtype=torch.float32)
            return out
        except (RuntimeError, TypeError, NotImplementedError):  # a torch without mm(out_dtype=)
            pass
    return g.t().mm(s)


def scan(prog: RecurrentProgram, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
         states: Sequence[Any], params: Sequence[Any], dense: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The layer's T steps with autograd: (outputs [T, B, H] each, final states [B, H] each).
    `inputs` has None at the port (the other inputs are [T, B, H] tensors); states and params
    are tensors or floats."""
    tensors = [v for v in (*inputs, *states, *params) if isinstance(v, torch.Tensor)]
    res = _Scan.apply((prog, list(inputs), list(states), list(params), dense), ix, w, s0, *tensors)
    n_out = len(res) - len(states)
    return list(res[:n_out]), list(res[n_out:])


__all__ = ["IMPLEMENTATIONS", "RecurrentProgram", "program", "scan", "weight_grad"]
