"""The load-time options as users give them, made into `LoadOptions` (frontend/options.py).

- `surrogate=`: text (`"atan(alpha=2.0)"`, checked later like the model's own spike rule), or a
  surrogate object of SpikingJelly (`surrogate.ATan(alpha=2.0)`, what its model zoo passes as
  `surrogate_function=`) or snnTorch (`surrogate.atan(alpha=2.0)`, `fast_sigmoid(slope=25)`), made
  into the built-in with the same derivative and parameters (one without: a user surrogate's
  definition with its derivative, `SPIKINGJELLY_DEFINED`, `SNNTORCH_DEFINED`). The objects are read (their class,
  their parameters; snnTorch's closures by their cells), never called; neither library is imported.
- `learnable=`: a param's name, a list of names, or True/False (every param, none).

`make(surrogate, learnable, c)` raises a `FlexDSLError` located at the model's spike rule (or its
`neuron` line) for an option it cannot read; errors in the text and unknown names are the
pipeline's, located in the text or the model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import FlexDSLError
from ..frontend.options import NONE, LoadOptions

if TYPE_CHECKING:
    from .compiler import Compiled

# SpikingJelly 2.0.0 (`spikingjelly.activation_based.surrogate`): class -> (built-in, {its parameter:
# the built-in's keyword}); each equivalence checked on the derivatives (tests/test_options.py)
SPIKINGJELLY: dict[str, tuple[str, dict[str, str]]] = {
    "Sigmoid": ("sigmoid", {"alpha": "alpha"}),
    "ATan": ("atan", {"alpha": "alpha"}),
    "PiecewiseQuadratic": ("piecewise_quadratic", {"alpha": "alpha"}),
    "PiecewiseExp": ("piecewise_exp", {"alpha": "alpha"}),
    "SoftSign": ("soft_sign", {"alpha": "alpha"}),
    "SuperSpike": ("super_spike", {"alpha": "alpha"}),
    "Erf": ("erf", {"alpha": "alpha"}),
    "Rect": ("rect", {"alpha": "alpha"}),
    "DeterministicPass": ("straight_through", {}),
    "PiecewiseLeakyReLU": ("rect", {}),  # with c = 0: alpha = 1/(2w); else the definition below
}
# SpikingJelly's classes without a built-in equivalent, as user surrogates (the option's text may
# declare one): class -> (the definition, with `{param}` for each parameter's value); a step in the
# forward pass and this derivative in the backward pass, as SpikingJelly 2.0.0's backward computes it
SPIKINGJELLY_DEFINED: dict[str, str] = {
    "PiecewiseLeakyReLU": "piecewise_leaky_relu(x, w={w}, c={c}) = where(abs(x) < w, 1/(2*w), c)",
    "S2NN": "s2nn(x, alpha={alpha}, beta={beta}) = where(x < 0, alpha*sigmoid(alpha*x)*(1 - sigmoid(alpha*x)), "
            "beta/(x + 1))",
    "QPseudoSpike": "q_pseudo_spike(x, alpha={alpha}) = (1 + 2/(alpha - 1)*abs(x))**(-alpha)",
    "LeakyKReLU": "leaky_k_relu(x, leak={leak}, k={k}) = where(x >= 0, k, leak)",
    "NonzeroSignLogAbs": "nonzero_sign_log_abs(x, alpha={alpha}) = 1/(1/alpha + abs(x))",
    "LogTailedReLU": "log_tailed_relu(x, alpha={alpha}) = where(x > 1, 1/x, where(x <= 0, alpha, 1))",
    # clamp_max(sign(x)/x, alpha) = min(1/|x|, alpha), alpha at 0 (written so that S'(0) is finite)
    "FakeNumericalGradient": "fake_numerical_gradient(x, alpha={alpha}) = where(abs(x)*alpha > 1, 1/abs(x), alpha)",
    "SquarewaveFourierSeries": "squarewave_fourier_series(x, T_period={T_period}) = {series}",
}
# snnTorch 1.0 (`snntorch.surrogate`): the factory whose closure is passed -> (built-in, {its
# parameter: the built-in's keyword})
SNNTORCH: dict[str, tuple[str, dict[str, str]]] = {
    "atan": ("atan", {"alpha": "alpha"}),
    "fast_sigmoid": ("fast_sigmoid", {"slope": "slope"}),
    "sigmoid": ("sigmoid", {"slope": "alpha"}),
    "straight_through_estimator": ("straight_through", {}),
    "spike_rate_escape": ("spike_rate_escape", {"beta": "beta", "slope": "slope"}),
}
# snnTorch's factories whose derivative no built-in has, as user surrogates with the derivative its
# backward computes: factory -> the definition, `{param}` for each parameter's value. (A built-in's
# derivative is positive at the threshold; snnTorch's triangular is -threshold there, heaviside and
# SFS are 0 there.)
SNNTORCH_DEFINED: dict[str, str] = {
    "triangular": "triangular(x, threshold={threshold}) = where(x < 0, threshold, -threshold)",
    "heaviside": "snn_heaviside(x) = where(x > 0, 1, 0)",
    "SFS": "sparse_fast_sigmoid(x, slope={slope}, B={B}) = where(x > B, 1/(slope*abs(x) + 1)**2, 0)",
}
# snnTorch's factories that have no closed form to map, and why
SNNTORCH_REFUSED: dict[str, str] = {
    "SSO": "draws its gradient below the threshold at random (torch.rand_like) at every backward",
    "LSO": "fails in snnTorch 1.0 itself (its closure calls the stochastic operator with too few arguments)",
    "custom_surrogate": "wraps a Python function, which flexdsl does not run",
}


class OptionError(Exception):
    """An option that cannot be read (made a located FlexDSLError by `make`)."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def _number(v: Any, what: str) -> str:
    try:
        f = float(v.item() if hasattr(v, "item") else v)
    except (TypeError, ValueError, RuntimeError):
        raise OptionError(f"{what} is {v!r}, not a number") from None
    if not math.isfinite(f):
        raise OptionError(f"{what} is {f}: a surrogate's parameters are finite numbers")
    return repr(f)


