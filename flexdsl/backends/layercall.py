"""A layer call's arithmetic around a backend's scan: the port's current before the loop (`W_in x + b`,
from exact bfloat16 parts where that is exact), the scan's forward, and what follows from the port's
gradient `gI` after it (the plan's products: `dW = gI^T S_prev` over all steps at once, `d ix = gI`,
`d s0 = gI[0] W`, `dW_in`, `db`). Used by the eager autograd Function (`recurrent.py`) and by the
layer's custom-op pair under torch.compile (`recurrent_ops.py`): one definition, looked up here at
call time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import FlexDSLError
from ..settings import env_choice
from . import packed, replay
from .base import NoiseKey, RecurrentProgram
from .exact import exact_bf16, exact_in_bf16, fused_products


def split3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bfloat16 (hi, mid, lo) with hi + mid + lo == t (float32) up to 2^-24 |t|."""
    hi = t.to(torch.bfloat16)
    r = t - hi.float()
    mid = r.to(torch.bfloat16)
    return hi, mid, (r - mid.float()).to(torch.bfloat16)


MM32: list[bool] = []  # whether torch.mm(bf16, bf16, out_dtype=float32) runs here (CUDA, torch >= 2.8)


def bf16_products(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], init: torch.Tensor | None = None
                   ) -> torch.Tensor | None:
    """init + the sum of a @ b over bfloat16 pairs, accumulated and returned in float32 (each
    product of bfloat16 values is exact); None where torch cannot (the caller then multiplies in
    float32)."""
    if MM32 == [False]:
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
        MM32[:] = [False]
        return None
    MM32[:] = [True]
    return out


def fast_products(t: torch.Tensor) -> bool:
    """Whether float32 products of spikes run as exact bfloat16 products here (CUDA, and not
    turned off by FLEXDSL_RECURRENT_PRODUCTS=fp32)."""
    off = env_choice("FLEXDSL_RECURRENT_PRODUCTS") == "fp32"  # (checked on every device)
    return t.is_cuda and t.dtype == torch.float32 and MM32 != [False] and not off


def weight_grad(g: torch.Tensor, s: torch.Tensor, exact: bool, parts: torch.Tensor | None = None) -> torch.Tensor:
    """`g^T s` ([H, M] @ [M, K]: a weight's gradient over all steps at once). Where `s` is exact in
    bfloat16 (spikes; `exact`, then `s` may be given in bfloat16) and on CUDA in float32: three
    bfloat16 products of the gradient's parts (`parts` [3, M, H] if the kernel wrote them, summing
    to it up to 2^-24) with float32 accumulation, each product exact."""
    if exact and fast_products(g):
        sb = s if s.dtype == torch.bfloat16 else s.to(torch.bfloat16)
        ps = list(parts) if parts is not None else split3(g)
        out = bf16_products([(p.t(), sb) for p in reversed(ps)])
        if out is not None:
            return out
    return g.t().mm(s.to(g.dtype))


def input_product(xb: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor | None, prog: Any) -> torch.Tensor | None:
    """xb W_in^T + b in float32 from exact bfloat16 products (xb [M, F] exact in bfloat16, W_in in
    its three parts): one fused Triton kernel on CUDA, else three torch products (None where torch
    has none either)."""
    kern = fused_products(xb, prog)
    if kern is not None:
        return kern.split3_mm(xb, w_in, b.contiguous() if b is not None else None)
    return bf16_products([(xb, p.t()) for p in reversed(split3(w_in))], init=b)


@dataclass
class Saved:
    """What the backward of a call needs besides the call's own inputs."""

    T: int
    saved: Any  # the program's
    S: torch.Tensor  # s0, then the source of every step
    w: torch.Tensor
    w_in: torch.Tensor | None
    x: torch.Tensor | None  # the layer's input where the input product was made here in float
    xb: torch.Tensor | None  # x in bfloat16 when the input product was fused (exact products)
    s_exact: bool  # S exact in bfloat16 (spikes): the weight gradient takes exact bfloat16 products
    linear: bool  # the input product (or the bias) was made here, not by the caller


MM_BF16_MIN = 1 << 24  # (inputs of fewer values: the launches cost more than cuBLAS's slower kernel)


