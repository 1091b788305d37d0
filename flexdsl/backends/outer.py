"""Sums of outer products over many samples, `A^T B` (`A` [K, m], `B` [K, n]): a plasticity
rule's window change, one product per term over its `T * batch` samples (`runtime/rule.py`).

On CUDA in float32, where one operand is exact in bfloat16 (spikes, small integers; checked in one
pass), the product runs on the tensor cores as the Triton scans' exact products do
(`triton/products.py`: the other operand as three bfloat16 parts, hi + mid + lo, each product
exact, float32 accumulation): the result is a float32 sum of exact terms, as a float32 matmul gives
(error bound: K * 2^-24 of the sum of |terms|), at bfloat16 speed. Otherwise (CPU, float64, a
graph to keep, neither operand exact) one matmul in the operands' dtype.
"""

from __future__ import annotations

import torch


def outer_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a^T b` for a [K, m], b [K, n]: [m, n]."""
    if a.is_cuda and a.dtype == torch.float32 and b.dtype == torch.float32 and not (
            torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)) and a.shape[0] > 0:
        from . import get

        try:
            tri = get("triton")
            ok = tri.available()
        except Exception:  # noqa: BLE001 - no Triton: the matmul below
            ok = False
        if ok:
            from .triton import products as P

            ab = P.to_bf16_exact(a.T)
            if ab is not None:
                return P.split3_mm(ab, b.T.contiguous(), None)
            bb = P.to_bf16_exact(b.T)
            if bb is not None:
                return P.split3_mm(bb, a.T.contiguous(), None).T
    return a.T @ b


__all__ = ["outer_sum"]
