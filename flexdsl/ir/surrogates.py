"""Surrogate gradients: S'(x), the derivative used for d spike / d u in backward.

To add a surrogate: its record (name, keyword defaults, formula text) in
`frontend.catalog.SURROGATES`, and a function building S'(x) as a sympy expression in
`_DERIVATIVES` here. Every backend then has it (it is just an expression).
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sympy as sp

from ..errors import FlexDSLError
from ..frontend.catalog import DEFAULT_SURROGATE, SURROGATES
from ..frontend.check import CheckedModel
from .functions import Where, relu, sigmoid
from .tosympy import NONFINITE, sym, to_sympy


@dataclass(frozen=True)
class SurrogateSpec:
    name: str
    defaults: dict[str, float]
    derivative: Callable[..., sp.Expr]  # (x, **kwargs) -> S'(x)
    doc: str


def _sigmoid(x, alpha):
    return alpha * sigmoid(alpha * x) * (1 - sigmoid(alpha * x))


def _atan(x, alpha):
    return (alpha / 2) / (1 + (sp.pi / 2 * alpha * x) ** 2)


def _pw_quadratic(x, alpha):
    return Where(sp.LessThan(sp.Abs(x), 1 / alpha), alpha - alpha**2 * sp.Abs(x), sp.Integer(0))


def _pw_exp(x, alpha):
    return (alpha / 2) * sp.exp(-alpha * sp.Abs(x))


def _soft_sign(x, alpha):
    return 1 / (2 * alpha * (1 / alpha + sp.Abs(x)) ** 2)


def _super_spike(x, alpha):
    return alpha / (sp.Abs(x) + 1) ** 2


def _erf(x, alpha):
    return (alpha / sp.sqrt(sp.pi)) * sp.exp(-((alpha * x) ** 2))


def _fast_sigmoid(x, slope):
    return 1 / (slope * sp.Abs(x) + 1) ** 2


def _triangle(x, alpha):
    return alpha * relu(1 - alpha * sp.Abs(x))


def _rect(x, alpha):
    return Where(sp.StrictLessThan(sp.Abs(x), 1 / (2 * alpha)), alpha, sp.Integer(0))


def _pseudo_derivative(x, gamma, width):
    return gamma / width * relu(1 - sp.Abs(x) / width)


def _norse_triangle(x, alpha):
    return alpha * relu(1 - sp.Abs(x))


def _norse_tanh(x, k):
    return 1 - sp.tanh(k * x) ** 2


def _spike_rate_escape(x, beta, slope):
    return slope * sp.exp(-beta * sp.Abs(x - 1))


def _straight_through(x):
    return sp.Integer(1)


_DERIVATIVES = {
    "sigmoid": _sigmoid, "atan": _atan, "piecewise_quadratic": _pw_quadratic, "piecewise_exp": _pw_exp,
    "soft_sign": _soft_sign, "super_spike": _super_spike, "erf": _erf, "fast_sigmoid": _fast_sigmoid,
    "triangle": _triangle, "rect": _rect, "straight_through": _straight_through,
    "pseudo_derivative": _pseudo_derivative, "norse_triangle": _norse_triangle, "norse_tanh": _norse_tanh,
    "spike_rate_escape": _spike_rate_escape,
}
assert set(_DERIVATIVES) == set(SURROGATES), "catalog.SURROGATES and surrogates._DERIVATIVES disagree"

BUILTIN_SURROGATES: dict[str, SurrogateSpec] = {
    name: SurrogateSpec(name, info.defaults, _DERIVATIVES[name], info.doc) for name, info in SURROGATES.items()
}

# ------------------------------------------------------------------ the surrogate of a model
@dataclass
class SurrogateInfo:
    name: str
    kwargs: dict[str, sp.Expr]  # keyword -> value (numbers or params)
    derivative: sp.Expr  # S'(u) in terms of `u`
    u: sp.Symbol


def surrogate_info(model: CheckedModel, env: Mapping[str, sp.Expr]) -> SurrogateInfo:
    """S'(u) with the keywords' values; a surrogate that is degenerate (not finite, or zero
    everywhere, e.g. `rect(alpha=0)`) is a located error."""
    rs = model.surrogate
    assert rs is not None
    n = model.ast
    u = sym("_u")
    kwargs = {k: to_sympy(v, env, n) for k, v in rs.kwargs.items()}
    pos = rs.pos or n.pos
    try:
        if rs.user is not None:
            local = ChainMap({**kwargs, rs.arg: u}, env)
            deriv = to_sympy(rs.user.body, local, n)
        else:
            deriv = BUILTIN_SURROGATES[rs.name].derivative(u, **kwargs)
        degenerate = deriv.has(*NONFINITE) or deriv == 0
    except (TypeError, ValueError, ZeroDivisionError):  # sympy refuses e.g. |x| < 1/(2*0)
        degenerate = True
    if degenerate:
        shown = ", ".join(f"{k}={sp.sstr(v)}" for k, v in kwargs.items())
        raise FlexDSLError(f"the surrogate `{rs.name}({shown})` is degenerate: its derivative is not finite or is "
                           "zero everywhere", n.filename, pos.line, pos.column, n.source,
                           "surrogate widths must be finite and nonzero (e.g. alpha > 0)")
    if deriv.free_symbols <= {u}:  # constant keywords: the peak S'(0) must be a usable float
        try:
            peak = float(deriv.subs(u, 0))
        except (TypeError, ValueError, OverflowError):
            peak = math.inf
        shown = ", ".join(f"{k}={sp.sstr(v)}" for k, v in kwargs.items())
        if not abs(peak) <= FLOAT32_MAX:
            raise FlexDSLError(f"the surrogate `{rs.name}({shown})` peaks at S'(0) = {peak:.3g}, beyond float32 "
                               "(about 3.4e38): its gradients would be inf or NaN", n.filename, pos.line,
                               pos.column, n.source, "choose a smaller scale (e.g. alpha between 1 and 100)")
        if rs.user is None and peak <= 0:
            raise FlexDSLError(f"the surrogate `{rs.name}({shown})` has S'(0) = {peak:.3g}: a surrogate's "
                               "derivative must be positive at the threshold, or the gradients point the wrong "
                               "way", n.filename, pos.line, pos.column, n.source, "use a positive scale, e.g. "
                               "alpha=4.0")
    return SurrogateInfo(rs.name, kwargs, deriv, u)


FLOAT32_MAX = 3.4028234663852886e38


__all__ = ["BUILTIN_SURROGATES", "DEFAULT_SURROGATE", "SurrogateSpec", "SurrogateInfo", "surrogate_info"]
