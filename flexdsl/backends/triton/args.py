"""Argument preparation for the Triton kernels: a call's inputs, states, params and gradients as
the kernels read them (`[T, N]` with a row stride, `[N]` per lane, or one value), each with its
MODE (0: a float argument, 1: a one-element tensor, 2: a `[N]` tensor), the loop invariants
computed on the host in float64 when every param is a float, and the specialization keys of a
launch (what Triton compiles a kernel for: dtypes, 16-byte alignment, ints ==1 / %16).

A lane is a position in memory, not a logical index: the kernels compute every element of a step
alone, so a call whose input steps are dense in memory in another order than the logical one
(`channels_last` activations: what Inductor gives convolutions and their neighbours) runs on
them as they are. Its `order` (the step dims from outermost to innermost in memory; None:
contiguous) is the layout of every `[T, *shape]` and `[*shape]` tensor of the call: outputs,
final states and gradients are made in it, and a state, per-channel param or gradient given in
another layout is copied into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .kernel import bits, prod, spec


def unpack(tensors: Sequence[torch.Tensor], vals: Sequence[float], is_t: Sequence[bool]) -> list[Any]:
    """The tensors of a custom op's list back in their places (None where a value is a float)."""
    if not tensors:
        return [None] * len(is_t)
    it = iter(tensors)
    return [next(it) if k else None for k in is_t]


Order = tuple[int, ...] | None


def lane_param(p: Any, B: int, H: int, device: torch.device) -> tuple[Any, int]:
    """A param as a fused layer kernel over `[B, H]` lanes takes it, and its MODE: a float (0), a
    one-element tensor (1), or `[B * H]` (2: broadcast from what it is)."""
    if not isinstance(p, torch.Tensor):
        return float(p), 0
    if p.numel() == 1:
        return p.detach().to(device, torch.float32).reshape(1), 1
    return p.detach().to(device, torch.float32).expand(B, H).reshape(B * H).contiguous(), 2


def step_order(x: torch.Tensor) -> Order:
    """The layout of a call whose first input is `x` ([T, *shape]): None where its steps are
    contiguous (or not dense in any order: then the input is copied), else the step dims from
    outermost to innermost in memory (by decreasing stride; size-1 dims keep their place)."""
    if x.is_contiguous() or x.dim() < 3:
        return None
    nd = x.dim() - 1
    order = tuple(sorted(range(nd), key=lambda d: -x.stride(d + 1)))
    if order == tuple(range(nd)) or not dense(x, 1, x.shape[1:], order):
        return None
    return order


def _strides(shape, order: tuple[int, ...]) -> list[int]:
    """The strides of a step dense in `order`."""
    out = [0] * len(shape)
    acc = 1
    for d in reversed(order):
        out[d] = acc
        acc *= shape[d]
    return out


def dense(t: torch.Tensor, lead: int, shape, order: Order) -> bool:
    """Whether `t` ([*lead dims, *shape]) has each step dense in `order` (any lead strides)."""
    st = t.stride()
    exp = _strides(shape, tuple(range(len(shape))) if order is None else order)
    return all(st[lead + i] == e for i, e in enumerate(exp) if shape[i] != 1)


def fits(t: torch.Tensor, lead: int, shape, order: Order, N: int) -> bool:
    """Whether `t` is flat in memory as the kernels read it: steps dense in `order`, rows of N."""
    if order is None:
        return t.is_contiguous()
    return dense(t, lead, shape, order) and all(
        t.stride(i) == N * prod(t.shape[i + 1:lead]) or t.shape[i] == 1 for i in range(lead))


def alloc(lead: tuple[int, ...], shape, order: Order, dtype: torch.dtype, dev) -> torch.Tensor:
    """A new tensor [*lead, *shape], flat in memory with its steps in `order`."""
    if order is None:
        return torch.empty((*lead, *shape), dtype=dtype, device=dev)
    k = len(lead)
    base = torch.empty((*lead, *(shape[d] for d in order)), dtype=dtype, device=dev)
    return base.permute(*range(k), *(k + order.index(d) for d in range(len(shape))))


