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
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ..errors import FlexDSLError
from ..settings import env_choice
from . import get
from .base import IR, NoiseKey, key_ints

# the backends with a recurrent scan (the module that makes its program)
IMPLEMENTATIONS = {"torch": "flexdsl.backends.torch.recurrent", "triton": "flexdsl.backends.triton.recurrent"}


class RecurrentProgram(Protocol):
    binary: bool  # the source is a spike (0/1)

    def forward(self, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
                states: Sequence[Any], params: Sequence[Any], save: bool, noise: NoiseKey | None = None
                ) -> tuple[list, list, torch.Tensor, Any]:
        """(outputs [T, B, H] each, final states [B, H], S [T + 1, B, H]: s0 then the source
        of every step (the source output is S[1:]), what the backward needs (or None)); `noise`:
        the key of a noisy model's draws (the backward replays them)."""
        ...

    def backward(self, saved: Any, w: torch.Tensor, g_outs: Sequence[torch.Tensor | None],
                 g_fins: Sequence[torch.Tensor | None], need: dict[str, Any]) -> tuple:
        """(gI [T, B, H], grads of the other inputs, of the initial states, of the params, extras:
        "parts" (gI as three bfloat16 parts [3, T, B, H]) and "sb" (S in bfloat16) where the
        program has them and `need["parts"]` asks)."""
        ...


_PROGRAMS: dict[tuple, RecurrentProgram] = {}
_LOCK = threading.Lock()


def program(ir: IR, backend: str, port: int, source: int, dense: bool) -> RecurrentProgram:
    """The recurrent program of a compiled model on a backend (once per process)."""
    b = get(backend)
    key = ir.cache_key(f"{b.name}-recurrent", b.version())
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


