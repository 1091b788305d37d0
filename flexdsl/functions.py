"""Built-in functions of the language: arity, sympy form, and how each backend prints them.

To add a function: its name, arity and doc in catalog.FUNCTIONS, its sympy constructor in
_MAKERS here (with a derivative if sympy cannot differentiate it), and its spelling in each
printer's FUNCS table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy as sp

from .catalog import CONSTANTS as CONSTANT_NAMES
from .catalog import FUNCTIONS


class sigmoid(sp.Function):
    """Logistic function 1/(1+exp(-x))."""

    @classmethod
    def eval(cls, x):  # type: ignore[override]
        if x.is_Number:
            return 1 / (1 + sp.exp(-x))
        return None

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        s = sigmoid(self.args[0])
        return s * (1 - s)


class Where(sp.Function):
    """where(cond, a, b): a where cond holds, else b. Differentiates through a and b only."""

    nargs = 3

    @classmethod
    def eval(cls, cond, a, b):  # type: ignore[override]
        if cond is sp.true:
            return a
        if cond is sp.false:
            return b
        if a == b:
            return a
        return None

    def _eval_derivative(self, s):
        cond, a, b = self.args
        return Where(cond, a.diff(s), b.diff(s))


class relu(sp.Function):
    @classmethod
    def eval(cls, x):  # type: ignore[override]
        if x.is_Number:
            return sp.Max(x, 0)
        return None

    def _eval_derivative(self, s):
        x = self.args[0]
        return Where(sp.StrictGreaterThan(x, 0), x.diff(s), sp.Integer(0))


class heaviside(sp.Function):
    """1 where u >= 0, else 0. Zero gradient (only the spike rule carries a surrogate)."""

    @classmethod
    def eval(cls, u):  # type: ignore[override]
        if u.is_Number:
            return sp.Integer(1) if u >= 0 else sp.Integer(0)
        return None

    def _eval_derivative(self, s):
        return sp.Integer(0)


class fmin(sp.Function):
    nargs = 2

    @classmethod
    def eval(cls, a, b):  # type: ignore[override]
        if a.is_Number and b.is_Number:
            return sp.Min(a, b)
        return None

    def _eval_derivative(self, s):
        a, b = self.args
        return Where(sp.StrictLessThan(a, b), a.diff(s), b.diff(s))


class fmax(sp.Function):
    nargs = 2

    @classmethod
    def eval(cls, a, b):  # type: ignore[override]
        if a.is_Number and b.is_Number:
            return sp.Max(a, b)
        return None

    def _eval_derivative(self, s):
        a, b = self.args
        return Where(sp.StrictGreaterThan(a, b), a.diff(s), b.diff(s))


class clip(sp.Function):
    nargs = 3

    @classmethod
    def eval(cls, x, lo, hi):  # type: ignore[override]
        if x.is_Number and lo.is_Number and hi.is_Number:
            return sp.Min(sp.Max(x, lo), hi)
        return None

    def _eval_derivative(self, s):
        x, lo, hi = self.args
        inside = sp.And(sp.GreaterThan(x, lo), sp.LessThan(x, hi))
        d = Where(inside, x.diff(s), sp.Integer(0))
        if lo.diff(s) != 0:
            d += Where(sp.StrictLessThan(x, lo), lo.diff(s), sp.Integer(0))
        if hi.diff(s) != 0:
            d += Where(sp.StrictGreaterThan(x, hi), hi.diff(s), sp.Integer(0))
        return d


# --- the spike and its reset (not callable from a model; produced by the lowering)
class SurrogateGrad(sp.Function):
    """Placeholder for S'(u) inside derivatives; replaced by the model's surrogate formula."""

    nargs = 1


class SpikeGE(sp.Function):
    """heaviside(u) with u >= 0 firing; d/du is the surrogate S'(u)."""

    nargs = 1

    def _eval_derivative(self, s):
        u = self.args[0]
        return SurrogateGrad(u) * u.diff(s)


class SpikeGT(sp.Function):
    """heaviside(u) with u > 0 firing; d/du is the surrogate S'(u)."""

    nargs = 1

    def _eval_derivative(self, s):
        u = self.args[0]
        return SurrogateGrad(u) * u.diff(s)


class Detach(sp.Function):
    """The value, cut from the graph (detach_reset=True)."""

    nargs = 1

    def _eval_derivative(self, s):
        return sp.Integer(0)


@dataclass(frozen=True)
class Builtin:
    name: str
    arity: int
    make: Callable[..., sp.Expr]
    doc: str


def _where(cond, a, b):
    return Where(cond, a, b)


_MAKERS: dict[str, Callable[..., sp.Expr]] = {
    "exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt, "abs": sp.Abs, "sin": sp.sin, "cos": sp.cos,
    "tanh": sp.tanh, "sigmoid": sigmoid, "relu": relu, "min": fmin, "max": fmax, "clip": clip,
    "where": _where, "heaviside": heaviside,
}
assert set(_MAKERS) == set(FUNCTIONS), "catalog.FUNCTIONS and functions._MAKERS disagree"

BUILTINS: dict[str, Builtin] = {
    name: Builtin(name, info.arity, _MAKERS[name], info.doc) for name, info in FUNCTIONS.items()
}

CONSTANTS: dict[str, sp.Expr] = {"pi": sp.pi}
assert set(CONSTANTS) == set(CONSTANT_NAMES)
