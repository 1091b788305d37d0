"""Surrogate gradients: S'(x), the derivative used for d spike / d u in backward.

To add a surrogate: add an entry to BUILTIN_SURROGATES with its keyword defaults and a
function building S'(x) as a sympy expression (see LANGUAGE.md §6 for the formulas).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy as sp

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


BUILTIN_SURROGATES: dict[str, SurrogateSpec] = {
    s.name: s
    for s in [
        SurrogateSpec("sigmoid", {"alpha": 4.0}, _sigmoid, "alpha*sigma(alpha*x)*(1-sigma(alpha*x))"),
        SurrogateSpec("atan", {"alpha": 2.0}, _atan, "(alpha/2)/(1+(pi/2*alpha*x)^2)"),
        SurrogateSpec("piecewise_quadratic", {"alpha": 1.0}, _pw_quadratic, "alpha-alpha^2*|x| inside 1/alpha"),
        SurrogateSpec("piecewise_exp", {"alpha": 1.0}, _pw_exp, "(alpha/2)*exp(-alpha*|x|)"),
        SurrogateSpec("soft_sign", {"alpha": 2.0}, _soft_sign, "1/(2*alpha*(1/alpha+|x|)^2)"),
        SurrogateSpec("super_spike", {"alpha": 1.0}, _super_spike, "alpha/(|x|+1)^2"),
        SurrogateSpec("erf", {"alpha": 2.0}, _erf, "(alpha/sqrt(pi))*exp(-(alpha*x)^2)"),
        SurrogateSpec("fast_sigmoid", {"slope": 25.0}, _fast_sigmoid, "1/(slope*|x|+1)^2 (snnTorch, Norse super)"),
        SurrogateSpec("triangle", {"alpha": 1.0}, _triangle, "alpha*relu(1-alpha*|x|)"),
        SurrogateSpec("rect", {"alpha": 1.0}, _rect, "alpha where |x| < 1/(2*alpha)"),
        SurrogateSpec("straight_through", {}, _straight_through, "1"),
        # beyond LANGUAGE.md §6, from the references of the model library:
        SurrogateSpec("pseudo_derivative", {"gamma": 0.3, "width": 1.0}, _pseudo_derivative,
                      "gamma/width*relu(1-|x|/width) (Bellec et al. 2018, LSNN)"),
        SurrogateSpec("norse_triangle", {"alpha": 0.3}, _norse_triangle, "alpha*relu(1-|x|) (Norse 'triangle')"),
        SurrogateSpec("norse_tanh", {"k": 1.0}, _norse_tanh, "1-tanh(k*x)^2 (Norse 'tanh')"),
    ]
}

DEFAULT_SURROGATE = "sigmoid"
