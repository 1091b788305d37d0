"""Is an int8 tensor-core product fast in Triton here? The recurrent layer's input product
(M = T*B = 64000 rows of 0/8 spike inputs, K = 704, N = 1024) as (a) the three exact bfloat16
products flexdsl runs (`split3_mm`) and (b) four int8 products of int8 inputs with W's fixed-point
digits (`split_fixed`), median ms of triton.testing.do_bench."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flexdsl.backends.triton.products import grouped_tile  # noqa: E402


@triton.jit
def _int8_mm(a, w, c, M, N, K, part, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
             DIGITS: tl.constexpr):
    pm, pn = grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    ap = a + (rm % M)[:, None].to(tl.int64) * K + rk[None, :]
    wp = w + (rn % N)[None, :].to(tl.int64) * K + rk[:, None]
    acc0 = tl.zeros([BM, BN], dtype=tl.int32)
    acc1 = tl.zeros([BM, BN], dtype=tl.int32)
    acc2 = tl.zeros([BM, BN], dtype=tl.int32)
    acc3 = tl.zeros([BM, BN], dtype=tl.int32)
    for _k0 in range(0, K, BK):
        av = tl.load(ap)
        acc0 = tl.dot(av, tl.load(wp), acc0, out_dtype=tl.int32)
        if DIGITS > 1:
            acc1 = tl.dot(av, tl.load(wp + part), acc1, out_dtype=tl.int32)
        if DIGITS > 2:
            acc2 = tl.dot(av, tl.load(wp + 2 * part), acc2, out_dtype=tl.int32)
        if DIGITS > 3:
            acc3 = tl.dot(av, tl.load(wp + 3 * part), acc3, out_dtype=tl.int32)
        ap += BK
        wp += BK
    tot = ((acc3.to(tl.int64) * 256 + acc2.to(tl.int64)) * 256 + acc1.to(tl.int64)) * 256 + acc0.to(tl.int64)
    cm = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c + rm[:, None].to(tl.int64) * N + rn[None, :], tot.to(tl.float32), mask=cm)


def main() -> None:
    from flexdsl.backends.triton.products import split3_mm, split_fixed, to_bf16_exact

    M, K, N = 64000, 700, 1024
    x = (torch.rand(M, K, device="cuda") < 0.05).float() * 8
    w = torch.randn(N, K, device="cuda") * 0.05
    xb = to_bf16_exact(x)
    print(f"device {torch.cuda.get_device_name()}, M={M} K={K} N={N}", flush=True)
    print(f"  split3_mm (3 bf16 products):        {do_bench(lambda: split3_mm(xb, w, None), rep=200):.3f} ms", flush=True)
    kp = 704
    x8 = torch.zeros(M, kp, dtype=torch.int8, device="cuda")
    x8[:, :K] = x.to(torch.int8)
    d, _ = split_fixed(w, kp)
    out = torch.empty(M, N, device="cuda")
    for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3),
                                      (128, 128, 64, 4, 4), (256, 128, 64, 8, 3), (64, 128, 128, 4, 3)):
        for digits in (4, 1):
            try:
                grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
                def f(grid=grid, bm=bm, bn=bn, bk=bk, digits=digits, warps=warps, stages=stages):
                    _int8_mm[grid](x8, d, out, M, N, kp, N * kp, bm, bn, bk, 8, digits, num_warps=warps,
                                   num_stages=stages)
                ms = do_bench(f, rep=200)
                print(f"  int8 x{digits} {bm}x{bn}x{bk} w{warps} s{stages}: {ms:.3f} ms", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  int8 x{digits} {bm}x{bn}x{bk}: failed {type(e).__name__}: {str(e)[:100]}", flush=True)
    k = _int8_mm.warmup(x8, d, out, M, N, kp, N * kp, 128, 128, 64, 8, 4, num_warps=8, num_stages=3, grid=(1,))
    asm = k.asm.get("ptx", "")
    print("  ptx has wgmma:", "wgmma" in asm, " mma.sync:", "mma.sync" in asm, flush=True)


if __name__ == "__main__":
    main()
