"""Dense relaxed synaptic delays in Triton kernels: learnable gauss synaptic delays, where every
connection (j -> i) reads every step back k with its own weight `W[k, j, i] = w[i, j] g_k(d[i, j])`
(`g` the normalized Gaussian over the steps, `runtime/delays.tap_weights`), a convolution over time.
With the history time-major (`[D + T, N, J]`, a step's rows consecutive) tap k's operand is the
history's rows shifted by `(D - k) N`, so the convolution is one matrix product over (tap, input)
read in place (`_shift_mm`): no transposing copy, no unfolded input, no cuDNN call. The history's
gradient is the same product of the output's gradient shifted the other way; the weights' gradient
a product over the rows per tap (`_shift_mm_t`). On Hopper and later (and in Triton's interpreter)
the operands are read by block loads (TMA, `*_tma`: K-major operands, what the tensor cores take
without a transpose); elsewhere, or for rows not 16-byte aligned, by pointers. The products run on
tensor cores as the convolution they replace did: TF32 where `torch.backends.cudnn.allow_tf32`
(PyTorch's default for convolutions), else three TF32 products (float32's accuracy).

`GaussDelays` (what `TritonBackend.delay_gauss` runs) also makes the taps' weights from `w` and `d`
in one kernel, in the two layouts the products read, and their gradients (to `w` and `d`) from the
weights' gradient in one more: a layer's delayed current is one autograd node. `DenseDelays` is the
product alone (any `W`).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from typing import Any

import torch
import triton
import triton.language as tl

from .delays import first_order
from .kernel import Launcher, cdiv, interpret, next_pow2

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # (an older Triton: the pointer kernels)
    TensorDescriptor = None

@triton.jit
def _shift_mm(a_ptr, b_ptr, c_ptr, M, NC, KI, A_ROWS, K, shift0, step, sbk, sbi, sbc,
              PREC: tl.constexpr, UP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
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
        if UP:  # (16-bit operands in float32: Triton's interpreter multiplies bfloat16 wrongly)
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b.to(a.dtype), acc, input_precision=PREC)
    tl.store(c_ptr + r.to(tl.int64)[:, None] * NC + c[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=rm[:, None] & cm[None, :])


@triton.jit
def _shift_mm_t(h_ptr, g_ptr, part_ptr, R, J, I, P, K, N, RS,
                PREC: tl.constexpr, UP: tl.constexpr, BJ: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr):
    """`part[s, k, j, i] = sum_{r in split s} h[r + (P - k) N, j] g[r, i]` (rows r < R, RS a split; rows
    of `h` before its first read as 0)."""
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
        hr = (r + (P - k) * N).to(tl.int64)
        h = tl.load(h_ptr + hr[None, :] * J + j[:, None], mask=jm[:, None] & (rmask & (hr >= 0))[None, :], other=0.0)
        g = tl.load(g_ptr + r.to(tl.int64)[:, None] * I + i[None, :], mask=rmask[:, None] & im[None, :], other=0.0)
        if UP:
            h, g = h.to(tl.float32), g.to(tl.float32)
        acc = tl.dot(h, g.to(h.dtype), acc, input_precision=PREC)
    base = (s * K + k).to(tl.int64) * J * I
    tl.store(part_ptr + base + j.to(tl.int64)[:, None] * I + i[None, :], acc, mask=jm[:, None] & im[None, :])


@triton.jit
def _shift_mm_tma(a_desc, b_desc, c_desc, KI, K, shift0, step,
                  PREC: tl.constexpr, UP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
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
        if UP:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b.to(a.dtype)), acc, input_precision=PREC)
    c_desc.store([r0, c0], acc.to(c_desc.dtype))


@triton.jit
def _shift_mm_t_tma(ht_desc, gt_desc, part_desc, R, J, P, K, N, RS,
                    PREC: tl.constexpr, UP: tl.constexpr, BJ: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr):
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
        h = ht_desc.load([j0, r0 + (P - k) * N])
        g = gt_desc.load([i0, r0])
        if UP:
            h, g = h.to(tl.float32), g.to(tl.float32)
        acc = tl.dot(h, tl.trans(g.to(h.dtype)), acc, input_precision=PREC)
    part_desc.store([s * K + k, j0, i0], acc.reshape([1, BJ, BI]))


def _tile(n: int) -> int:
    """A tile over `n` values: 128 or 64, whichever pads less (the larger on a tie), or the power of two
    holding a narrow `n` (at least 16: the tensor cores' smallest)."""
    if n <= 64:
        return max(16, next_pow2(n))
    return min((128, 64), key=lambda b: (cdiv(n, b) * b, -b))


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


def _up(t: torch.Tensor) -> bool:
    """Whether the products take 16-bit operands in float32: in Triton's interpreter (whose bfloat16
    products are wrong); on a GPU they run on the tensor cores as they are."""
    return t.element_size() < 4 and not t.is_cuda


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


def _shifted_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, shift0: int, step: int) -> None:
    """`out[r, c] = sum_k sum_j a[r + shift0 + k step, j] b[k, c, j]` (`a [rows, KI]`, rows outside it 0;
    `b [K, NC, KI]` K-major; `out [M, NC]`; all contiguous): block loads where they run, else pointers."""
    (M, NC), KI, K = out.shape, a.shape[1], b.shape[0]
    if not (M and NC):
        return
    bm, bn, bk, nw, st = mm_config(M, NC, KI)
    grid = (cdiv(M, bm), cdiv(NC, bn))
    if _tma(a, out, b):
        _MM_TMA(grid, nw, st, a_desc=_desc(a, [bm, bk]), b_desc=_desc(b, [1, bn, bk]), c_desc=_desc(out, [bm, bn]),
                KI=KI, K=K, shift0=shift0, step=step, PREC=_precision(a), UP=_up(a), BM=bm, BN=bn, BK=bk)
        return
    _MM(grid, nw, st, a_ptr=a, b_ptr=b, c_ptr=out, M=M, NC=NC, KI=KI, A_ROWS=a.shape[0], K=K, shift0=shift0,
        step=step, sbk=b.stride(0), sbi=b.stride(2), sbc=b.stride(1), PREC=_precision(a), UP=_up(a), BM=bm, BN=bn,
        BK=bk)