def split3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bfloat16 (hi, mid, lo) with hi + mid + lo == t (float32) up to 2^-24 |t|."""
    hi = t.to(torch.bfloat16)
    r = t - hi.float()
    mid = r.to(torch.bfloat16)
    return hi, mid, (r - mid.float()).to(torch.bfloat16)


_MM32: list[bool] = []  # whether torch.mm(bf16, bf16, out_dtype=float32) runs here (CUDA, torch >= 2.8)


def _bf16_products(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], init: torch.Tensor | None = None
                   ) -> torch.Tensor | None:
    """init + the sum of a @ b over bfloat16 pairs, accumulated and returned in float32 (each
    product of bfloat16 values is exact); None where torch cannot (the caller then multiplies in
    float32)."""
    if _MM32 == [False]:
        return None
    try:
        out = None
        if init is not None:
            out = init.expand(pairs[0][0].shape[0], pairs[0][1].shape[1]).contiguous()
        for a, b in pairs:
            if out is None:
                out = torch.mm(a, b, out_dtype=torch.float32)
            else:
                try:
                    out = torch.addmm(out, a, b, out_dtype=torch.float32)
                except (RuntimeError, TypeError):
                    out += torch.mm(a, b, out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        _MM32[:] = [False]
        return None
    _MM32[:] = [True]
    return out


def fast_products(t: torch.Tensor) -> bool:
    """Whether float32 products of spikes run as exact bfloat16 products here (CUDA, and not
    turned off by FLEXDSL_RECURRENT_PRODUCTS=fp32)."""
    off = env_choice("FLEXDSL_RECURRENT_PRODUCTS") == "fp32"  # (checked on every device)
    return t.is_cuda and t.dtype == torch.float32 and _MM32 != [False] and not off


def weight_grad(g: torch.Tensor, s: torch.Tensor, exact: bool, parts: torch.Tensor | None = None) -> torch.Tensor:
    """`g^T s` ([H, M] @ [M, K]: a weight's gradient over all steps at once). Where `s` is exact in
    bfloat16 (spikes; `exact`, then `s` may be given in bfloat16) and on CUDA in float32: three
    bfloat16 products of the gradient's parts (`parts` [3, M, H] if the kernel wrote them, summing
    to it up to 2^-24) with float32 accumulation, each product exact."""
    if exact and fast_products(g):
        sb = s if s.dtype == torch.bfloat16 else s.to(torch.bfloat16)
        ps = list(parts) if parts is not None else split3(g)
        out = _bf16_products([(p.t(), sb) for p in reversed(ps)])
        if out is not None:
            return out
    return g.t().mm(s.to(g.dtype))


def _exact_bf16(x: torch.Tensor) -> torch.Tensor | None:
    """x in bfloat16 where that is exact (spikes, small integers), else None."""
    xb = x.to(torch.bfloat16)
    return xb if torch.equal(xb.float(), x) else None


class _Scan(torch.autograd.Function):
    """The layer: the input product (when fused: an input exact in bfloat16 and W_in in three
    bfloat16 parts, exact products) and the recurrent scan, with BPTT."""

    @staticmethod
    def forward(ctx, call, x, w, s0, w_in, b, *tensors):  # type: ignore[override]
        prog, inputs, states, params, dense, xb, noise = call
        if xb is not None:  # the input product, fused: x W_in^T + b from bfloat16 parts
            x2 = xb.reshape(-1, xb.shape[-1])
            ix = _bf16_products([(x2, p.t()) for p in reversed(split3(w_in))], init=b)
            ix = ix.reshape(*xb.shape[:-1], w_in.shape[0])
        else:
            ix = x
        need = ctx.needs_input_grad
        save = any(need[1:])
        outs, fins, S, saved = prog.forward(ix, w, s0, inputs, states, params, save,
                                            **({"noise": noise} if noise is not None else {}))
        ctx.call = call
        ctx.T = ix.shape[0]
        ctx.kinds = [("input", k) for k, v in enumerate(inputs) if isinstance(v, torch.Tensor)] + \
            [("state", k) for k, v in enumerate(states) if isinstance(v, torch.Tensor)] + \
            [("param", k) for k, v in enumerate(params) if isinstance(v, torch.Tensor)]
        ctx.saved = saved
        ctx.fused = xb is not None
        # S (s0, then the spikes) exact in bfloat16: the spikes are, s0 unless given other values
        ctx.s_exact = bool(prog.binary and dense and save and fast_products(w)
                           and torch.equal(s0.to(torch.bfloat16).to(s0.dtype), s0))
        if save:
            ctx.save_for_backward(w, S, w_in if xb is not None else None)
        ctx.xb = xb if save else None
        ctx.set_materialize_grads(False)
        ctx.n_out = len(outs)
        return (*outs, *fins)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph=True: the derived backward is first order
            raise FlexDSLError("second derivatives through a recurrent layer are not available: its backward is the "
                               "model's derived first-order backward", "<flexdsl.recurrent>",
                               hint="differentiate once (without create_graph=True)")
        prog, inputs, states, params, dense, _, _ = ctx.call
        w, S, w_in = ctx.saved_tensors
        n_out = ctx.n_out
        g_outs, g_fins = grads[:n_out], grads[n_out:]
        need_t = ctx.needs_input_grad[6:]
        n_x, n_w, n_s0, n_win, n_b = ctx.needs_input_grad[1:6]
        if all(g is None for g in grads):
            return (None,) * (6 + len(need_t))
        need: dict[str, Any] = {"T": ctx.T, "inputs": [False] * len(inputs), "states": [False] * len(states),
                                "params": [False] * len(params),
                                "parts": fast_products(w) and dense and prog.binary and (n_w or n_win)}
        for (kind, k), n in zip(ctx.kinds, need_t):
            need[kind + "s"][k] = bool(n)
        gI, g_in, g_st, g_pr, extra = prog.backward(ctx.saved, w, g_outs, g_fins, need)
        ctx.saved = None
        parts, sb = extra.get("parts"), extra.get("sb")
        H = w.shape[0]
        gflat = gI.reshape(-1, H)
        pflat = parts.reshape(3, -1, H) if parts is not None else None
        gw = gs0 = gx = gwin = gb = None
        if n_w:
            if dense:
                prev = (sb if sb is not None else S)[:-1].reshape(-1, H)
                gw = weight_grad(gflat, prev, ctx.s_exact, pflat)
            else:
                gw = (gflat * S[:-1].reshape(-1, H)).sum(0)
        if n_s0:
            gs0 = gI[0].mm(w) if dense else gI[0] * w
        if ctx.fused:
            xb = ctx.xb
            if n_win:
                gwin = weight_grad(gflat, xb.reshape(-1, xb.shape[-1]), True, pflat)
            if n_b:
                gb = gflat.sum(0)
            if n_x:
                gx = gI.matmul(w_in)
        elif n_x:
            gx = gI
        ctx.xb = None
        by = {"input": g_in, "state": g_st, "param": g_pr}
        rest = [by[kind][k] if n else None for (kind, k), n in zip(ctx.kinds, need_t)]
        return (None, gx, gw, gs0, gwin, gb, *rest)


def scan(prog: RecurrentProgram, x: torch.Tensor, w_in: torch.Tensor | None, b: torch.Tensor | None,
         w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any], states: Sequence[Any], params: Sequence[Any],
         dense: bool, noise: Any = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The layer's T steps with autograd: (outputs [T, B, H] each, final states [B, H] each).
    `x` is the layer's input `[T, B, F]`, multiplied by `w_in` (`[H, F]`, or None: `x` is the
    port's current) plus `b` before the loop; `inputs` has None at the port (the other inputs are
    [T, B, H] tensors); states and params are tensors or floats; `noise` keys a noisy model's draws
    (`base.NoiseKey`; its elements are those of the [B, H] step)."""
    if isinstance(noise, torch.Tensor):  # (a torch.compile trace: the key is read here, eagerly)
        noise = NoiseKey(*key_ints(noise))
    xb = None
    if w_in is not None:
        if (fast_products(x) and w_in.dtype == torch.float32 and (b is None or b.dtype == torch.float32)
                and not torch.is_autocast_enabled("cuda")):
            xb = _exact_bf16(x)
        if xb is None:
            x, w_in, b = torch.nn.functional.linear(x, w_in, b), None, None
    elif b is not None:
        x, b = x + b, None
    tensors = [v for v in (*inputs, *states, *params) if isinstance(v, torch.Tensor)]
    res = _Scan.apply((prog, list(inputs), list(states), list(params), dense, xb, noise), x, w, s0, w_in, b,
                      *tensors)
    n_out = len(res) - len(states)
    return list(res[:n_out]), list(res[n_out:])


__all__ = ["IMPLEMENTATIONS", "RecurrentProgram", "program", "scan", "weight_grad", "split3", "fast_products"]
