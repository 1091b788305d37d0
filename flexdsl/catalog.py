"""The built-in names of the language, without sympy: functions (arity, doc), constants and
surrogates (keyword defaults, doc). The checker needs only this; `functions.py` and
`surrogates.py` give each entry its sympy form (and check that both lists agree)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FunctionInfo:
    name: str
    arity: int
    doc: str


@dataclass(frozen=True)
class SurrogateInfo:
    name: str
    defaults: dict[str, float]
    doc: str


FUNCTIONS: dict[str, FunctionInfo] = {
    f.name: f
    for f in [
        FunctionInfo("exp", 1, "exponential"),
        FunctionInfo("log", 1, "natural logarithm"),
        FunctionInfo("sqrt", 1, "square root"),
        FunctionInfo("abs", 1, "absolute value"),
        FunctionInfo("sin", 1, "sine"),
        FunctionInfo("cos", 1, "cosine"),
        FunctionInfo("tanh", 1, "hyperbolic tangent"),
        FunctionInfo("sigmoid", 1, "logistic function 1/(1+exp(-x))"),
        FunctionInfo("relu", 1, "max(x, 0)"),
        FunctionInfo("min", 2, "smaller of two values"),
        FunctionInfo("max", 2, "larger of two values"),
        FunctionInfo("clip", 3, "clip(x, lo, hi)"),
        FunctionInfo("where", 3, "where(cond, a, b)"),
        FunctionInfo("heaviside", 1, "1 where u >= 0 else 0 (no gradient)"),
    ]
}

CONSTANTS: frozenset[str] = frozenset({"pi"})

SURROGATES: dict[str, SurrogateInfo] = {
    s.name: s
    for s in [
        SurrogateInfo("sigmoid", {"alpha": 4.0}, "alpha*sigma(alpha*x)*(1-sigma(alpha*x))"),
        SurrogateInfo("atan", {"alpha": 2.0}, "(alpha/2)/(1+(pi/2*alpha*x)^2)"),
        SurrogateInfo("piecewise_quadratic", {"alpha": 1.0}, "alpha-alpha^2*|x| inside 1/alpha"),
        SurrogateInfo("piecewise_exp", {"alpha": 1.0}, "(alpha/2)*exp(-alpha*|x|)"),
        SurrogateInfo("soft_sign", {"alpha": 2.0}, "1/(2*alpha*(1/alpha+|x|)^2)"),
        SurrogateInfo("super_spike", {"alpha": 1.0}, "alpha/(|x|+1)^2"),
        SurrogateInfo("erf", {"alpha": 2.0}, "(alpha/sqrt(pi))*exp(-(alpha*x)^2)"),
        SurrogateInfo("fast_sigmoid", {"slope": 25.0}, "1/(slope*|x|+1)^2 (snnTorch, Norse super)"),
        SurrogateInfo("triangle", {"alpha": 1.0}, "alpha*relu(1-alpha*|x|)"),
        SurrogateInfo("rect", {"alpha": 1.0}, "alpha where |x| < 1/(2*alpha)"),
        SurrogateInfo("straight_through", {}, "1"),
        # beyond LANGUAGE.md §6, from the references of the model library:
        SurrogateInfo("pseudo_derivative", {"gamma": 0.3, "width": 1.0},
                      "gamma/width*relu(1-|x|/width) (Bellec et al. 2018, LSNN)"),
        SurrogateInfo("norse_triangle", {"alpha": 0.3}, "alpha*relu(1-|x|) (Norse 'triangle')"),
        SurrogateInfo("norse_tanh", {"k": 1.0}, "1-tanh(k*x)^2 (Norse 'tanh')"),
    ]
}

DEFAULT_SURROGATE = "sigmoid"