def to_layout(t: torch.Tensor, lead: tuple[int, ...], shape, order: Order, N: int) -> torch.Tensor:
    """`t` (broadcasting to [*lead, *shape]) flat in memory in `order`: itself, or a copy."""
    if tuple(t.shape) == (*lead, *shape) and fits(t, len(lead), shape, order, N):
        return t
    if order is None:
        return t.expand(*lead, *shape).contiguous()
    return alloc(lead, shape, order, t.dtype, t.device).copy_(t)


def flat_input(x: torch.Tensor, T: int, N: int, order: Order = None) -> tuple[torch.Tensor, int]:
    """An input as the kernels read it: steps flat in memory (`order`), and the row stride (a
    contiguous [T, *shape] tensor is already [T, N] in memory; a step-dense one keeps its rows)."""
    if order is not None:
        if x.dim() > 1 and dense(x, 1, x.shape[1:], order):
            return x, x.stride(0) if T > 1 else N
        return to_layout(x, (T,), x.shape[1:], order, N), N
    x2 = x if x.is_contiguous() else x.reshape(T, N)
    if not x2.is_contiguous() and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2, (N if x2 is x else x2.stride(0))


def flat_grad(g: torch.Tensor | None, lead: tuple[int, ...], N: int, shape=(), order: Order = None
              ) -> torch.Tensor | None:
    if g is None or (order is None and g.is_contiguous()):  # (flat in memory already)
        return g
    if order is None:
        return g.reshape(*lead, N).contiguous()
    return to_layout(g, lead, shape, order, N)


def param_arg(p: torch.Tensor | None, v: float, shape, N: int, dev, order: Order = None) -> tuple[Any, int]:
    """A param's kernel argument and MODE."""
    if p is None:
        return float(v), 0
    if p.device != dev:
        p = p.to(dev)
    if p.numel() == 1:  # (the kernel reads the one value at its address: no view needed)
        return p, 1
    if order is not None:
        return to_layout(p.detach(), (), shape, order, N), 2
    return p.detach().expand(shape).reshape(N).contiguous(), 2  # the kernel reads [N] at unit stride


def param_args(params, param_vals, shape, N: int, dev, float_modes: list[int], order: Order = None
               ) -> tuple[list, list]:
    """The kernel arguments of the params and their MODEs (all-float params: the values)."""
    if not any(p is not None for p in params):
        return list(param_vals), float_modes
    pargs, modes = [], []
    for p, v in zip(params, param_vals):
        a, mode = param_arg(p, v, shape, N, dev, order)
        pargs.append(a)
        modes.append(mode)
    return pargs, modes


def state_args(states, state_vals, shape, N: int, dev, float_modes: list[int], order: Order = None
               ) -> tuple[list, list]:
    """The initial states' kernel arguments and MODEs (0: a float; 1: one value in a tensor, a
    0-d one or one broadcast to the step's shape (stride 0 everywhere), read once — under
    torch.compile a param-valued initial state is a 0-d tensor; 2: a [N] tensor)."""
    if not any(s is not None for s in states):
        return list(state_vals), float_modes
    inits, initmodes = [], []
    for s, v in zip(states, state_vals):
        if s is None:
            inits.append(float(v))
            initmodes.append(0)
        elif s.numel() == 1 or (s.numel() and not any(s.stride())):
            inits.append(s if s.device == dev else s.to(dev))  # (read once, at its address)
            initmodes.append(1)
        elif order is not None:
            inits.append(to_layout(s.to(dev), (), shape, order, N))
            initmodes.append(2)
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


def arg_key(a: Any) -> Any:
    """A param's or initial state's kernel argument in a launch plan's signature: a float by its
    bits (0.0 and -0.0 differ), a tensor by what the kernel is specialized on (its dtype and
    16-byte alignment; the tensor itself is the call's own argument)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    return bits((a,))


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


__all__ = ["unpack", "step_order", "dense", "fits", "alloc", "to_layout", "flat_input", "flat_grad", "param_args",
           "state_args", "HostInvariants", "arg_key", "fwd_key", "bwd_key"]
