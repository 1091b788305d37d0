"""Sparse synaptic delays in Triton kernels: a synapse group whose every connection (i, j) reads its
presynaptic value at one or two whole steps back, `out[t, n, i] = sum_j a[i, j] h[D + t - d[i, j], n, j]
+ c[i, j] h[D + t - d[i, j] - 1, n, j]` (fixed delays: `a = W`, `c = 0`; the linear relaxation of
learnable ones: `d = floor`, `a = W (1 - f)`, `c = W f`), `h` the history of the input `[D + T, N, J]`.
No `[n_post, n_pre, D + 1]` kernel is formed: each program gathers its rows from the history
(one read per connection and step, float32 accumulation). Three kernels: the current, the
history's gradient (the same gather from the output's gradient, the other way round), and the
gradients of `a` and `c` (a sum over steps and batch per connection); `SparseDelays` is their
autograd Function, what `TritonBackend.delay_product` runs.

Dense relaxed synaptic delays (learnable gauss ones): `dense_delays.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernel import cdiv, next_pow2
from .kernel import first_order as _first_order


def first_order(op: str) -> None:
    """A delay kernel's backward under create_graph=True: a located error (`kernel.first_order`)."""
    _first_order(op, "<flexdsl.delays>", "use backend='torch' for this layer (its delays' backward is "
                 "differentiable), or differentiate once (without create_graph=True)")