def conv_forward(h: torch.Tensor, Wt: torch.Tensor, P: int) -> torch.Tensor:
    """`out [T, N, I]` of the history `h [L = P + T, N, J]` (contiguous; its first P steps before the
    output's, the steps before those 0) and the taps' weights K-major, `Wt [K, I, J]` (`Wt[k, i, j]`:
    connection j -> i, k steps back; contiguous)."""
    L, N, J = h.shape
    T = L - P
    out = torch.empty((T, N, Wt.shape[1]), device=h.device, dtype=h.dtype)
    _shifted_product(h.view(L * N, J), Wt, out.view(T * N, Wt.shape[1]), P * N, -N)
    return out


def conv_history_grad(g: torch.Tensor, Wc: torch.Tensor, L: int, P: int) -> torch.Tensor:
    """The history's gradient `[L = P + T, N, J]` from the output's `g [T, N, I]` (contiguous) and the
    taps' weights `Wc [K, J, I]` (contiguous: K-major for this product)."""
    T, N, I = g.shape
    gh = torch.empty((L, N, Wc.shape[1]), device=g.device, dtype=g.dtype)
    if not T * N:  # (no output step read the history: a zero gradient, no kernel)
        return gh.zero_()
    _shifted_product(g.view(T * N, I), Wc, gh.view(L * N, Wc.shape[1]), -P * N, N)
    return gh


