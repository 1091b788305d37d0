"""Surrogate gradients: S'(x), the derivative used for d spike / d u in backward.

To add a surrogate: its record (name, keyword defaults, formula text) in
`frontend.catalog.SURROGATES`, and a function building S'(x) as a sympy expression in
`_DERIVATIVES` here. Every backend then has it (it is just an expression).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy as sp

from ..frontend.catalog import DEFAULT_SURROGATE, SURROGATES
from .functions import Where, relu, sigmoid


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


def _straight_through(x):
    return sp.Integer(1)


_DERIVATIVES = {
    "sigmoid": _sigmoid, "atan": _atan, "piecewise_quadratic": _pw_quadratic, "piecewise_exp": _pw_exp,
    "soft_sign": _soft_sign, "super_spike": _super_spike, "erf": _erf, "fast_sigmoid": _fast_sigmoid,
    "triangle": _triangle, "rect": _rect, "straight_through": _straight_through,
    "pseudo_derivative": _pseudo_derivative, "norse_triangle": _norse_triangle, "norse_tanh": _norse_tanh,
}
assert set(_DERIVATIVES) == set(SURROGATES), "catalog.SURROGATES and surrogates._DERIVATIVES disagree"

BUILTIN_SURROGATES: dict[str, SurrogateSpec] = {
    name: SurrogateSpec(name, info.defaults, _DERIVATIVES[name], info.doc) for name, info in SURROGATES.items()
}

__all__ = ["BUILTIN_SURROGATES", "DEFAULT_SURROGATE", "SurrogateSpec"]