def _call(name: str, kwargs: dict[str, str]) -> str:
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")"


def _understood() -> str:
    return ("SpikingJelly's " + ", ".join(f"surrogate.{k}" for k in {**SPIKINGJELLY, **SPIKINGJELLY_DEFINED})
            + "; snnTorch's "
            + ", ".join(f"surrogate.{k}()" for k in {**SNNTORCH, **SNNTORCH_DEFINED})
            + "; or text such as \"atan(alpha=2.0)\"")


def _spikingjelly(obj: Any) -> tuple[str, str]:
    cls = type(obj).__name__
    shown = f"spikingjelly's surrogate.{cls}"
    if cls not in SPIKINGJELLY and cls not in SPIKINGJELLY_DEFINED:
        raise OptionError(f"surrogate={shown}(...) has no equivalent among flexdsl's built-in surrogates",
                          "understood: " + _understood() + "; or write its derivative as a user surrogate "
                          "in the model (`surrogate name(x, k=v) = ...`) and pass its name")
    if getattr(obj, "spiking", True) is not True:
        raise OptionError(f"surrogate={shown}(spiking=False) computes the primitive function in the forward "
                          "pass; a flexdsl spike is a step whose gradient is the surrogate's derivative",
                          f"use {shown}() with spiking=True")
    params = dict(getattr(obj, "_sg_params", None) or {})
    origin = f"{shown}({', '.join(f'{k}={v}' for k, v in params.items())})"
    if cls == "PiecewiseLeakyReLU" and float(_number(params.get("c", 0.01), f"{shown}'s `c`")) == 0.0:
        return _piecewise_leaky_relu(params), origin
    if cls in SPIKINGJELLY_DEFINED:
        return _defined(cls, shown, params), origin
    name, keywords = SPIKINGJELLY[cls]
    kwargs = {kw: _number(params.get(p, getattr(obj, p, None)), f"{shown}'s `{p}`") for p, kw in keywords.items()}
    origin = f"{shown}({', '.join(f'{p}={params.get(p, getattr(obj, p, None))}' for p in keywords)})"
    return _call(name, kwargs), origin


def _piecewise_leaky_relu(params: dict[str, Any]) -> str:
    """PiecewiseLeakyReLU(w, c=0): a gradient of 1/(2w) where |x| < w, else 0: the built-in
    `rect(alpha=1/(2w))` (whose gradient is alpha where |x| < 1/(2 alpha))."""
    w = float(_number(params.get("w", 1.0), "PiecewiseLeakyReLU's `w`"))
    return _call("rect", {"alpha": repr(1.0 / (2.0 * w))})


def _defined(cls: str, shown: str, params: dict[str, Any]) -> str:
    """A SpikingJelly surrogate without a built-in equivalent as a user surrogate's definition."""
    values = {k: _number(v, f"{shown}'s `{k}`") for k, v in params.items() if k != "n"}
    if cls == "SquarewaveFourierSeries":  # 4/T * sum over i = 1 .. n-1 of cos((2i - 1) * 2 pi / T * x)
        n = params.get("n", 2)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
            raise OptionError(f"{shown}'s `n` is {n!r}: a number of terms from 1 to 64")
        terms = [f"cos({2 * i - 1}*(2*pi/T_period)*x)" for i in range(1, n)]
        values["series"] = "4/T_period*(" + " + ".join(terms) + ")" if terms else "0*x"
    try:
        return SPIKINGJELLY_DEFINED[cls].format(**values)
    except KeyError as e:
        raise OptionError(f"{shown} has no parameter {e} where SpikingJelly 2.0.0 keeps it",
                          "pass the surrogate as text instead") from None


