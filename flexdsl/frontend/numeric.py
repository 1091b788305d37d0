"""The numeric forms of the built-in functions, on Python floats or on tensors (torch is imported
only when a tensor is given: no tensor can exist unless torch was imported): what the one numeric
evaluator (`evaluate.py`) computes with, on the host. The removable singularities of exact steps
(`exprel` and its derivative) are here once, for floats and tensors (with their own autograd):
the torch backend's generated code calls these.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import lru_cache
from typing import Any


def is_tensor(a: Any) -> bool:
    torch = sys.modules.get("torch")  # no tensor can exist unless torch was imported
    return torch is not None and isinstance(a, torch.Tensor)


def numeric(fmath: Callable[..., Any], ftorch: str) -> Callable[..., Any]:
    """A numeric form that takes floats (math) or tensors (the torch function `ftorch`)."""

    def f(*args: Any) -> Any:
        if any(is_tensor(a) for a in args):
            import torch

            t = [a if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=torch.float64) for a in args]
            if ftorch == "where":  # the condition is a truth value, whatever made it
                t[0] = t[0].to(torch.bool)
            return _TENSOR_FORMS[ftorch](torch)(*t)
        return fmath(*args)

    f.__name__ = ftorch
    return f


_TENSOR_FORMS: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "exp": lambda t: t.exp, "log": lambda t: t.log, "sqrt": lambda t: t.sqrt, "abs": lambda t: t.abs,
    "sin": lambda t: t.sin, "cos": lambda t: t.cos, "tanh": lambda t: t.tanh, "sigmoid": lambda t: t.sigmoid,
    "relu": lambda t: t.relu, "minimum": lambda t: t.minimum, "maximum": lambda t: t.maximum,
    "clamp": lambda t: t.clamp, "where": lambda t: (lambda c, a, b: t.where(c.bool(), a, b)),
    "heaviside": lambda t: (lambda u: (u >= 0).to(u.dtype)),
    "heaviside_gt": lambda t: (lambda u: (u > 0).to(u.dtype)),
    "sign": lambda t: t.sign, "identity": lambda t: (lambda x: x),
    "exprel": lambda t: exprel, "exprel_d": lambda t: exprel_d,
}


def sigmoid_float(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


# exprel(z) = (exp(z) - 1)/z (1 at z = 0) and its derivative, the removable singularities of an
# exact step: x*exp(a*dt) + b*dt*exprel(a*dt) is exact for every a, a = 0 included. exprel is
# expm1(z)/z (accurate to an ulp or two); its derivative ((z - 1)*exp(z) + 1)/z**2 cancels near
# 0, so for |z| < EXPREL_SERIES_BOUND it is a Taylor series, sum (k+1)/(k+2)! z**k: 20 terms
# reach float64 rounding on the whole interval, the first 12 float32 rounding (the Triton kernels).
EXPREL_SERIES_BOUND = 1.0
EXPREL_D_SERIES: tuple[float, ...] = tuple((k + 1) / math.factorial(k + 2) for k in range(20))
EXPREL_D_SERIES_F32: tuple[float, ...] = EXPREL_D_SERIES[:12]


def exprel_float(z: float) -> float:
    return math.expm1(z) / z if z != 0 else 1.0


def exprel_d_float(z: float) -> float:
    if abs(z) < EXPREL_SERIES_BOUND:
        acc = 0.0
        for c in reversed(EXPREL_D_SERIES):
            acc = acc * z + c
        return acc
    return ((z - 1.0) * math.exp(z) + 1.0) / (z * z)


# On tensors no branch that is not taken ever sees a value that would be NaN or inf there, so
# neither the forward nor autograd's backward can pick one up (the "double where": each branch
# gets a harmless stand-in argument).
def exprel(z: Any) -> Any:
    if not is_tensor(z):
        return exprel_float(float(z))
    import torch

    if torch.compiler.is_compiling():  # (a trace defines no class: the series near 0, whose autograd is exact)
        small = z.abs() < EXPREL_SERIES_BOUND
        zs = torch.where(small, z, torch.zeros_like(z))
        series = torch.full_like(z, 1 / math.factorial(21))
        for k in range(19, -1, -1):
            series = series * zs + 1 / math.factorial(k + 1)
        zb = torch.where(small, torch.ones_like(z), z)
        return torch.where(small, series, torch.expm1(zb) / zb)
    return _exprel_function(True).apply(z)


def exprel_d(z: Any) -> Any:
    if not is_tensor(z):
        return exprel_d_float(float(z))
    import torch

    small = z.abs() < EXPREL_SERIES_BOUND
    zs = torch.where(small, z, torch.zeros_like(z))
    series = torch.full_like(z, EXPREL_D_SERIES[-1])
    for c in reversed(EXPREL_D_SERIES[:-1]):
        series = series * zs + c
    zb = torch.where(small, torch.ones_like(z), z)
    direct = ((zb - 1) * torch.exp(zb) + 1) / (zb * zb)
    return torch.where(small, series, direct)


@lru_cache(maxsize=2)
def _exprel_function(forward_mode: bool) -> Any:
    """exprel on tensors with its derivative exprel_d (autograd of expm1(z)/z would cancel near 0),
    in the form `torch.func` transforms accept (grad, vmap, jacrev); `forward_mode` adds its jvp
    (forward-mode AD: `torch.func.jvp`, `jacfwd`), which torch.compile does not trace (eager only)."""
    import torch

    class Exprel(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(z: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            zero = z == 0
            zb = torch.where(zero, torch.ones_like(z), z)
            return torch.where(zero, torch.ones_like(z), torch.expm1(zb) / zb)

        @staticmethod
        def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
            ctx.save_for_backward(inputs[0])
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
            (z,) = ctx.saved_tensors
            return grad * exprel_d(z)

    if not forward_mode:
        return Exprel

    class ExprelFwd(Exprel):
        @staticmethod
        def jvp(ctx, z_t: torch.Tensor):  # type: ignore[override]
            (z,) = ctx.saved_tensors
            return z_t * exprel_d(z)

    return ExprelFwd


def matrix_exp(rows: list[list[Any]]) -> Any:
    """The matrix exponential of a matrix given by rows of entries (numbers or tensors of
    broadcastable shapes: per-channel params give a batch of matrices [*shape, n, n]), computed
    in float64 with autograd (`torch.linalg.matrix_exp`)."""
    import torch

    flat = [e for row in rows for e in row]
    like = next((e for e in flat if isinstance(e, torch.Tensor)), None)
    device = like.device if like is not None else None
    ts = [e.to(torch.float64) if isinstance(e, torch.Tensor) else torch.tensor(float(e), dtype=torch.float64,
                                                                             device=device) for e in flat]
    ts = torch.broadcast_tensors(*ts)
    n = len(rows)
    m = torch.stack(ts, dim=-1).reshape(*ts[0].shape, n, n)
    return torch.linalg.matrix_exp(m)


__all__ = ["is_tensor", "numeric", "sigmoid_float", "exprel", "exprel_d", "exprel_float", "exprel_d_float",
           "matrix_exp", "EXPREL_SERIES_BOUND", "EXPREL_D_SERIES", "EXPREL_D_SERIES_F32"]