def conv_weight_parts(h: torch.Tensor, g: torch.Tensor, K: int, P: int) -> torch.Tensor:
    """The taps' weights' gradient in parts, `[S, K, J, I]` float32 (their sum the gradient), from the
    history `h [L = P + T, N, J]` and `g [T, N, I]`: the rows split in S parts so that the products fill
    the card."""
    L, N, J = h.shape
    T, I = g.shape[0], g.shape[2]
    R = T * N
    bj, bi, bk, nw, st = mmt_config(J, I)
    tiles = K * cdiv(J, bj) * cdiv(I, bi)
    split = max(1, min(cdiv(R, 2048), cdiv(2 * _sms(h), max(tiles, 1))))
    rs = cdiv(cdiv(R, split), bk) * bk
    split = cdiv(R, rs) if R else 1
    part = torch.empty((split, K, J, I), device=h.device, dtype=torch.float32)
    if not (R and J and I):
        return part.zero_()
    # (block loads of the transposed history start at a tap's row shift (P - k) N: 16-byte aligned)
    if N * h.element_size() % 16 == 0 and _tma(h.view(L * N, J), g.view(R, I), part.view(split * K, J, I)):
        hT, gT = _transposed(h.view(L * N, J)), _transposed(g.view(R, I))  # (K-major operands)
        if _tma(hT, gT):
            _MMT_TMA((K * cdiv(J, bj), cdiv(I, bi), split), nw, st, ht_desc=_desc(hT, [bj, bk]),
                     gt_desc=_desc(gT, [bi, bk]), part_desc=_desc(part.view(split * K, J, I), [1, bj, bi]), R=R,
                     J=J, P=P, K=K, N=N, RS=rs, PREC=_precision(h), UP=_up(h), BJ=bj, BI=bi, BK=bk)
            return part
    _MMT((K * cdiv(J, bj), cdiv(I, bi), split), nw, st, h_ptr=h, g_ptr=g, part_ptr=part, R=R, J=J,
         I=I, P=P, K=K, N=N, RS=rs, PREC=_precision(h), UP=_up(h), BJ=bj, BI=bi, BK=bk)
    return part