def _snntorch(fn: Callable) -> tuple[str, str]:
    factory = fn.__qualname__.split(".")[0]
    shown = f"snntorch's surrogate.{factory}"
    if factory in SNNTORCH_REFUSED:
        raise OptionError(f"surrogate={shown}(...) {SNNTORCH_REFUSED[factory]}: it has no closed form to map",
                          "write the derivative you want as a user surrogate (`surrogate name(x, k=v) = ...`, "
                          "as the option's text); understood: " + _understood())
    known = factory in SNNTORCH or factory in SNNTORCH_DEFINED
    if not known or fn.__qualname__ != f"{factory}.<locals>.inner":
        raise OptionError(f"surrogate={shown}(...) has no equivalent among flexdsl's built-in surrogates",
                          "understood: " + _understood())
    cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in (fn.__closure__ or ()))))
    params = list(SNNTORCH[factory][1]) if factory in SNNTORCH else re.findall(r"(\w+)=\{\w+\}",
                                                                                SNNTORCH_DEFINED[factory])
    values = {}
    for p in params:
        if p not in cells:
            raise OptionError(f"surrogate={shown}(...) cannot be read (its `{p}` is not where snnTorch 1.0 keeps it)",
                              "pass the surrogate as text, e.g. surrogate=\"atan(alpha=2.0)\"")
        values[p] = _number(cells[p], f"{shown}'s `{p}`")
    origin = f"{shown}({', '.join(f'{p}={cells[p]}' for p in params)})"
    if factory in SNNTORCH_DEFINED:
        return SNNTORCH_DEFINED[factory].format(**values), origin
    name, keywords = SNNTORCH[factory]
    return _call(name, {kw: values[p] for p, kw in keywords.items()}), origin


def surrogate_text(value: Any) -> tuple[str | None, str]:
    """(the surrogate as text, how it was given when it was an object)."""
    if value is None:
        return None, ""
    if isinstance(value, str):
        return value, ""
    module = type(value).__module__ or ""
    if module.startswith("spikingjelly."):
        return _spikingjelly(value)
    fmod = getattr(value, "__module__", "") or ""
    if callable(value) and fmod.startswith("snntorch.") and hasattr(value, "__code__"):
        return _snntorch(value)
    if isinstance(value, type) and fmod.startswith(("spikingjelly.", "snntorch.")):
        raise OptionError(f"surrogate={value.__module__}.{value.__qualname__} is a class; pass an instance "
                          "(SpikingJelly: surrogate.ATan()) or snnTorch's factory's result (surrogate.atan())")
    raise OptionError(f"surrogate= takes text or a SpikingJelly or snnTorch surrogate object, not "
                      f"{type(value).__module__}.{type(value).__qualname__}", "understood: " + _understood())


def learnable_names(value: Any) -> bool | tuple[str, ...] | None:
    """`learnable=`: None, True/False, a name, or names (sorted, each once: one set of names is
    one cache key)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Iterable) and not isinstance(value, bytes | dict):
        names = list(value)
        bad = [n for n in names if not isinstance(n, str)]
        if not bad:
            return tuple(sorted(set(names)))
        raise OptionError(f"learnable= lists {bad[0]!r}, which is not a param's name",
                          "e.g. learnable=['tau', 'v_threshold'], learnable='tau' or learnable=True")
    raise OptionError(f"learnable= takes a param's name, a list of names, or True/False, not {type(value).__name__}",
                      "e.g. learnable=['tau', 'v_threshold'], learnable='tau' or learnable=True")


def make(surrogate: Any, learnable: Any, compiled: Callable[[], Compiled]) -> LoadOptions:
    """The options as `LoadOptions`; one that cannot be read is a FlexDSLError located at the
    model's spike rule (`compiled()`: the model without options, compiled only then)."""
    try:
        text, origin = surrogate_text(surrogate)
        learn = learnable_names(learnable)
    except OptionError as e:
        c = compiled()
        ck = c.checked
        pos = ck.spike.pos if ck.spike is not None and "surrogate" in e.reason else ck.ast.pos
        raise FlexDSLError(e.reason, c.filename, pos.line, pos.column, c.text, e.hint) from None
    if text is None and learn is None:
        return NONE
    return LoadOptions(text.strip() if text is not None else None, learn, origin)


__all__ = ["make", "surrogate_text", "learnable_names", "SPIKINGJELLY", "SPIKINGJELLY_DEFINED", "SNNTORCH",
           "SNNTORCH_DEFINED", "SNNTORCH_REFUSED", "OptionError"]
