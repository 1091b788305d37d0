"""Argument preparation for the Triton kernels: a call's inputs, states, params and gradients as
the kernels read them (`[T, N]` with a row stride, `[N]` per lane, or one value), each with its
MODE (0: a float argument, 1: a one-element tensor, 2: a `[N]` tensor), the loop invariants
computed on the host in float64 when every param is a float, and the specialization keys of a
launch (what Triton compiles a kernel for: dtypes, 16-byte alignment, ints ==1 / %16).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .kernel import bits, spec


def unpack(tensors: Sequence[torch.Tensor], vals: Sequence[float], is_t: Sequence[bool]) -> list[Any]:
    """The tensors of a custom op's list back in their places (None where a value is a float)."""
    if not tensors:
        return [None] * len(is_t)
    it = iter(tensors)
    return [next(it) if k else None for k in is_t]


def flat_input(x: torch.Tensor, T: int, N: int) -> tuple[torch.Tensor, int]:
    """An input as the kernels read it: [T, N] rows of unit stride, and the row stride (a
    contiguous [T, *shape] tensor is already [T, N] in memory)."""
    x2 = x if x.is_contiguous() else x.reshape(T, N)
    if not x2.is_contiguous() and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2, (N if x2 is x else x2.stride(0))


def flat_grad(g: torch.Tensor | None, lead: tuple[int, ...], N: int) -> torch.Tensor | None:
    if g is None or g.is_contiguous():  # (flat in memory already)
        return g
    return g.reshape(*lead, N).contiguous()


def param_arg(p: torch.Tensor | None, v: float, shape, N: int, dev) -> tuple[Any, int]:
    """A param's kernel argument and MODE."""
    if p is None:
        return float(v), 0
    if p.device != dev:
        p = p.to(dev)
    if p.numel() == 1:
        return p.reshape(1), 1
    return p.detach().expand(shape).reshape(N).contiguous(), 2  # the kernel reads [N] at unit stride


def param_args(params, param_vals, shape, N: int, dev, float_modes: list[int]) -> tuple[list, list]:
    """The kernel arguments of the params and their MODEs (all-float params: the values)."""
    if not any(p is not None for p in params):
        return list(param_vals), float_modes
    pargs, modes = [], []
    for p, v in zip(params, param_vals):
        a, mode = param_arg(p, v, shape, N, dev)
        pargs.append(a)
        modes.append(mode)
    return pargs, modes


def state_args(states, state_vals, shape, N: int, dev, float_modes: list[int]) -> tuple[list, list]:
    """The initial states' kernel arguments and MODEs (0: a float, 2: a [N] tensor)."""
    if not any(s is not None for s in states):
        return list(state_vals), float_modes
    inits, initmodes = [], []
    for s, v in zip(states, state_vals):
        if s is None:
            inits.append(float(v))
            initmodes.append(0)
        else:
            inits.append(s.to(dev).expand(shape).reshape(N).contiguous())
            initmodes.append(2)
    return inits, initmodes


class HostInvariants:
    """The loop invariants in float64 on the host when every param is a Python float (as the
    torch path computes them), by the kernels module's `host_invariants`; cached per values."""

    def __init__(self, module: Any, any_hoisted: bool) -> None:
        self.module, self.any_hoisted = module, any_hoisted
        self.cache: dict[bytes, tuple[bool, dict]] = {}

    def __call__(self, params, param_vals) -> tuple[bool, dict]:
        """(True, name -> value), or (False, {}) where the kernel computes them."""
        if not self.any_hoisted or any(p is not None for p in params):
            return False, {}
        key = bits(param_vals)
        hit = self.cache.get(key)
        if hit is None:
            try:
                hit = (True, self.module.host_invariants(*param_vals))
            except (ValueError, ZeroDivisionError, OverflowError):
                hit = (False, {})
            if len(self.cache) > 64:
                self.cache.clear()
            self.cache[key] = hit
        return hit


def fwd_key(values: dict[str, list], dtype: torch.dtype, N: int) -> tuple:
    """The forward launch's specialization key."""
    v = values
    return (dtype, v["store_seqs"][0], v["save"][0], v["checkpoint"][0], v["host"][0], v["block"][0], N == 1,
            N % 16 == 0, *map(spec, v["in"]), *map(spec, v["stride"]), *map(spec, v["init"]),
            *map(spec, v["param"]), *v["initmode"], *v["mode"])


def bwd_key(values: dict[str, list], dtype: torch.dtype, N: int, need: Sequence[bool]) -> tuple:
    """The backward launch's specialization key."""
    v = values
    return (dtype, v["host"][0], v["block"][0], N == 1, N % 16 == 0, *map(spec, v["in"]), *map(spec, v["stride"]),
            spec(v["saved"][0]), *map(spec, v["param"]), *v["mode"], *map(spec, v["init"]), *v["initmode"],
            *map(spec, v["gout"]), *map(spec, v["gseq"]), *map(spec, v["gfin"]), *need)


__all__ = ["unpack", "flat_input", "flat_grad", "param_args", "state_args", "HostInvariants", "fwd_key", "bwd_key"]
