"""Sparse synaptic delays in Triton kernels: a synapse group whose every connection (i, j) reads its
presynaptic value at one or two whole steps back, `out[t, n, i] = sum_j a[i, j] h[D + t - d[i, j], n, j]
+ c[i, j] h[D + t - d[i, j] - 1, n, j]` (fixed delays: `a = W`, `c = 0`; the linear relaxation of
learnable ones: `d = floor`, `a = W (1 - f)`, `c = W f`), `h` the history of the input `[D + T, N, J]`.
No `[n_post, n_pre, D + 1]` kernel is formed: each program gathers its rows from the history
(one read per connection and step, float32 accumulation). Three kernels: the current, the
history's gradient (the same gather from the output's gradient, the other way round), and the
gradients of `a` and `c` (a sum over steps and batch per connection); `SparseDelays` is their
autograd Function, what `TritonBackend.delay_product` runs.

Dense relaxed synaptic delays (`delay_conv`, learnable gauss ones: every connection reads every step
back with its own weight) are a convolution over time; with the history time-major (`[D + T, N, J]`,
a step's rows consecutive) tap `k`'s operand is the history's rows shifted by `(D - k) N`, so the
convolution is one matrix product over (tap, input) read in place: no transposing copy, no unfolded
input. Its products run on tensor cores as the convolution it replaces did (TF32 where
`torch.backends.cudnn.allow_tf32`, PyTorch's default for convolutions; else float32's accuracy).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import torch
import triton
import triton.language as tl

from .kernel import interpret

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # (an older Triton: the pointer kernels)
    TensorDescriptor = None


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
            _current[(triton.cdiv(T * N, BR), triton.cdiv(I, BI))](hT, d32, a_, c_, out, T, N, J, I, D, L,
                                                                  TWO=c is not None, BR=BR, BI=BI)
        ctx.save_for_backward(hT, d32, a_, c_)
        ctx.dims, ctx.two = (T, N, J, I, D, L), c is not None
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        hT, d32, a, c = ctx.saved_tensors
        T, N, J, I, D, L = ctx.dims
        gT = g.permute(2, 0, 1).contiguous()  # [I, T, N]
        gh = ga = gc = None
        if ctx.needs_input_grad[0]:
            gh = torch.zeros((L, N, J), device=g.device, dtype=hT.dtype)
            if L * N and J:
                _history_grad[(triton.cdiv(L * N, BR), triton.cdiv(J, BJ))](gT, d32, a, c, gh, T, N, J, I, D, L,
                                                                           TWO=ctx.two, BR=BR, BJ=BJ)
        if ctx.needs_input_grad[2] or (ctx.two and ctx.needs_input_grad[3]):
            ga = torch.zeros((I, J), device=g.device, dtype=torch.float32)
            gc = torch.zeros((I, J), device=g.device, dtype=torch.float32) if ctx.two else ga
            if I and J:
                _weight_grad[(I, triton.cdiv(J, BJ))](gT, hT, d32, ga, gc, T, N, J, D, L,
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
            _spread_fwd[(triton.cdiv(T, ST), triton.cdiv(M, SM))](h, g, out, T, M, C, D, BT=ST, BM=SM)
        ctx.save_for_backward(h, g)
        return out

    @staticmethod
    def backward(ctx, go: torch.Tensor):
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
                _spread_hist_grad[(triton.cdiv(L, ST), triton.cdiv(M, SM))](go, g, gh, T, M, C, D, BT=ST, BM=SM)
        if ctx.needs_input_grad[1]:
            nb = triton.cdiv(T, ST)
            part = torch.empty((nb, K, M), device=h.device, dtype=torch.float32)
            if T and M:
                _spread_tap_grad[(nb, triton.cdiv(M, SM))](go, h, part, T, M, D, BT=ST, BM=SM,
                                                           KP=triton.next_power_of_2(K))
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


# ---------------------------------------------------------------------------- dense relaxed synaptic delays
# `out[t, n, i] = sum_k sum_j h[D + t - k, n, j] W[k, j, i]` over the time-major history `h [D + T, N, J]`:
# rows r = t N + n of the output read rows r + (D - k) N of the history for tap k: one product over
# (tap, input) with the operand's rows shifted per tap (`_shift_mm`); the history's gradient is the same
# product of the output's gradient shifted the other way (rows outside it read as 0); the taps' gradient
# `G[k] = h[(D - k) N : (D - k) N + T N]^T g` a product over the rows per tap (`_shift_mm_t`).


@triton.jit
def _shift_mm(a_ptr, b_ptr, c_ptr, M, NC, KI, A_ROWS, K, shift0, step, sbk, sbi, sbc,
              PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """`C[r, c] = sum_k sum_j A[r + shift0 + k step, j] B[k, j, c]` (A `[A_ROWS, KI]` row-major, rows
    outside it 0; B at strides sbk, sbi, sbc; C `[M, NC]` row-major)."""
    r = tl.program_id(0) * BM + tl.arange(0, BM)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    rm, cm = r < M, c < NC
    nkb = tl.cdiv(KI, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kk in range(0, K * nkb):
        k = kk // nkb
        j = (kk % nkb) * BK + tl.arange(0, BK)
        jm = j < KI
        ar = r + shift0 + k * step
        am = rm & (ar >= 0) & (ar < A_ROWS)
        a = tl.load(a_ptr + ar.to(tl.int64)[:, None] * KI + j[None, :], mask=am[:, None] & jm[None, :], other=0.0)
        b = tl.load(b_ptr + k.to(tl.int64) * sbk + j[:, None] * sbi + c[None, :] * sbc,
                    mask=jm[:, None] & cm[None, :], other=0.0)
        acc = tl.dot(a, b.to(a.dtype), acc, input_precision=PREC)
    tl.store(c_ptr + r.to(tl.int64)[:, None] * NC + c[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=rm[:, None] & cm[None, :])


@triton.jit
def _shift_mm_t(h_ptr, g_ptr, part_ptr, R, J, I, D, N, RS,
                PREC: tl.constexpr, BJ: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr):
    """`part[s, k, j, i] = sum_{r in split s} h[r + (D - k) N, j] g[r, i]` (rows r < R, RS a split)."""
    kj = tl.program_id(0)
    nj = tl.cdiv(J, BJ)
    k, jb = kj // nj, kj % nj
    j = jb * BJ + tl.arange(0, BJ)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    s = tl.program_id(2)
    jm, im = j < J, i < I
    acc = tl.zeros([BJ, BI], dtype=tl.float32)
    lo = s * RS
    for r0 in range(lo, tl.minimum(lo + RS, R), BK):
        r = r0 + tl.arange(0, BK)
        rmask = r < tl.minimum(lo + RS, R)
        hr = (r + (D - k) * N).to(tl.int64)
        h = tl.load(h_ptr + hr[None, :] * J + j[:, None], mask=jm[:, None] & rmask[None, :], other=0.0)
        g = tl.load(g_ptr + r.to(tl.int64)[:, None] * I + i[None, :], mask=rmask[:, None] & im[None, :], other=0.0)
        acc = tl.dot(h, g.to(h.dtype), acc, input_precision=PREC)
    base = (s * (D + 1) + k).to(tl.int64) * J * I
    tl.store(part_ptr + base + j.to(tl.int64)[:, None] * I + i[None, :], acc, mask=jm[:, None] & im[None, :])


@triton.jit
def _shift_mm_tma(a_desc, b_desc, c_desc, KI, K, shift0, step,
                  PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """`_shift_mm` with block loads (Hopper's TMA; rows and columns outside the tensors read as 0, a
    store outside clipped): A `[rows, KI]` at rows shifted per tap, B^T `[K, NC, KI]` (K-major: what the
    tensor cores take without a transpose), C `[M, NC]`."""
    r0 = tl.program_id(0) * BM
    c0 = tl.program_id(1) * BN
    nkb = tl.cdiv(KI, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kk in range(0, K * nkb):
        k = kk // nkb
        j0 = (kk % nkb) * BK
        a = a_desc.load([r0 + shift0 + k * step, j0])
        b = b_desc.load([k, c0, j0]).reshape([BN, BK])
        acc = tl.dot(a, tl.trans(b.to(a.dtype)), acc, input_precision=PREC)
    c_desc.store([r0, c0], acc.to(c_desc.dtype))


@triton.jit
def _shift_mm_t_tma(ht_desc, gt_desc, part_desc, R, J, D, N, RS,
                    PREC: tl.constexpr, BJ: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr):
    """`_shift_mm_t` with block loads from the transposed history `hT [J, L N]` and gradient
    `gT [I, T N]` (both K-major), `part [splits * K, J, I]`."""
    kj = tl.program_id(0)
    nj = tl.cdiv(J, BJ)
    k, j0 = kj // nj, (kj % nj) * BJ
    i0 = tl.program_id(1) * BI
    s = tl.program_id(2)
    acc = tl.zeros([BJ, BI], dtype=tl.float32)
    lo = s * RS
    for r0 in range(lo, tl.minimum(lo + RS, R), BK):
        h = ht_desc.load([j0, r0 + (D - k) * N])
        g = gt_desc.load([i0, r0])
        acc = tl.dot(h, tl.trans(g.to(h.dtype)), acc, input_precision=PREC)
    part_desc.store([s * (D + 1) + k, j0, i0], acc.reshape([1, BJ, BI]))


def _tile(n: int) -> int:
    """A tile over `n` values: 128 or 64, whichever pads less (the larger on a tie), or the power of two
    holding a narrow `n` (at least 16: the tensor cores' smallest)."""
    if n <= 64:
        return max(16, triton.next_power_of_2(n))
    return min((128, 64), key=lambda b: (triton.cdiv(n, b) * b, -b))


def mm_config(rows: int, cols: int, inner: int) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, warps, stages) of `_shift_mm(_tma)` for a `[rows, cols]` output over `inner` values
    a tap (the best of a sweep on an H200 at the DCLS network's sizes, `bench/delays_conv_check.py`)."""
    return 128, _tile(cols), 32, 4, 4


def mmt_config(J: int, I: int) -> tuple[int, int, int, int, int]:
    """(BJ, BI, BK, warps, stages) of `_shift_mm_t(_tma)` for a `[J, I]` tap gradient."""
    return _tile(J), _tile(I), 32, 4, 4


def _precision(t: torch.Tensor) -> str:
    """TF32 where PyTorch's convolutions take it (`torch.backends.cudnn.allow_tf32`, on by default), else
    three TF32 products (float32's accuracy); 16-bit inputs as they are."""
    if t.dtype != torch.float32 or not t.is_cuda:
        return "ieee"
    return "tf32" if torch.backends.cudnn.allow_tf32 else "tf32x3"


TMA = os.environ.get("FLEXDSL_DELAY_TMA", "1") != "0"  # (0: the pointer kernels everywhere)


def _tma(*ts: torch.Tensor) -> bool:
    """Whether the block-load kernels run on `ts` (2-D or 3-D, last dim contiguous): a Hopper or later
    GPU (or Triton's interpreter), rows and bases 16-byte aligned."""
    if not TMA or TensorDescriptor is None:
        return False
    if ts[0].is_cuda and _major(ts[0].device.index or 0) < 9:
        return False
    if not ts[0].is_cuda and not interpret() or not _context(ts[0]):
        return False
    return all(t.stride(-1) == 1 and all(st * t.element_size() % 16 == 0 for st in t.stride()[:-1])
               and t.data_ptr() % 16 == 0 for t in ts)


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """`x.t()` copied, its rows padded to 16 bytes (a block load's stride; the padding never read)."""
    r, c = x.shape
    q = 16 // x.element_size()
    out = x.new_empty((c, -(-r // q) * q))[:, :r]
    out.copy_(x.t())
    return out


def _desc(t: torch.Tensor, block: list[int]) -> Any:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


_THREAD = threading.local()


def _context(t: torch.Tensor) -> bool:
    """Make sure this thread has a current CUDA context before block-load descriptors are made for `t`
    (Triton makes them on the host before its launcher would set one: the first call in a thread of
    its own, autograd's backward thread, otherwise fails); False where it cannot (the pointer kernels
    then)."""
    if not t.is_cuda or getattr(_THREAD, "ready", False):
        return True
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        ctx = ctypes.c_void_p()
        if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0:
            return False
        if not ctx.value:
            dev = ctypes.c_int()
            if (lib.cuDeviceGet(ctypes.byref(dev), t.device.index or 0) != 0
                    or lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0 or lib.cuCtxSetCurrent(ctx) != 0):
                return False
    except (OSError, AttributeError):
        return False
    _THREAD.ready = True
    return True


def conv_forward(h: torch.Tensor, Wc: torch.Tensor) -> torch.Tensor:
    """`out [T, N, I]` of the history `h [L, N, J]` (contiguous) and the taps' weights `Wc [K, J, I]`."""
    L, N, J = h.shape
    K, I = Wc.shape[0], Wc.shape[2]
    T = L - K + 1
    out = torch.empty((T, N, I), device=h.device, dtype=h.dtype)
    if T * N and I:
        bm, bn, bk, nw, st = mm_config(T * N, I, J)
        h2, o2 = h.view(L * N, J), out.view(T * N, I)
        Wt = Wc.transpose(1, 2).contiguous()  # [K, I, J]: K-major for the tensor cores
        if _tma(h2, o2, Wt):
            _shift_mm_tma[(triton.cdiv(T * N, bm), triton.cdiv(I, bn))](
                _desc(h2, [bm, bk]), _desc(Wt, [1, bn, bk]), _desc(o2, [bm, bn]), J, K, (K - 1) * N, -N,
                PREC=_precision(h), BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=st)
            return out
        _shift_mm[(triton.cdiv(T * N, bm), triton.cdiv(I, bn))](
            h, Wc, out, T * N, I, J, L * N, K, (K - 1) * N, -N, Wc.stride(0), Wc.stride(1), Wc.stride(2),
            PREC=_precision(h), BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=st)
    return out


def conv_history_grad(g: torch.Tensor, Wc: torch.Tensor, L: int) -> torch.Tensor:
    """The history's gradient `[L, N, J]` from the output's `g [T, N, I]` (contiguous)."""
    T, N, I = g.shape
    K, J = Wc.shape[0], Wc.shape[1]
    gh = torch.empty((L, N, J), device=g.device, dtype=g.dtype)
    if L * N and J:
        bm, bn, bk, nw, st = mm_config(L * N, J, I)
        g2, gh2 = g.view(T * N, I), gh.view(L * N, J)
        if _tma(g2, gh2, Wc):
            _shift_mm_tma[(triton.cdiv(L * N, bm), triton.cdiv(J, bn))](
                _desc(g2, [bm, bk]), _desc(Wc, [1, bn, bk]), _desc(gh2, [bm, bn]), I, K, -(K - 1) * N, N,
                PREC=_precision(g), BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=st)
            return gh
        _shift_mm[(triton.cdiv(L * N, bm), triton.cdiv(J, bn))](
            g, Wc, gh, L * N, J, I, T * N, K, -(K - 1) * N, N, Wc.stride(0), Wc.stride(2), Wc.stride(1),
            PREC=_precision(g), BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=st)
    return gh


def conv_weight_grad(h: torch.Tensor, g: torch.Tensor, K: int) -> torch.Tensor:
    """The taps' weights' gradient `[K, J, I]` (float32) from the history `h [L, N, J]` and `g [T, N, I]`:
    the rows split so that the products fill the card, the parts summed."""
    L, N, J = h.shape
    T, I = g.shape[0], g.shape[2]
    R = T * N
    bj, bi, bk, nw, st = mmt_config(J, I)
    tiles = K * triton.cdiv(J, bj) * triton.cdiv(I, bi)
    split = max(1, min(triton.cdiv(R, 2048), triton.cdiv(4 * _sms(h), max(tiles, 1))))
    rs = triton.cdiv(triton.cdiv(R, split), bk) * bk
    split = triton.cdiv(R, rs) if R else 1
    part = torch.empty((split, K, J, I), device=h.device, dtype=torch.float32)
    # (block loads of the transposed history start at a tap's row shift (D - k) N: 16-byte aligned)
    if R and J and I and N * h.element_size() % 16 == 0 and _tma(h.view(L * N, J), g.view(R, I),
                                                                  part.view(split * K, J, I)):
        hT, gT = _transposed(h.view(L * N, J)), _transposed(g.view(R, I))  # (K-major operands)
        if _tma(hT, gT):
            _shift_mm_t_tma[(K * triton.cdiv(J, bj), triton.cdiv(I, bi), split)](
                _desc(hT, [bj, bk]), _desc(gT, [bi, bk]), _desc(part.view(split * K, J, I), [1, bj, bi]),
                R, J, K - 1, N, rs, PREC=_precision(h), BJ=bj, BI=bi, BK=bk, num_warps=nw, num_stages=st)
            return part[0] if split == 1 else part.sum(0)
    if R and J and I:
        _shift_mm_t[(K * triton.cdiv(J, bj), triton.cdiv(I, bi), split)](
            h, g, part, R, J, I, K - 1, N, rs, PREC=_precision(h), BJ=bj, BI=bi, BK=bk, num_warps=nw, num_stages=st)
    else:
        part.zero_()
    return part[0] if split == 1 else part.sum(0)


class DenseDelays(torch.autograd.Function):
    """`out [T, N, I]` from the history `hist [D + T, N, J]` and the weights over the steps back
    `W [D + 1, J, I]` (`W[k, j, i]`: connection j -> i, k steps back); gradients of both."""

    @staticmethod
    def forward(ctx, hist: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        h, Wc = hist.contiguous(), W.to(hist.dtype).contiguous()
        ctx.save_for_backward(h, Wc)
        ctx.w_dtype = W.dtype
        return conv_forward(h, Wc)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        h, Wc = ctx.saved_tensors
        g = g.to(h.dtype).contiguous()
        gh = conv_history_grad(g, Wc, h.shape[0]) if ctx.needs_input_grad[0] else None
        gw = conv_weight_grad(h, g, Wc.shape[0]).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw


def _sms(t: torch.Tensor) -> int:
    return _props(t.device.index or 0)[1] if t.is_cuda else 4


def _major(index: int) -> int:
    return _props(index)[0]


@functools.cache
def _props(index: int) -> tuple[int, int]:
    """(compute capability's major, multiprocessors) of CUDA device `index` (asked once)."""
    p = torch.cuda.get_device_properties(index)
    return p.major, p.multi_processor_count


def delay_conv(hist: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """`out[t, ..., i] = sum_k sum_j W[k, j, i] hist[D + t - k, ..., j]` (`hist [D + T, ..., J]`,
    `W [D + 1, J, I]`): dense relaxed synaptic delays, the history read as it lies (see the module doc)."""
    L, J = hist.shape[0], hist.shape[-1]
    out = DenseDelays.apply(hist.reshape(L, -1, J), W)
    return out.view(L - W.shape[0] + 1, *hist.shape[1:-1], W.shape[2])


__all__ = ["DenseDelays", "SparseDelays", "Spread", "delay_conv", "delay_product", "delay_spread"]