@triton.jit
def _current(h_ptr, d_ptr, a_ptr, c_ptr, out_ptr, T, N, J, I, D, L,
             TWO: tl.constexpr, BR: tl.constexpr, BI: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)  # rows t * N + n
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    rm, im = r < T * N, i < I
    t, n = r // N, (r % N).to(tl.int64)  # (offsets in int64: a history past 2**31 values)
    m = rm[:, None] & im[None, :]
    acc = tl.zeros([BR, BI], dtype=tl.float32)
    for j in range(J):
        d0 = tl.load(d_ptr + i * J + j, mask=im, other=0)
        a = tl.load(a_ptr + i * J + j, mask=im, other=0.0).to(tl.float32)
        row = (D + t[:, None] - d0[None, :]).to(tl.int64)
        base = h_ptr + tl.cast(j, tl.int64) * L * N + n[:, None]
        acc += tl.load(base + row * N, mask=m, other=0.0).to(tl.float32) * a[None, :]
        if TWO:
            c = tl.load(c_ptr + i * J + j, mask=im, other=0.0).to(tl.float32)
            acc += tl.load(base + (row - 1) * N, mask=m & (row >= 1), other=0.0).to(tl.float32) * c[None, :]
    tl.store(out_ptr + r.to(tl.int64)[:, None] * I + i[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _history_grad(g_ptr, d_ptr, a_ptr, c_ptr, gh_ptr, T, N, J, I, D, L,
                  TWO: tl.constexpr, BR: tl.constexpr, BJ: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)  # rows s * N + n of the history
    j = tl.program_id(1) * BJ + tl.arange(0, BJ)
    rm, jm = r < L * N, j < J
    s, n = r // N, (r % N).to(tl.int64)
    m = rm[:, None] & jm[None, :]
    acc = tl.zeros([BR, BJ], dtype=tl.float32)
    for i in range(I):
        d0 = tl.load(d_ptr + i * J + j, mask=jm, other=0)
        a = tl.load(a_ptr + i * J + j, mask=jm, other=0.0).to(tl.float32)
        tt = (s[:, None] - D + d0[None, :]).to(tl.int64)  # the output step that read history row s
        base = g_ptr + tl.cast(i, tl.int64) * T * N + n[:, None]
        acc += tl.load(base + tt * N, mask=m & (tt >= 0) & (tt < T), other=0.0).to(tl.float32) * a[None, :]
        if TWO:
            c = tl.load(c_ptr + i * J + j, mask=jm, other=0.0).to(tl.float32)
            t1 = tt + 1
            acc += tl.load(base + t1 * N, mask=m & (t1 >= 0) & (t1 < T), other=0.0).to(tl.float32) * c[None, :]
    tl.store(gh_ptr + r.to(tl.int64)[:, None] * J + j[None, :], acc.to(gh_ptr.dtype.element_ty), mask=m)


@triton.jit
def _weight_grad(g_ptr, h_ptr, d_ptr, ga_ptr, gc_ptr, T, N, J, D, L,
                 TWO: tl.constexpr, BR: tl.constexpr, BJ: tl.constexpr):
    i = tl.program_id(0)
    j = tl.program_id(1) * BJ + tl.arange(0, BJ)
    jm = j < J
    d0 = tl.load(d_ptr + i * J + j, mask=jm, other=0)
    acc_a = tl.zeros([BJ], dtype=tl.float32)
    acc_c = tl.zeros([BJ], dtype=tl.float32)
    for r0 in range(0, T * N, BR):
        r = r0 + tl.arange(0, BR)
        rm = r < T * N
        t, n = r // N, (r % N).to(tl.int64)
        g = tl.load(g_ptr + tl.cast(i, tl.int64) * T * N + r, mask=rm, other=0.0).to(tl.float32)
        row = (D + t[:, None] - d0[None, :]).to(tl.int64)
        base = h_ptr + j.to(tl.int64)[None, :] * L * N + n[:, None]
        m = rm[:, None] & jm[None, :]
        acc_a += tl.sum(tl.load(base + row * N, mask=m, other=0.0).to(tl.float32) * g[:, None], axis=0)
        if TWO:
            h1 = tl.load(base + (row - 1) * N, mask=m & (row >= 1), other=0.0).to(tl.float32)
            acc_c += tl.sum(h1 * g[:, None], axis=0)
    tl.store(ga_ptr + i * J + j, acc_a, mask=jm)
    if TWO:
        tl.store(gc_ptr + i * J + j, acc_c, mask=jm)


BR, BI, BJ = 64, 32, 32


class SparseDelays(torch.autograd.Function):
    """`out [T, N, I]` from the history `hist [D + T, N, J]`, whole-step delays `d [I, J]` (long)
    and the weights of the step `d` back, `a [I, J]`, and of the step before it, `c` (None: one step)."""

    @staticmethod
    def forward(ctx, hist: torch.Tensor, d: torch.Tensor, a: torch.Tensor, c: torch.Tensor | None, D: int
                ) -> torch.Tensor:
        L, N, J = hist.shape
        T, I = L - D, a.shape[0]
        hT = hist.permute(2, 0, 1).contiguous()  # [J, L, N]: a step's batch is contiguous
        d32 = d.to(torch.int32).contiguous()
        a_, c_ = a.contiguous(), (c if c is not None else a).contiguous()
        out = torch.empty((T, N, I), device=hist.device, dtype=hist.dtype)
        if T * N and I:
            _current[(cdiv(T * N, BR), cdiv(I, BI))](hT, d32, a_, c_, out, T, N, J, I, D, L,
                                                                  TWO=c is not None, BR=BR, BI=BI)
        ctx.save_for_backward(hT, d32, a_, c_)
        ctx.dims, ctx.two = (T, N, J, I, D, L), c is not None
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        first_order("synaptic delays")
        hT, d32, a, c = ctx.saved_tensors
        T, N, J, I, D, L = ctx.dims
        gT = g.permute(2, 0, 1).contiguous()  # [I, T, N]
        gh = ga = gc = None
        if ctx.needs_input_grad[0]:
            gh = torch.zeros((L, N, J), device=g.device, dtype=hT.dtype)
            if L * N and J:
                _history_grad[(cdiv(L * N, BR), cdiv(J, BJ))](gT, d32, a, c, gh, T, N, J, I, D, L,
                                                                           TWO=ctx.two, BR=BR, BJ=BJ)
        if ctx.needs_input_grad[2] or (ctx.two and ctx.needs_input_grad[3]):
            ga = torch.zeros((I, J), device=g.device, dtype=torch.float32)
            gc = torch.zeros((I, J), device=g.device, dtype=torch.float32) if ctx.two else ga
            if I and J:
                _weight_grad[(I, cdiv(J, BJ))](gT, hT, d32, ga, gc, T, N, J, D, L,
                                                     TWO=ctx.two, BR=BR, BJ=BJ)
            ga, gc = ga.to(a.dtype), (gc.to(c.dtype) if ctx.two else None)
        return gh, None, ga, gc, None


# ---------------------------------------------------------------------------- per-element relaxed delays
# `out[t, m] = sum_k g[m % C, k] h[D + t - k, m]` over the history `h [L = D + T, M]` as it lies (time
# first, a lane m = n * C + c), the taps `g [C, K = D + 1]` per channel: a learnable axonal (or dendritic,
# one-to-one) delay's Gaussian relaxation, read in place (no transposing copy, no depthwise convolution).


@triton.jit
def _spread_fwd(h_ptr, g_ptr, out_ptr, T, M, C, D, BT: tl.constexpr, BM: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    tm, mm = t < T, m < M
    c = m % C
    mask = tm[:, None] & mm[None, :]
    acc = tl.zeros([BT, BM], dtype=tl.float32)
    for k in range(0, D + 1):
        w = tl.load(g_ptr + c * (D + 1) + k, mask=mm, other=0.0).to(tl.float32)
        row = (D + t - k).to(tl.int64)
        acc += tl.load(h_ptr + row[:, None] * M + m[None, :], mask=mask, other=0.0).to(tl.float32) * w[None, :]
    tl.store(out_ptr + t.to(tl.int64)[:, None] * M + m[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _spread_hist_grad(go_ptr, g_ptr, gh_ptr, T, M, C, D, BT: tl.constexpr, BM: tl.constexpr):
    s = tl.program_id(0) * BT + tl.arange(0, BT)  # history rows
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    sm, mm = s < T + D, m < M
    c = m % C
    acc = tl.zeros([BT, BM], dtype=tl.float32)
    for k in range(0, D + 1):
        w = tl.load(g_ptr + c * (D + 1) + k, mask=mm, other=0.0).to(tl.float32)
        t = s - D + k  # the output step that read row s through tap k
        ok = sm & (t >= 0) & (t < T)
        acc += tl.load(go_ptr + t.to(tl.int64)[:, None] * M + m[None, :], mask=ok[:, None] & mm[None, :],
                       other=0.0).to(tl.float32) * w[None, :]
    tl.store(gh_ptr + s.to(tl.int64)[:, None] * M + m[None, :], acc.to(gh_ptr.dtype.element_ty),
             mask=sm[:, None] & mm[None, :])


@triton.jit
def _spread_tap_grad(go_ptr, h_ptr, part_ptr, T, M, D, BT: tl.constexpr, BM: tl.constexpr, KP: tl.constexpr):
    """`part[b, k, m] = sum_{t in block b} go[t, m] h[D + t - k, m]`: a block of steps, every tap."""
    b = tl.program_id(0)
    t = b * BT + tl.arange(0, BT)
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    tm, mm = t < T, m < M
    mask = tm[:, None] & mm[None, :]
    go = tl.load(go_ptr + t.to(tl.int64)[:, None] * M + m[None, :], mask=mask, other=0.0).to(tl.float32)
    kk = tl.arange(0, KP)
    acc = tl.zeros([KP, BM], dtype=tl.float32)
    for k in range(0, D + 1):
        row = (D + t - k).to(tl.int64)
        h = tl.load(h_ptr + row[:, None] * M + m[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += tl.where(kk[:, None] == k, tl.sum(go * h, axis=0)[None, :], 0.0)
    base = (b * (D + 1)).to(tl.int64) * M
    tl.store(part_ptr + base + kk.to(tl.int64)[:, None] * M + m[None, :], acc,
             mask=(kk[:, None] <= D) & mm[None, :])


ST, SM = 32, 128  # the spread kernels' tiles: steps x lanes


class Spread(torch.autograd.Function):
    """`out [T, M]` from the history `h [D + T, M]` and per-channel taps `g [C, D + 1]` (lane m's
    channel m % C); gradients of both (the taps' summed over steps and the lanes of a channel)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        L, M = h.shape
        C, K = g.shape
        D = K - 1
        T = L - D
        h, g = h.contiguous(), g.contiguous()
        out = torch.empty((T, M), device=h.device, dtype=h.dtype)
        if T and M:
            _spread_fwd[(cdiv(T, ST), cdiv(M, SM))](h, g, out, T, M, C, D, BT=ST, BM=SM)
        ctx.save_for_backward(h, g)
        return out

    @staticmethod
    def backward(ctx, go: torch.Tensor):
        first_order("relaxed per-neuron delays")
        h, g = ctx.saved_tensors
        L, M = h.shape
        C, K = g.shape
        D = K - 1
        T = L - D
        go = go.contiguous()
        gh = gg = None
        if ctx.needs_input_grad[0]:
            gh = torch.empty_like(h)
            if L and M:
                _spread_hist_grad[(cdiv(L, ST), cdiv(M, SM))](go, g, gh, T, M, C, D, BT=ST, BM=SM)
        if ctx.needs_input_grad[1]:
            nb = cdiv(T, ST)
            part = torch.empty((nb, K, M), device=h.device, dtype=torch.float32)
            if T and M:
                _spread_tap_grad[(nb, cdiv(M, SM))](go, h, part, T, M, D, BT=ST, BM=SM,
                                                           KP=next_pow2(K))
            gg = part.sum(0).view(K, M // C, C).sum(1).t().to(g.dtype)  # ([C, K]: over blocks and a channel's lanes)
        return gh, gg


def delay_spread(hist: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """`out[t, ..., c] = sum_k g[c, k] hist[D + t - k, ..., c]` (`hist [D + T, ..., C]`, `g [C, D + 1]`):
    per-element relaxed delays, the history read as it lies."""
    L = hist.shape[0]
    out = Spread.apply(hist.reshape(L, -1), g)
    return out.view(L - g.shape[1] + 1, *hist.shape[1:])


def delay_product(hist: torch.Tensor, d: torch.Tensor, a: torch.Tensor, c: torch.Tensor | None, D: int
                  ) -> torch.Tensor:
    """The delayed current `[T, *batch, I]` of `hist [D + T, *batch, J]` (see the module doc)."""
    L, J = hist.shape[0], hist.shape[-1]
    h = hist.reshape(L, -1, J)
    out = SparseDelays.apply(h, d, a, c, D)
    return out.reshape(L - D, *hist.shape[1:-1], a.shape[0])


__all__ = ["SparseDelays", "Spread", "delay_product", "delay_spread", "first_order"]