class DenseDelays(torch.autograd.Function):
    """`out [T, N, I]` from the history `hist [D + T, N, J]` and the weights over the steps back
    `W [D + 1, J, I]` (`W[k, j, i]`: connection j -> i, k steps back); gradients of both."""

    @staticmethod
    def forward(ctx, hist: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        h, Wc = hist.contiguous(), W.to(hist.dtype).contiguous()
        ctx.save_for_backward(h, Wc)
        ctx.w_dtype = W.dtype
        return conv_forward(h, Wc.transpose(1, 2).contiguous(), Wc.shape[0] - 1)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        first_order("dense relaxed synaptic delays")
        h, Wc = ctx.saved_tensors
        g = g.to(h.dtype).contiguous()
        K = Wc.shape[0]
        gh = conv_history_grad(g, Wc, h.shape[0], K - 1) if ctx.needs_input_grad[0] else None
        gw = conv_weight_parts(h, g, K, K - 1).sum(0).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw


# ---------------------------------------------------------------------------- the gauss taps, fused
# W[k, j, i] = w[i, j] p_k / sum_m p_m, p_k = exp(-c ((k - d[i, j])^2 - min_m (m - d[i, j])^2)): the
# softmax over the steps of `runtime/delays.tap_weights` (its nearest step's exponent 0), c = 1/2σ²
# (bounded as there). Backward, a_k = dL/dW[k]: dL/dw = sum_k a_k g_k; dL/dd = 2 c w (sum_k g_k a_k (k - d)
# - sum_k g_k a_k sum_k g_k (k - d)) (the softmax's derivative through dy_k/dd = 2 c (k - d)).


@triton.jit
def _gauss_norm(d, K, coef):
    """(the nearest step's squared distance, the sum of the unnormalized taps) of delays `d`."""
    m = tl.full(d.shape, float("inf"), tl.float32)
    for k in range(0, K):
        x = k - d
        m = tl.minimum(m, x * x)
    s = tl.zeros(d.shape, dtype=tl.float32)
    for k in range(0, K):
        x = k - d
        s += tl.exp((x * x - m) * -coef)
    return m, s


@triton.jit
def _gauss_taps(w_ptr, d_ptr, wt_ptr, wc_ptr, I, J, K, coef,
                BOTH: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr):
    """`Wt[k, i, j]` (and with BOTH `Wc[k, j, i]`) = w[i, j] g_k(d[i, j])."""
    i = tl.program_id(0) * BI + tl.arange(0, BI)
    j = tl.program_id(1) * BJ + tl.arange(0, BJ)
    mask = (i < I)[:, None] & (j < J)[None, :]
    off = i.to(tl.int64)[:, None] * J + j[None, :]
    w = tl.load(w_ptr + off, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + off, mask=mask, other=0.0).to(tl.float32)
    m, s = _gauss_norm(d, K, coef)
    ws = w / s
    for k in range(0, K):
        x = k - d
        v = ws * tl.exp((x * x - m) * -coef)
        base = tl.cast(k, tl.int64) * I * J
        tl.store(wt_ptr + base + off, v.to(wt_ptr.dtype.element_ty), mask=mask)
        if BOTH:
            tl.store(wc_ptr + base + j.to(tl.int64)[None, :] * I + i[:, None], v.to(wc_ptr.dtype.element_ty),
                     mask=mask)


@triton.jit
def _gauss_taps_grad(part_ptr, S, w_ptr, d_ptr, gw_ptr, gd_ptr, I, J, K, coef, BI: tl.constexpr, BJ: tl.constexpr):
    """dL/dw and dL/dd from the weights' gradient in parts `part[s, k, j, i]` (summed here)."""
    i = tl.program_id(0) * BI + tl.arange(0, BI)
    j = tl.program_id(1) * BJ + tl.arange(0, BJ)
    mask = (i < I)[:, None] & (j < J)[None, :]
    off = i.to(tl.int64)[:, None] * J + j[None, :]
    poff = j.to(tl.int64)[None, :] * I + i[:, None]
    w = tl.load(w_ptr + off, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + off, mask=mask, other=0.0).to(tl.float32)
    m, s = _gauss_norm(d, K, coef)
    ga = tl.zeros([BI, BJ], dtype=tl.float32)  # sum_k g_k a_k
    gax = tl.zeros([BI, BJ], dtype=tl.float32)  # sum_k g_k a_k (k - d)
    gx = tl.zeros([BI, BJ], dtype=tl.float32)  # sum_k g_k (k - d)
    for k in range(0, K):
        a = tl.zeros([BI, BJ], dtype=tl.float32)
        for p in range(0, S):
            a += tl.load(part_ptr + (p * K + k).to(tl.int64) * I * J + poff, mask=mask, other=0.0)
        x = k - d
        gk = tl.exp((x * x - m) * -coef) / s
        ga += gk * a
        gax += gk * a * x
        gx += gk * x
    tl.store(gw_ptr + off, ga, mask=mask)
    tl.store(gd_ptr + off, 2.0 * coef * w * (gax - ga * gx), mask=mask)


TB = 32  # the taps kernels' tiles (TB x TB connections)
# (launched with keywords: flexdsl's fast path, which skips Triton's per-call argument binding)
_MM, _MMT, _MM_TMA, _MMT_TMA = Launcher(_shift_mm), Launcher(_shift_mm_t), Launcher(_shift_mm_tma), Launcher(_shift_mm_t_tma)
_TAPS, _TAPS_GRAD = Launcher(_gauss_taps), Launcher(_gauss_taps_grad)


class GaussDelays(torch.autograd.Function):
    """`out [T, N, I]` from the history `hist [P + T, N, J]` (its first P steps before the output's, the
    steps before those 0), the weights `w [I, J]` and the delays `d [I, J]` (in [0, D]) under the gauss
    relaxation of coefficient `coef` (1/2σ², bounded); gradients of the history, `w` and `d`."""

    @staticmethod
    def forward(ctx, hist: torch.Tensor, w: torch.Tensor, d: torch.Tensor, coef: float, D: int, P: int
                ) -> torch.Tensor:
        h = hist.contiguous()
        L, N, J = h.shape
        I, K = w.shape[0], D + 1
        wc, dc = w.contiguous(), d.contiguous()
        both = ctx.needs_input_grad[0]
        Wt = torch.empty((K, I, J), device=h.device, dtype=h.dtype)
        Wc = torch.empty((K, J, I), device=h.device, dtype=h.dtype) if both else Wt
        if I and J:
            _TAPS((cdiv(I, TB), cdiv(J, TB)), w_ptr=wc, d_ptr=dc, wt_ptr=Wt, wc_ptr=Wc, I=I, J=J, K=K,
                  coef=coef, BOTH=both, BI=TB, BJ=TB)
        ctx.save_for_backward(h, Wc, wc, dc)
        ctx.coef, ctx.past = coef, P
        return conv_forward(h, Wt, P)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        first_order("learnable gauss synaptic delays")
        h, Wc, w, d = ctx.saved_tensors
        g = g.to(h.dtype).contiguous()
        K = Wc.shape[0]
        gw = gd = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:  # (first: its parts freed before the history's)
            part = conv_weight_parts(h, g, K, ctx.past)
            I, J = w.shape
            gw32, gd32 = torch.empty((2, I, J), device=w.device, dtype=torch.float32).unbind(0)
            if I and J:
                _TAPS_GRAD((cdiv(I, TB), cdiv(J, TB)), part_ptr=part, S=part.shape[0], w_ptr=w,
                           d_ptr=d, gw_ptr=gw32, gd_ptr=gd32, I=I, J=J, K=K, coef=ctx.coef, BI=TB, BJ=TB)
            gw, gd = gw32.to(w.dtype), gd32.to(d.dtype)
            del part
        gh = conv_history_grad(g, Wc, h.shape[0], ctx.past) if ctx.needs_input_grad[0] else None
        return gh, gw, gd, None, None, None


def _sms(t: torch.Tensor) -> int:
    return _props(t.device.index or 0)[1] if t.is_cuda else 4


def _major(index: int) -> int:
    return _props(index)[0]


@functools.cache
def _props(index: int) -> tuple[int, int]:
    """(compute capability's major, multiprocessors) of CUDA device `index` (asked once)."""
    p = torch.cuda.get_device_properties(index)
    return p.major, p.multi_processor_count


def _lanes(hist: torch.Tensor) -> int:
    """The lanes (batch elements) of a history `[L, *batch, J]`, counted (a reshape's -1 is ambiguous
    where the history is empty: a batch of 0, or no steps)."""
    return math.prod(hist.shape[1:-1])


def delay_conv(hist: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """`out[t, ..., i] = sum_k sum_j W[k, j, i] hist[D + t - k, ..., j]` (`hist [D + T, ..., J]`,
    `W [D + 1, J, I]`): dense relaxed synaptic delays, the history read as it lies (see the module doc)."""
    L, J = hist.shape[0], hist.shape[-1]
    out = DenseDelays.apply(hist.reshape(L, _lanes(hist), J), W)
    return out.view(L - W.shape[0] + 1, *hist.shape[1:-1], W.shape[2])


def delay_gauss(hist: torch.Tensor, w: torch.Tensor, d: torch.Tensor, coef: float, D: int, past: int | None = None
                ) -> torch.Tensor:
    """`delay_conv` of the gauss relaxation's weights `W[k, j, i] = w[i, j] g_k(d[i, j])` (`hist [past + T,
    ..., J]`: `past` steps (default D) before the output's first, the steps before those 0; `w`, `d`
    `[I, J]`, `coef` = 1/2σ² bounded as `runtime/delays.gauss_coef` bounds it), the weights made in the
    kernels (no `[I, J, D + 1]` tensor for autograd, no zero steps materialized)."""
    P = D if past is None else past
    L, J = hist.shape[0], hist.shape[-1]
    out = GaussDelays.apply(hist.reshape(L, _lanes(hist), J), w, d, coef, D, P)
    return out.view(L - P, *hist.shape[1:-1], w.shape[0])


__all__ = ["DenseDelays", "GaussDelays", "delay_conv", "delay_gauss"]
