"""Exact float32 products of values that bfloat16 holds exactly (spikes, small integers) in
Triton, for the recurrent layer's input product (`backends/recurrent.py`):

    xb = to_bf16(x, flag)                     # x in bfloat16; flag (on the device) 1 where not exact
    xb = to_bf16_exact(x)                     # the same, waiting for the verdict: None where not exact
    ix = split3_mm(xb2, w_in, b)              # xb2 @ (hi + mid + lo)^T + b, float32
    parts = split3(w)                         # [3, *w.shape] bfloat16, in one launch

`to_bf16` converts and checks in one pass (the torch way takes four kernels and a synchronisation),
into rows padded to 64 elements (aligned, no mask along K in the product); `split3_mm` reads each tile of x once for the three bfloat16 parts of the float32
weight (`split3`: hi + mid + lo == w), accumulates the three tensor-core products in float32 and
adds the bias before one store: every product is exact, so the result is a float32 sum of the
exact terms, as a float32 matmul gives. With cuBLAS the same takes three GEMMs, two of which read
and write the float32 result again (and a 700-wide row, not 16-byte aligned, sends it to older,
slower kernels).

Launch settings (env): `FLEXDSL_PRODUCT_TILE=BMxBNxBK` (default 128x128x32), `FLEXDSL_PRODUCT_WARPS`
(8), `FLEXDSL_PRODUCT_STAGES` (3).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...settings import env_int, env_tile
from .kernel import Launcher, cdiv, next_pow2
from .launch import interpret


@triton.jit
def _to_bf16_exact_kernel(x, out, flag, n, K, KP, PAD: tl.constexpr, INTS: tl.constexpr, BLOCK: tl.constexpr):
    # out [rows, KP] = bfloat16(x [rows, K]), zeros in the KP - K padding columns; flag = 1 where a
    # value is not finite or not exact in bfloat16 (INTS: or not an integer from -127 to 127)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if PAD:
        row = offs // KP
        col = offs - row * KP
        v = tl.load(x + row * K + col, mask=m & (col < K), other=0.0)
    else:
        v = tl.load(x + offs, mask=m, other=0.0)
    vb = v.to(tl.bfloat16)
    tl.store(out + offs, vb, mask=m)
    back = vb.to(tl.float32)
    bad = (back != v) | (tl.abs(v) == float("inf"))  # (NaN: back != v)
    if INTS:
        bad = bad | (v != v.to(tl.int32).to(tl.float32)) | (tl.abs(v) > 127.0)
    if tl.max(bad.to(tl.int32), axis=0) > 0:
        tl.store(flag, 1)


@triton.jit
def _split3_kernel(w, out, n, K, KP, PAD: tl.constexpr, BLOCK: tl.constexpr):
    # out [3, rows, KP] bfloat16: hi, mid, lo of w [rows, K] (float32), hi + mid + lo == w up to
    # 2^-24 |w|; zeros in the KP - K padding columns
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if PAD:
        row = offs // KP
        col = offs - row * KP
        v = tl.load(w + row * K + col, mask=m & (col < K), other=0.0).to(tl.float32)
    else:
        v = tl.load(w + offs, mask=m, other=0.0).to(tl.float32)
    hi = v.to(tl.bfloat16)
    r = v - hi.to(tl.float32)
    mid = r.to(tl.bfloat16)
    tl.store(out + offs, hi, mask=m)
    tl.store(out + n + offs, mid, mask=m)
    tl.store(out + 2 * n + offs, (r - mid.to(tl.float32)).to(tl.bfloat16), mask=m)


@triton.jit
def grouped_tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    # (row block, column block) of program `pid` over an [M, N] result: GROUP row blocks walk the
    # column blocks together, so that W's tiles stay in L2
    width = GROUP * tl.cdiv(N, BN)
    first = (pid // width) * GROUP
    size = tl.minimum(tl.cdiv(M, BM) - first, GROUP)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def _split3_mm_kernel(a, w, b, c, M, N, K, lda, part, HAS_B: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                      PARTS: tl.constexpr = 3):
    # c[M, N] = a[M, K] @ (w[0] + w[1] + w[2])^T + b: a [M, K] bfloat16 with rows `lda` apart, w
    # [3, N, K] bfloat16 with rows `lda` apart too (`part` elements between the parts); three
    # products accumulated in float32, lo first. EVEN_K: K is a multiple of BK (the rows are
    # padded with zeros), no mask along K. IEEE: float32 operands and IEEE products (Triton's
    # interpreter, whose 16-bit dot is not exact). PARTS 1: w is one bfloat16 matrix (autocast's
    # product), one product; c in its own dtype
    pm, pn = grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    ap = a + (rm % M)[:, None].to(tl.int64) * lda + rk[None, :]  # (rows past M read row r % M: no mask)
    wp = w + (rn % N)[None, :].to(tl.int64) * lda + rk[:, None]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        if PARTS == 1:
            if EVEN_K:
                av = tl.load(ap)
                w0 = tl.load(wp)
            else:
                km = (k0 + rk) < K
                av = tl.load(ap, mask=km[None, :], other=0.0)
                w0 = tl.load(wp, mask=km[:, None], other=0.0)
            if IEEE:
                acc = tl.dot(av.to(tl.float32), w0.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(av, w0, acc)
        elif EVEN_K:
            av = tl.load(ap)
            w2 = tl.load(wp + 2 * part)
            w1 = tl.load(wp + part)
            w0 = tl.load(wp)
        else:
            km = (k0 + rk) < K
            av = tl.load(ap, mask=km[None, :], other=0.0)
            w2 = tl.load(wp + 2 * part, mask=km[:, None], other=0.0)
            w1 = tl.load(wp + part, mask=km[:, None], other=0.0)
            w0 = tl.load(wp, mask=km[:, None], other=0.0)
        if PARTS == 1:
            pass
        elif IEEE:
            af = av.to(tl.float32)
            acc = tl.dot(af, w2.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(af, w1.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(af, w0.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(av, w2, acc)
            acc = tl.dot(av, w1, acc)
            acc = tl.dot(av, w0, acc)
        ap += BK
        wp += BK
    if HAS_B:
        acc += tl.load(b + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    cm = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(c.dtype.element_ty), mask=cm)


@triton.jit
def _split_fixed_kernel(w, out, scale, N, K, KP, BLOCK: tl.constexpr):
    # one row of w [N, K] (float32) in fixed point: q = round(w * 2^(30 - e)), e the row's binary
    # exponent (max |w| < 2^e, so |q| <= 2^30), as four balanced base-256 digits (out [4, N, K]
    # int8, q == d0 + 2^8 d1 + 2^16 d2 + 2^24 d3); scale[row] = 2^(e - 30) (float64), NaN if the
    # row holds a value that is not finite (the products with it are NaN in float32 too)
    row = tl.program_id(0).to(tl.int64)
    base = w + row * K
    top = tl.zeros([BLOCK], dtype=tl.float32)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        v = tl.load(base + ks, mask=ks < K, other=0.0).to(tl.float32)
        finite = tl.abs(v) < float("inf")  # (False for NaN too)
        bad = tl.maximum(bad, (~finite).to(tl.int32))
        top = tl.maximum(top, tl.where(finite, tl.abs(v), 0.0))
    field = (tl.max(top, axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF
    e = tl.maximum(field, 1) - 126  # max |w| < 2^e (a zero or subnormal row: e = -125)
    up = ((30 - e + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)  # 2^(30 - e), exact
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        m = ks < K
        v = tl.load(base + ks, mask=m, other=0.0).to(tl.float32)
        v = tl.where(tl.abs(v) < float("inf"), v, 0.0)
        x = v.to(tl.float64) * up
        q = ((x + 6755399441055744.0) - 6755399441055744.0).to(tl.int64)  # round to nearest, ties even
        for p in tl.static_range(4):
            d = ((q + 128) & 255) - 128
            tl.store(out + p * N * KP + row * KP + ks, d.to(tl.int8), mask=m)
            q = (q - d) >> 8
    down = ((e - 30 + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    tl.store(scale + row, tl.where(tl.max(bad, axis=0) > 0, float("nan"), down))


_TO_BF16, _SPLIT3, _SPLIT3_MM = Launcher(_to_bf16_exact_kernel), Launcher(_split3_kernel), Launcher(_split3_mm_kernel)
_SPLIT_FIXED = Launcher(_split_fixed_kernel)
_ALIGN = 64  # rows padded to a multiple of this many elements: aligned, and no mask along K


def _padded(k: int) -> int:
    return -(-k // _ALIGN) * _ALIGN


def to_bf16(x: torch.Tensor, flag: torch.Tensor, ints: bool = False) -> torch.Tensor:
    """x (float32) in bfloat16, `flag` (int32, on x's device) set to 1 where a value is not finite or
    not exact there (`ints`: or not an integer from -127 to 127, as int8 holds it); nothing waits. The result's rows (last dim) lie in a buffer padded with zeros
    to a multiple of 64 elements (a view: aligned rows for the products)."""
    K = x.shape[-1] if x.dim() else 1
    xc = x.contiguous().reshape(-1, K)
    rows, kp = xc.shape[0], _padded(K)
    buf = torch.empty((rows, kp), dtype=torch.bfloat16, device=x.device)
    n = buf.numel()
    if n:
        block = 4096 if not interpret() else 1 << 16
        _TO_BF16((cdiv(n, block),), num_warps=8, x=xc, out=buf, flag=flag, n=n, K=K, KP=kp, PAD=kp != K,
                 INTS=ints, BLOCK=block)
    return buf[:, :K].reshape(x.shape)


def to_bf16_exact(x: torch.Tensor, ints: bool = False) -> torch.Tensor | None:
    """x (float32) in bfloat16 where every value is finite and exact there (`ints`: and an integer
    from -127 to 127), else None (one pass, and one synchronisation to read the verdict); as
    `to_bf16`."""
    flag = torch.zeros(1, dtype=torch.int32, device=x.device)
    xb = to_bf16(x, flag, ints)
    return None if int(flag.item()) else xb


def split3(w: torch.Tensor, kp: int | None = None) -> torch.Tensor:
    """[3, *w.shape] bfloat16 (hi, mid, lo; hi + mid + lo == w in float32 up to 2^-24 |w|) in one
    launch; with `kp`, rows padded with zeros to kp elements ([3, rows, kp])."""
    K = w.shape[-1] if w.dim() else 1
    wc = w.contiguous().reshape(-1, K)
    kp = K if kp is None else kp
    out = torch.empty((3, wc.shape[0], kp), dtype=torch.bfloat16, device=w.device)
    n = wc.shape[0] * kp
    if n:
        block = 1024 if not interpret() else 1 << 16
        _SPLIT3((cdiv(n, block),), num_warps=4, w=wc, out=out, n=n, K=K, KP=kp, PAD=kp != K, BLOCK=block)
    return out if kp != K else out.reshape(3, *w.shape)


def split3_mm(xb: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`xb @ w^T + b` in float32 from exact products: xb [M, K] bfloat16 (exact values; rows may lie
    in a padded buffer, as `to_bf16_exact` gives them), w [N, K] float32 (multiplied as its three
    bfloat16 parts, `split3`), b [N] or None. Each product is exact; the sum is float32."""
    M, K = xb.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=torch.float32, device=xb.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.copy_((b.float() if b is not None else torch.zeros(N, device=xb.device)).expand(M, N))
    kp = _padded(K)
    _product(_aligned(xb, kp), split3(w, kp), b, out, kp, 3)
    return out


def _aligned(xb: torch.Tensor, kp: int) -> torch.Tensor:
    """xb [M, K] bfloat16 as rows of kp elements, aligned, zeros past K (itself when it lies so, as
    `to_bf16` writes it; else a padded copy)."""
    if xb.stride(1) != 1 or xb.stride(0) != kp or xb.storage_offset() % _ALIGN:
        xb = torch.nn.functional.pad(xb, (0, kp - xb.shape[1]))
    return xb


def _product(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, c: torch.Tensor, kp: int, parts: int) -> None:
    """One launch of `_split3_mm_kernel`: c [M, N] = a @ (the `parts` bfloat16 matrices of w)^T + b,
    a and w in rows of kp elements."""
    M, N = c.shape
    bm, bn, bk = env_tile("FLEXDSL_PRODUCT_TILE") or ((32, 32, 32) if interpret() else
                                                      (128, 128, 32 if parts == 3 else 64))
    grid = (cdiv(M, bm) * cdiv(N, bn),)
    _SPLIT3_MM(grid, num_warps=env_int("FLEXDSL_PRODUCT_WARPS") or (4 if interpret() else 8),
               num_stages=env_int("FLEXDSL_PRODUCT_STAGES") or 3, a=a, w=w, b=b if b is not None else w, c=c,
               M=M, N=N, K=kp, lda=kp, part=N * kp if parts == 3 else 0, HAS_B=b is not None, EVEN_K=kp % bk == 0,
               IEEE=interpret(), BM=bm, BN=bn, BK=bk, GROUP=8, PARTS=parts)


def split_fixed(w: torch.Tensor, kp: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (float32) per row in 31-bit fixed point: (digits [4, N, K] int8, scale [N] float64)
    with w[n, k] ~= scale[n] * sum_p 256^p digits[p, n, k], within scale[n] / 2 (2^-31 of the
    row's binary range, at most 2^-30 of its largest |w|); scale NaN for a row with a value that is
    not finite. Products of int8 spikes with the digits sum exactly in int32 (`tl.dot`), and one
    rounding to float32 at the end. With `kp`, rows padded with zeros to kp elements."""
    wc = w.detach().float().contiguous()
    N, K = wc.shape
    kp = K if kp is None else kp
    out = (torch.empty if kp == K else torch.zeros)((4, N, kp), dtype=torch.int8, device=w.device)
    scale = torch.empty((N,), dtype=torch.float64, device=w.device)
    if N and K:
        block = min(max(next_pow2(K), 16), 1024)
        _SPLIT_FIXED((N,), num_warps=4, w=wc, out=out, scale=scale, N=N, K=K, KP=kp, BLOCK=block)
    elif N:
        scale.fill_(1.0)
        out.zero_()
    return out, scale


def mm_bf16(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`x @ w^T + b` as autocast to bfloat16 computes it (operands rounded to bfloat16, float32
    accumulation, a bfloat16 result) for x [M, K] float32 or bfloat16, w [N, K], b [N] or None: rows
    padded to 64 elements (aligned: cuBLAS takes slower kernels for a 700-wide bfloat16 row), one
    kernel for the conversion of x and one product."""
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.copy_((b if b is not None else torch.zeros(N, device=x.device)).to(out.dtype).expand(M, N))
    kp = _padded(K)
    flag = torch.zeros(1, dtype=torch.int32, device=x.device)  # (its verdict is not read: a cast, not a check)
    xb = to_bf16(x.float() if x.dtype != torch.float32 else x, flag)
    wp = torch.zeros((N, kp), dtype=torch.bfloat16, device=x.device)
    wp[:, :K].copy_(w)
    _product(_aligned(xb, kp), wp, b.to(torch.bfloat16) if b is not None else None, out, kp, 1)
    return out


__all__ = ["to_bf16", "to_bf16_exact", "split3", "split3_mm", "split_fixed", "mm_bf16", "grouped_tile"]