def linear(x: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor | None, prog: Any) -> torch.Tensor:
    """`W_in x + b` as torch computes it (a spike input saved as bits: `packed.linear`). Under autocast to bfloat16 on CUDA with no gradient to
    track (inference) and a large input, the same product in one Triton kernel on rows padded to 64
    elements (`products.mm_bf16`: cuBLAS takes slower kernels for a 700-wide bfloat16 row); the
    input's conversion is the one autocast makes."""
    kern = fused_products(x, prog) if x.numel() >= MM_BF16_MIN else None
    if (kern is not None and torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16
            and env_choice("FLEXDSL_RECURRENT_PRODUCTS") != "fp32" and x.dtype in (torch.float32, torch.bfloat16)
            and not replay.tracks_grad((x, w_in, b))):
        y = kern.mm_bf16(x.reshape(-1, x.shape[-1]), w_in, b)
        return y.reshape(*x.shape[:-1], w_in.shape[0])
    return packed.linear(x, w_in, b)  # (a 0/1 input known as such is saved as bits)


def fusable(x: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether x W_in^T may run as exact bfloat16 products (CUDA, float32, no autocast)."""
    return (fast_products(x) and w_in.dtype == torch.float32 and (b is None or b.dtype == torch.float32)
            and not torch.is_autocast_enabled("cuda"))


def forward(prog: RecurrentProgram, x, w, s0, w_in, b, xb, inputs, states, params, dense: bool, save: bool,
             noise: NoiseKey | None = None, s0_exact: bool | None = None) -> tuple[list, list, Saved | None]:
    """The layer's forward: the port's current `ix` (x itself; or x W_in^T + b, from bfloat16
    parts when `xb` is given), then the program's scan. (outputs, final states, what the
    backward needs when `save`)."""
    # whether s0 is exact in bfloat16 (the spikes of an earlier call, zeros; not a value given by hand):
    # decided here once, for the scan's products and the weight gradient's (one synchronisation,
    # before anything is launched: the scan's preparation then overlaps the input product)
    if s0_exact is None and prog.binary and dense and fast_products(s0):
        s0_exact = exact_in_bf16(s0, prog)
    linear = xb is None and (w_in is not None or b is not None)
    if xb is not None:  # the input product, fused: x W_in^T + b from bfloat16 parts
        ix = input_product(xb.reshape(-1, xb.shape[-1]), w_in, b, prog)
        if ix is None:  # (torch has no bfloat16 products into float32 here: the same values in float32)
            ix = torch.nn.functional.linear(xb.reshape(-1, xb.shape[-1]).float(), w_in, b)
        ix = ix.reshape(*xb.shape[:-1], w_in.shape[0])
    elif w_in is not None:
        ix = torch.nn.functional.linear(x, w_in, b)
    else:
        ix = x if b is None else x + b
    outs, fins, S, saved = prog.forward(ix, w, s0, inputs, states, params, save, s0_exact=s0_exact,
                                        **({"noise": noise} if noise is not None else {}))
    if not save:
        return outs, fins, None
    return outs, fins, saved_of(prog, x, w, w_in, xb, linear, S, saved, dense, s0_exact)


def saved_of(prog: RecurrentProgram, x, w, w_in, xb, linear: bool, S: torch.Tensor, saved: Any, dense: bool,
           s0_exact: bool | None) -> Saved:
    # S (s0, then the spikes) exact in bfloat16: the spikes are, s0 unless given other values
    # (s0_exact was decided wherever this can hold: w and s0 share device and dtype)
    s_exact = bool(prog.binary and dense and fast_products(w) and s0_exact)
    return Saved(S.shape[0] - 1, saved, S, w, w_in, x if linear and w_in is not None else None, xb, s_exact, linear)


def restore(prog: RecurrentProgram, x, w, s0, w_in, b, kept: Sequence[torch.Tensor], inputs, states, params,
            dense: bool, noise: NoiseKey | None) -> Saved:
    """What `forward(..., save=True)` gave, from what it kept (`kept`: S, then the program's
    `saved_tensors`) and the call's own arguments: the backward of the layer's custom op, whose
    forward returned them (`recurrent_ops`). The values `forward` derived from the arguments
    (x in bfloat16, whether s0 is exact in it) are derived again, the same way."""
    xb = exact_bf16(x, prog) if w_in is not None and fusable(x, w_in, b) else None
    s0_exact = exact_in_bf16(s0, prog) if prog.binary and dense and fast_products(s0) else None
    S = kept[0]
    saved = prog.restore(list(kept[1:]), inputs, params, S[0], noise)
    linear = xb is None and (w_in is not None or b is not None)
    return saved_of(prog, x, w, w_in, xb, linear, S, saved, dense, s0_exact)


def backward(prog: RecurrentProgram, sv: Saved, inputs, states, params, dense: bool, grads, need) -> list:
    """The gradients of (x, w, s0, w_in, b, *the tensors of inputs, states and params) where
    `need` says (None elsewhere): BPTT by the program, then the products that follow from `gI`."""
    n_x, n_w, n_s0, n_win, n_b, *need_t = need
    w, S, w_in = sv.w, sv.S, sv.w_in
    n_st = len(states)
    g_outs, g_fins = grads[:len(grads) - n_st], grads[len(grads) - n_st:]
    for g in grads:  # (a loop, not a generator: no Python call per gradient)
        if g is not None:
            break
    else:
        return [None] * (5 + len(need_t))
    kinds = tensor_kinds(inputs, states, params)
    req: dict[str, Any] = {"T": sv.T, "inputs": [False] * len(inputs), "states": [False] * len(states),
                           "params": [False] * len(params),
                           "parts": fast_products(w) and dense and prog.binary and (n_w or n_win)}
    for (kind, k), n in zip(kinds, need_t):
        req[kind + "s"][k] = bool(n)
    gI, g_in, g_st, g_pr, extra = prog.backward(sv.saved, w, g_outs, g_fins, req)
    parts, sb = extra.get("parts"), extra.get("sb")
    H = w.shape[0]
    gflat = gI.reshape(-1, H)
    pflat = parts.reshape(3, -1, H) if parts is not None else None
    gw = gs0 = gx = gwin = gb = None
    if n_w:  # (S, or the program's shadow of it; S may be kept as bits: `packed.value`)
        if dense:
            prev = (sb if sb is not None else packed.value(S))[:-1].reshape(-1, H)
            gw = weight_grad(gflat, prev, sv.s_exact, pflat)
        else:
            gw = (gflat * packed.value(S)[:-1].reshape(-1, H)).sum(0)
    if n_s0:
        gs0 = gI[0].mm(w) if dense else gI[0] * w
    xk = packed.value(sv.xb if sv.xb is not None else sv.x)  # (the input the product was made of, if made here)
    if xk is not None and w_in is not None:
        x2 = xk.reshape(-1, xk.shape[-1])
        if n_win:
            gwin = weight_grad(gflat, x2, sv.xb is not None, pflat)
        if n_x:
            gx = gI.matmul(w_in)
    elif n_x:
        gx = gI
    if n_b and (sv.xb is not None or sv.linear):
        gb = gflat.sum(0)
    by = {"input": g_in, "state": g_st, "param": g_pr}
    rest = [by[kind][k] if n else None for (kind, k), n in zip(kinds, need_t)]
    return [gx, gw, gs0, gwin, gb, *rest]


def tensor_kinds(inputs, states, params) -> list[tuple[str, int]]:
    """(kind, index) of each tensor among the inputs, states and params, in that order."""
    return [("input", k) for k, v in enumerate(inputs) if isinstance(v, torch.Tensor)] + \
        [("state", k) for k, v in enumerate(states) if isinstance(v, torch.Tensor)] + \
        [("param", k) for k, v in enumerate(params) if isinstance(v, torch.Tensor)]


def first_order() -> None:
    raise FlexDSLError("second derivatives through a recurrent layer are not available: its backward is the "
                       "model's derived first-order backward", "<flexdsl.recurrent>",
                       hint="differentiate once (without create_graph=True)")


__all__ = ["MM32", "Saved", "backward", "bf16_products", "fast_products", "first_order", "forward", "fusable", "input_product",
           "linear", "restore", "saved_of", "split3", "tensor_kinds", "weight_grad"]
