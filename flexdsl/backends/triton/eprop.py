"""e-prop's per-synapse eligibility in one Triton kernel (`runtime/eprop.py` describes the recursion):

    eps[f, i, p, :] <- J[t, f, i] @ eps[f, i, p, :] + b[t, f, i, :] * pre[t, f, p]         (every step t)
    g[f, i, p]      += A[t, f, i, :] . eps[f, i, p, :] (before the step) + Lg[t, f, i] * pre[t, f, p]

for a batch element `f`, a postsynaptic neuron `i` and a presynaptic value `p` (an input, the fed-back
source of the step before, 1 for the bias). A program owns a tile of synapses of one batch element
and keeps their eligibility in registers from the first step to the last: per step it reads only
the tile's factors (`J`, `b`, `A`, `Lg`: per neuron) and presynaptic values, never the
`[batch, hidden, pre, states]` eligibility itself (read once at the start, written once at the
end). `ACC`: with the learning signal (`A = L c`, `Lg = L g`), the gradient per batch element,
summed over it by the caller (no atomics: the same bits every run).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pre(x_ptr, s_ptr, row, p, pm, NX, NS, ONE: tl.constexpr):
    """A step's presynaptic values `[BP]`: the input, the source of the step before, 1 (the bias)."""
    pre = tl.load(x_ptr + row.to(tl.int64) * NX + p, mask=pm & (p < NX), other=0.0).to(tl.float32)
    pre += tl.load(s_ptr + row.to(tl.int64) * NS + (p - NX), mask=pm & (p >= NX) & (p < NX + NS),
                   other=0.0).to(tl.float32)
    if ONE:
        pre = tl.where(p == NX + NS, 1.0, pre)
    return pre


@triton.jit
def _walk(eps_ptr, out_ptr, J_ptr, b_ptr, x_ptr, s_ptr, A_ptr, Lg_ptr, g_ptr,
          T, F, H, NX, NS, P,
          D: tl.constexpr, ACC: tl.constexpr, ONE: tl.constexpr, BI: tl.constexpr, BP: tl.constexpr,
          STAGES: tl.constexpr):
    pid_p, pid_i, f = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i = pid_i * BI + tl.arange(0, BI)
    p = pid_p * BP + tl.arange(0, BP)
    k = tl.arange(0, D)
    im, pm = i < H, p < P
    i3, p3, k3 = i[:, None, None], p[None, :, None], k[None, None, :]
    m3 = im[:, None, None] & pm[None, :, None]
    eoff = ((f * H + i3).to(tl.int64) * P + p3) * D + k3
    eps = tl.load(eps_ptr + eoff, mask=m3, other=0.0).to(tl.float32)  # [BI, BP, D]
    acc = tl.zeros([BI, BP], dtype=tl.float32)
    for t in tl.range(0, T, num_stages=STAGES):
        row = t * F + f
        pre = _pre(x_ptr, s_ptr, row, p, pm, NX, NS, ONE)
        nb = (row * H + i).to(tl.int64)  # [BI]
        if ACC:
            A = tl.load(A_ptr + nb[:, None] * D + k[None, :], mask=im[:, None], other=0.0).to(tl.float32)
            Lg = tl.load(Lg_ptr + nb, mask=im, other=0.0).to(tl.float32)
            acc += tl.sum(A[:, None, :] * eps, axis=2) + Lg[:, None] * pre[None, :]
        b = tl.load(b_ptr + nb[:, None] * D + k[None, :], mask=im[:, None], other=0.0).to(tl.float32)  # [BI, D]
        Jt = tl.load(J_ptr + (nb[:, None, None] * D + k[None, :, None]) * D + k[None, None, :],
                     mask=im[:, None, None], other=0.0).to(tl.float32)  # [BI, D (k), D (l)]
        eps = tl.sum(Jt[:, None, :, :] * eps[:, :, None, :], axis=3) + b[:, None, :] * pre[None, :, None]
    tl.store(out_ptr + eoff, eps.to(out_ptr.dtype.element_ty), mask=m3)
    if ACC:
        goff = (f * H + i[:, None]).to(tl.int64) * P + p[None, :]
        tl.store(g_ptr + goff, acc, mask=im[:, None] & pm[None, :])


TILE: dict[int, tuple[int, int, int, int]] = {1: (16, 128, 4, 4), 2: (16, 64, 2, 3)}  # states (padded) ->
# (BI, BP, warps, stages: the steps whose loads are in flight), the fastest on an H200 (bench/eprop_profile.py)


