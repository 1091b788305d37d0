"""The products and scans of a plasticity rule's window (`runtime/rule.py`), on the device's best path.

- `outer_sum(a, b)`: `a^T b` for a [K, m], b [K, n]: one term of a window's change, summed over its
  `T * batch` samples. On CUDA in float32, where one operand is exact in bfloat16 (spikes, small
  integers; checked in one pass), the product runs on the tensor cores with the other operand as
  three bfloat16 parts (hi + mid + lo: every product exact, float32 accumulation), as the Triton
  scans' exact products do (`triton/products.py`): a float32 sum of exact terms, as a float32
  matmul gives (error bound: K * 2^-24 of the sum of |terms|), at bfloat16 speed. Otherwise (CPU,
  float64, a graph to keep, neither operand exact) one matmul in the operands' dtype.
- `linear_scan(a, u, x0)`: a trace over the window, `x_t = a x_{t-1} + u_t`. On CUDA in float32
  without a graph to keep, one Triton kernel (`triton/rules.py`: the loop in registers); otherwise
  one float64 product per block of steps, `X = L U + a^(t+1) x_0` with `L[t, s] = a^(t-s)` (the
  same values to float64 rounding, differentiable in `a`).
"""

from __future__ import annotations

from typing import Any

import torch

_BLOCK = 128  # steps per product of a linear trace (`L` is _BLOCK x _BLOCK)


def rule_module(ir: Any, key: str) -> tuple[Any, dict[str, Any]]:
    """The generated module of a rule and its meta: the reference backend's (`torch/rule.py`)."""
    from .torch.rule import load_rule

    return load_rule(ir, key)


def rule_source(ir: Any, key: str) -> str:
    """The generated module's source (what `flexdsl show x.rule` prints)."""
    from .torch.rule import rule_artefact

    return rule_artefact(ir, key)[1].source


def _triton() -> bool:
    from . import get

    try:
        return bool(get("triton").available())
    except Exception:  # noqa: BLE001 - no Triton: the torch way
        return False


def _fast(*ts: torch.Tensor) -> bool:
    """CUDA float32 tensors with no graph to keep, and Triton there."""
    return all(t.is_cuda and t.dtype == torch.float32 for t in ts) and not (
        torch.is_grad_enabled() and any(t.requires_grad for t in ts)) and _triton()


def outer_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a^T b` for a [K, m], b [K, n]: [m, n]."""
    if a.shape[0] > 0 and _fast(a, b):
        from .triton import products as P

        ab = P.to_bf16_exact(a.T)
        if ab is not None:
            return P.split3_mm(ab, b.T.contiguous(), None)
        bb = P.to_bf16_exact(b.T)
        if bb is not None:
            return P.split3_mm(bb, a.T.contiguous(), None).T
    return a.T @ b


def linear_scan(a: torch.Tensor, u: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """x_t = a x_{t-1} + u_t for u [T, M], x0 [M], a a 0-d tensor: X [T, M] in u's dtype."""
    if _fast(a if a.is_cuda else u, u, x0):
        from .triton.rules import linear_scan as scan

        return scan(a, u.contiguous(), x0)
    T = u.shape[0]
    a64 = a.to(torch.float64)
    u64 = u.to(torch.float64)
    xs = []
    prev = x0.to(torch.float64).reshape(1, -1)
    for k in range(0, T, _BLOCK):
        tb = min(_BLOCK, T - k)
        ts = torch.arange(tb, device=u.device)
        e = (ts[:, None] - ts[None, :]).to(torch.float64)
        L = torch.where(e >= 0, a64 ** e.clamp(min=0), torch.zeros((), dtype=torch.float64, device=u.device))
        X = L @ u64[k:k + tb].reshape(tb, -1) + (a64 ** (ts + 1).to(torch.float64))[:, None] * prev
        xs.append(X)
        prev = X[-1:]
    return torch.cat(xs).to(u.dtype) if xs else u.clone()


__all__ = ["linear_scan", "outer_sum", "rule_module", "rule_source"]
