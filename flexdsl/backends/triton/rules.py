"""Triton kernels of a plasticity rule's window (`backends/rules.py` chooses them on CUDA):

    X = linear_scan(a, u, x0)      x_t = a * x_{t-1} + u_t over the window, per element (a trace)

One program holds a block of elements in registers over all steps: one read of `u`, one write of
`X`, in float32 (the loop's own arithmetic: the trace a step-by-step loop computes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernel import Launcher, cdiv
from .launch import interpret


@triton.jit
def _linear_scan_kernel(u, x0, out, a, T, M, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    coef = tl.load(a)
    x = tl.load(x0 + offs, mask=mask, other=0.0)
    for t in range(T):
        x = coef * x + tl.load(u + t * M + offs, mask=mask, other=0.0)
        tl.store(out + t * M + offs, x, mask=mask)


_SCAN = Launcher(_linear_scan_kernel)


def linear_scan(a: torch.Tensor, u: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """x_t = a x_{t-1} + u_t for u [T, M] (float32, contiguous), x0 [M], a a 0-d tensor: X [T, M]."""
    T, M = u.shape
    out = torch.empty_like(u)
    if T and M:
        block = 1024 if not interpret() else 1 << 14
        _SCAN((cdiv(M, block),), num_warps=4, u=u, x0=x0.contiguous(), out=out,
              a=a.to(torch.float32).reshape(1).contiguous(), T=T, M=M, BLOCK=block)
    return out


__all__ = ["linear_scan"]
