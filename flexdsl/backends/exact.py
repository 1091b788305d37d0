"""Whether the values a layer's scan multiplies are exact in bfloat16 (spikes, small integers),
where its products of them run as exact bfloat16 (or int8) products: the checks the shared layer
(`recurrent.py`) and a backend's scan both make, without the registry (a backend's package
imports this)."""

from __future__ import annotations

import weakref
from typing import Any

import torch


def fused_products(t: torch.Tensor, prog: Any) -> Any:
    """The scan program's fused product kernels (its `fused_products`: a module with `to_bf16`,
    `to_bf16_exact`, `split3_mm`, `mm_bf16`; the Triton scan's `products.py`: one-pass conversion,
    fused exact products) where `t` is a CUDA tensor, else None: the torch way (a layer run by a
    scan without them launches no such kernel)."""
    kern = getattr(prog, "fused_products", None)
    return kern if t.is_cuda and kern is not None else None


def exact_bf16(x: torch.Tensor, prog: Any, ints: bool = False) -> torch.Tensor | None:
    """x in bfloat16 where that is exact (spikes, small integers) and finite, else None (an infinity
    times a zero part of a weight would give NaN where float32 gives the infinity)."""
    kern = fused_products(x, prog)
    if kern is not None:
        return kern.to_bf16_exact(x, ints)
    return x.to(torch.bfloat16) if exact_torch(x, ints) else None


def exact_in_bf16(t: torch.Tensor, prog: Any) -> bool:
    """Every value of the fed-back `t` (s0) finite and exact in bfloat16, and a small integer
    where the program's recurrent products run in int8 (`small_ints`)."""
    ints = small_ints(prog, t)
    if t.dtype == torch.float32 and fused_products(t, prog) is not None:
        return exact_bf16(t, prog, ints) is not None  # (one kernel)
    return exact_torch(t, ints)


def small_ints(prog: Any, t: torch.Tensor) -> bool:
    """Whether the program's recurrent products of a fed-back `t` run in int8 (fixed point,
    `backends/triton/recurrent.py`): then "exact" means integers from -127 to 127 (spikes)."""
    ints = getattr(prog, "exact_ints", None)
    return bool(ints is not None and ints(t.dtype))


def exact_torch(t: torch.Tensor, ints: bool) -> bool:
    ok = (t.to(torch.bfloat16).to(t.dtype) == t) & torch.isfinite(t)
    if ints:
        ok &= (t == t.round()) & (t.abs() <= 127)
    return bool(ok.all())


__all__ = ["exact_bf16", "exact_in_bf16", "exact_torch", "fused_products", "small_ints"]


_TF32_SEEN: dict[int, tuple[Any, int, bool]] = {}


def exact_in_tf32(x: torch.Tensor) -> bool:
    """Whether every value of float32 `x` is exact in TF32 (spikes, small integers): its low 13 mantissa
    bits 0. Remembered for the same tensor object at the same version (a call on the same input again
    does not wait for the device); any other tensor, or this one changed in place, is checked."""
    try:
        version = x._version
    except RuntimeError:  # (an inference tensor keeps no version: checked every time)
        version = None
    seen = _TF32_SEEN.get(id(x))
    if version is not None and seen is not None and seen[0]() is x and seen[1] == version:
        return seen[2]
    got = bool(((x.view(torch.int32) & 0x1FFF) == 0).all())
    if version is not None:
        if len(_TF32_SEEN) > 16:
            _TF32_SEEN.clear()
        _TF32_SEEN[id(x)] = (weakref.ref(x), version, got)
    return got
