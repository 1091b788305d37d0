"""Between torch and NumPy: the backend's programs take torch tensors (or floats) at their edges
and compute in float64 arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def arr(v: Any) -> np.ndarray:
    """A tensor or a number as a float64 array (detached; a copy where the dtype changes)."""
    if isinstance(v, torch.Tensor):
        return v.detach().to(torch.float64).cpu().numpy()
    return np.asarray(float(v), dtype=np.float64)


def full(v: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A step's value as a float64 array of the step's shape (a value that does not depend on
    every input may be a number or of a broadcastable shape)."""
    return np.array(np.broadcast_to(np.asarray(v, dtype=np.float64), shape))


def tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


def grad_of(g: np.ndarray, like: Any) -> torch.Tensor | None:
    """The gradient of the tensor `like` from the per-element gradient `g` (summed over the dims
    `like` was broadcast along); None for a number."""
    if not isinstance(like, torch.Tensor):
        return None
    t = torch.from_numpy(np.ascontiguousarray(g))
    t = t.sum() if like.dim() == 0 else t.sum_to_size(like.shape)
    return t.reshape(like.shape).to(like.dtype)
