"""Runtime helpers called by the generated torch code (the spike with its surrogate, functions
that must accept Python numbers as well as tensors, and `exprel` without cancellation)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.autograd.forward_ad as fwAD

from ...frontend.numeric import exprel, exprel_d


class _Fire(torch.autograd.Function):
    """heaviside(u) forward; the model's surrogate S'(u) backward (and as the forward-mode
    derivative). Written in the form `torch.func` transforms accept (`grad`, `vmap`, `jacrev`,
    `jvp`...)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(u: torch.Tensor, ge: bool, sg: Callable, args: tuple) -> torch.Tensor:  # type: ignore[override]
        return (u >= 0).to(u.dtype) if ge else (u > 0).to(u.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        u, _, sg, args = inputs
        ctx.save_for_backward(u)
        ctx.save_for_forward(u)
        ctx.sg = sg
        ctx.args = args

    @staticmethod
    def _slope(ctx, u: torch.Tensor) -> torch.Tensor:
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in ctx.args)
        return ctx.sg(u, *args)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (u,) = ctx.saved_tensors
        return grad * _Fire._slope(ctx, u), None, None, None


class _FireFwd(_Fire):
    """`_Fire` with forward-mode AD (`torch.func.jvp`, `jacfwd`, `forward_ad`); eager only, as
    torch.compile does not trace a custom jvp."""

    @staticmethod
    def jvp(ctx, u_t: torch.Tensor, *_):  # type: ignore[override]
        (u,) = ctx.saved_tensors
        return u_t * _Fire._slope(ctx, u)


def _plain(u: torch.Tensor) -> bool:
    """No derivative can be asked of the spike: `u` needs no gradient, is no functorch transform's
    tensor and no forward-mode level is open (then the step function, not the autograd Function:
    the same values without its per-call cost)."""
    return (not u.requires_grad and fwAD._current_level < 0 and not torch.compiler.is_compiling()
            and not torch._C._functorch.is_functorch_wrapped_tensor(u))


def fire_ge(u: torch.Tensor, sg: Callable, args: tuple) -> torch.Tensor:
    if _plain(u):
        return (u >= 0).to(u.dtype)
    return (_Fire if torch.compiler.is_compiling() else _FireFwd).apply(u, True, sg, args)


def fire_gt(u: torch.Tensor, sg: Callable, args: tuple) -> torch.Tensor:
    if _plain(u):
        return (u > 0).to(u.dtype)
    return (_Fire if torch.compiler.is_compiling() else _FireFwd).apply(u, False, sg, args)


def heaviside_ge(u: torch.Tensor) -> torch.Tensor:
    return (u >= 0).to(u.dtype)


def heaviside_gt(u: torch.Tensor) -> torch.Tensor:
    return (u > 0).to(u.dtype)


def heaviside(u):
    if isinstance(u, torch.Tensor):
        return (u >= 0).to(u.dtype)
    return 1.0 if u >= 0 else 0.0


def _t(a, like):
    return a if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=like.dtype, device=like.device)


def _like(*xs):
    for x in xs:
        if isinstance(x, torch.Tensor):
            return x
    return None


def where(cond, a, b, like=None):
    """`a` where `cond` holds, else `b`. Two numbers give a float tensor of the default dtype, or
    of `like`'s dtype where that is wider (a float64 run stays float64: `dt * where(c, 1, 0)`
    must not round `dt` to float32)."""
    ref = _like(a, b, cond)
    if ref is None:
        return a if cond else b
    if not isinstance(cond, torch.Tensor):
        cond = torch.as_tensor(cond, device=ref.device)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.where(cond, a, b)
    dtype = torch.get_default_dtype()
    if isinstance(like, torch.Tensor) and like.is_floating_point():
        dtype = torch.promote_types(dtype, like.dtype)
    # the numbers as tensors of that dtype (torch.where(cond, 0.1, 0.2) would round them to the
    # default dtype first: 0.1 in float32 in a float64 run)
    return torch.where(cond, torch.tensor(a, dtype=dtype, device=cond.device),
                       torch.tensor(b, dtype=dtype, device=cond.device))


def minimum(a, b):
    like = _like(a, b)
    if like is None:
        return min(a, b)
    a, b = _t(a, like), _t(b, like)
    return _routed(torch.minimum(a, b), a < b, a, b)


def maximum(a, b):
    like = _like(a, b)
    if like is None:
        return max(a, b)
    a, b = _t(a, like), _t(b, like)
    return _routed(torch.maximum(a, b), a > b, a, b)


def _routed(value: torch.Tensor, first: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`value` (torch.minimum/maximum: NaN propagates) with the gradient of the derived backward:
    all of it to `a` where `first` holds, else to `b` — at a tie too, where torch would split it
    in halves and the kernels give it to one side."""
    if not (a.requires_grad or b.requires_grad):
        return value
    route = torch.where(first, a, b)
    return route + (value - route).detach()


def clip(x, lo, hi):
    like = _like(x, lo, hi)
    if like is None:
        return min(max(x, lo), hi)
    return torch.clamp(_t(x, like), _t(lo, like), _t(hi, like))


def detach(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


# ---------------------------------------------------------------- removable singularities
# exprel(z) = (exp(z) - 1)/z and its derivative, on floats and tensors (with autograd): one
# implementation, the numeric forms of the catalog (`frontend/numeric.py`).


__all__ = ["fire_ge", "fire_gt", "heaviside", "heaviside_ge", "heaviside_gt", "where", "minimum", "maximum",
           "clip", "detach", "exprel", "exprel_d"]
