"""The sympy forms of the built-in functions (the records are `frontend.catalog.FUNCTIONS`;
each names its form here by `Function.sympy`). A class here gives its derivative where sympy
cannot differentiate it, and its name is what the printers dispatch on.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy as sp

from ..frontend.catalog import ALL_FUNCTIONS, FUNCTIONS
from ..frontend.catalog import CONSTANTS as CONSTANT_VALUES


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


def _where(cond, a, b):
    return Where(cond, a, b)


# Function.sympy -> the constructor of the sympy form
SYMPY: dict[str, Callable[..., sp.Expr]] = {
    "exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt, "Abs": sp.Abs, "sin": sp.sin, "cos": sp.cos,
    "tanh": sp.tanh, "sigmoid": sigmoid, "relu": relu, "fmin": fmin, "fmax": fmax, "clip": clip,
    "Where": _where, "heaviside": heaviside, "SpikeGE": SpikeGE, "SpikeGT": SpikeGT, "Detach": Detach,
    "sign": sp.sign,
}
assert {f.sympy for f in ALL_FUNCTIONS.values()} == set(SYMPY), "catalog and functions.SYMPY disagree"


def make(name: str, *args: sp.Expr) -> sp.Expr:
    """The sympy form of built-in `name` applied to `args`."""
    return SYMPY[FUNCTIONS[name].sympy](*args)


CONSTANTS: dict[str, sp.Expr] = {"pi": sp.pi}
assert set(CONSTANTS) == set(CONSTANT_VALUES)