@triton.jit
def _walk12(eps_ptr, out_ptr, J_ptr, b_ptr, x_ptr, s_ptr, A_ptr, Lg_ptr, g_ptr,
            T, F, H, NX, NS, P,
            TWO: tl.constexpr, ACC: tl.constexpr, ONE: tl.constexpr, BI: tl.constexpr, BP: tl.constexpr,
            STAGES: tl.constexpr):
    """`_walk` for one or two states (`TWO`), each state's tile a 2-d block of its own."""
    pid_p, pid_i, f = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i = pid_i * BI + tl.arange(0, BI)
    p = pid_p * BP + tl.arange(0, BP)
    im, pm = i < H, p < P
    m2 = im[:, None] & pm[None, :]
    D: tl.constexpr = 2 if TWO else 1
    eoff = ((f * H + i[:, None]).to(tl.int64) * P + p[None, :]) * D
    e0 = tl.load(eps_ptr + eoff, mask=m2, other=0.0).to(tl.float32)
    e1 = tl.zeros([BI, BP], dtype=tl.float32)
    if TWO:
        e1 = tl.load(eps_ptr + eoff + 1, mask=m2, other=0.0).to(tl.float32)
    acc = tl.zeros([BI, BP], dtype=tl.float32)
    for t in tl.range(0, T, num_stages=STAGES):
        row = t * F + f
        pre = _pre(x_ptr, s_ptr, row, p, pm, NX, NS, ONE)
        nb = (row * H + i).to(tl.int64)
        if ACC:
            a0 = tl.load(A_ptr + nb * D, mask=im, other=0.0).to(tl.float32)
            lg = tl.load(Lg_ptr + nb, mask=im, other=0.0).to(tl.float32)
            acc += a0[:, None] * e0 + lg[:, None] * pre[None, :]
            if TWO:
                a1 = tl.load(A_ptr + nb * D + 1, mask=im, other=0.0).to(tl.float32)
                acc += a1[:, None] * e1
        j00 = tl.load(J_ptr + nb * D * D, mask=im, other=0.0).to(tl.float32)
        b0 = tl.load(b_ptr + nb * D, mask=im, other=0.0).to(tl.float32)
        if TWO:
            j01 = tl.load(J_ptr + nb * 4 + 1, mask=im, other=0.0).to(tl.float32)
            j10 = tl.load(J_ptr + nb * 4 + 2, mask=im, other=0.0).to(tl.float32)
            j11 = tl.load(J_ptr + nb * 4 + 3, mask=im, other=0.0).to(tl.float32)
            b1 = tl.load(b_ptr + nb * 2 + 1, mask=im, other=0.0).to(tl.float32)
            n0 = j00[:, None] * e0 + j01[:, None] * e1 + b0[:, None] * pre[None, :]
            e1 = j10[:, None] * e0 + j11[:, None] * e1 + b1[:, None] * pre[None, :]
            e0 = n0
        else:
            e0 = j00[:, None] * e0 + b0[:, None] * pre[None, :]
    tl.store(out_ptr + eoff, e0.to(out_ptr.dtype.element_ty), mask=m2)
    if TWO:
        tl.store(out_ptr + eoff + 1, e1.to(out_ptr.dtype.element_ty), mask=m2)
    if ACC:
        goff = (f * H + i[:, None]).to(tl.int64) * P + p[None, :]
        tl.store(g_ptr + goff, acc, mask=m2)


def walk(eps: torch.Tensor, J: torch.Tensor, b: torch.Tensor, x: torch.Tensor | None, s: torch.Tensor | None,
         one: bool, A: torch.Tensor | None = None, Lg: torch.Tensor | None = None, tile: tuple[int, int, int, int] | None = None
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The eligibility after the call's steps (`[F, H, P, D]`) and, with `A` and `Lg`, the gradient
    `[H, P]` (float32 sums, in `eps`'s dtype). `J` `[T, F, H, D, D]`, `b` and `A` `[T, F, H, D]`,
    `Lg` `[T, F, H]`; presynaptic values `x` `[T, F, NX]`, `s` `[T, F, NS]` (the source before each
    step), then 1 if `one`: `P = NX + NS + one`."""
    F, H, P, D = eps.shape
    T = J.shape[0]
    dev, dt = eps.device, eps.dtype
    empty = torch.zeros(1, device=dev, dtype=dt)
    NX = x.shape[-1] if x is not None else 0
    NS = s.shape[-1] if s is not None else 0
    assert P == NX + NS + int(one)
    eps = eps.contiguous()
    out = torch.empty_like(eps)
    acc = A is not None
    g = torch.empty((F, H, P), device=dev, dtype=torch.float32) if acc else empty
    BI, BP, warps, STAGES = tile or TILE.get(D, (16, 32, 4, 1))
    grid = (triton.cdiv(P, BP), triton.cdiv(H, BI), F)
    args = (eps, out, J.contiguous(), b.contiguous(), x.contiguous() if x is not None else empty,
            s.contiguous() if s is not None else empty, A.contiguous() if acc else empty,
            Lg.contiguous() if acc else empty, g, T, F, H, NX, NS, P)
    if D <= 2:  # (one or two states: a 2-d tile each)
        _walk12[grid](*args, TWO=D == 2, ACC=acc, ONE=one, BI=BI, BP=BP, STAGES=STAGES, num_warps=warps)
    else:
        _walk[grid](*args, D=D, ACC=acc, ONE=one, BI=BI, BP=BP, STAGES=STAGES, num_warps=warps)
    return out, (g.sum(0).to(dt) if acc else None)


__all__ = ["walk"]
