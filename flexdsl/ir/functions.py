"""The sympy forms of the built-in functions (the records are `frontend.catalog.FUNCTIONS`;
each names its form here by `Function.sympy`). A class here gives its derivative where sympy
cannot differentiate it, and its name is what the printers dispatch on.
"""

from __future__ import annotations

from collections.abc import Callable

import mpmath
import sympy as sp

from ..frontend.catalog import ALL_FUNCTIONS, FUNCTIONS
from ..frontend.catalog import CONSTANTS as CONSTANT_VALUES


class _Real:
    """flexdsl's functions take and give real values (every model symbol is real): sympy must
    not rewrite them through re()/im()."""

    is_real = True
    is_extended_real = True
    is_complex = True


class sigmoid(_Real, sp.Function):
    """Logistic function 1/(1+exp(-x))."""

    @classmethod
    def eval(cls, x):  # type: ignore[override]
        if x.is_Number:
            return 1 / (1 + sp.exp(-x))
        return None

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        s = sigmoid(self.args[0])
        return s * (1 - s)


class Where(_Real, sp.Function):
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


class relu(_Real, sp.Function):
    @classmethod
    def eval(cls, x):  # type: ignore[override]
        if x.is_Number:
            return sp.Max(x, 0)
        return None

    def _eval_derivative(self, s):
        x = self.args[0]
        return Where(sp.StrictGreaterThan(x, 0), x.diff(s), sp.Integer(0))


class heaviside(_Real, sp.Function):
    """1 where u >= 0, else 0. Zero gradient (only the spike rule carries a surrogate)."""

    @classmethod
    def eval(cls, u):  # type: ignore[override]
        if u.is_Number:
            return sp.Integer(1) if u >= 0 else sp.Integer(0)
        return None

    def _eval_derivative(self, s):
        return sp.Integer(0)


class fmin(_Real, sp.Function):
    nargs = 2

    @classmethod
    def eval(cls, a, b):  # type: ignore[override]
        if a.is_Number and b.is_Number:
            return sp.Min(a, b)
        return None

    def _eval_derivative(self, s):
        a, b = self.args
        return Where(sp.StrictLessThan(a, b), a.diff(s), b.diff(s))


class fmax(_Real, sp.Function):
    nargs = 2

    @classmethod
    def eval(cls, a, b):  # type: ignore[override]
        if a.is_Number and b.is_Number:
            return sp.Max(a, b)
        return None

    def _eval_derivative(self, s):
        a, b = self.args
        return Where(sp.StrictGreaterThan(a, b), a.diff(s), b.diff(s))


class clip(_Real, sp.Function):
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


class exprel(_Real, sp.Function):
    """(exp(z) - 1)/z, continued by 1 at z = 0: exp(a*dt) = 1 + a*dt*exprel(a*dt), and the exact step
    of dx/dt = a*x + b is x*exp(a*dt) + b*dt*exprel(a*dt), finite and exact at a = 0. Printed as a
    call (`ops.exprel`, `_exprel`) that every backend evaluates without cancellation near 0."""

    nargs = 1

    @classmethod
    def eval(cls, z):  # type: ignore[override]
        if z.is_zero:
            return sp.Integer(1)
        if z.is_Float:  # numerically, without the cancellation of exp(z) - 1
            return sp.Float(mpmath.expm1(z._to_mpmath(z._prec)) / z._to_mpmath(z._prec), precision=z._prec)
        if z.is_Number:
            return (sp.exp(z) - 1) / z
        return None

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return exprel_d(self.args[0])


class exprel_d(_Real, sp.Function):
    """The derivative of exprel: ((z - 1)*exp(z) + 1)/z**2, continued by 1/2 at z = 0 (a Taylor
    series near 0 in every backend). The backward of a step differentiates once, so it is the
    last function of the family the pipeline needs; its own derivative is given in closed form."""

    nargs = 1

    @classmethod
    def eval(cls, z):  # type: ignore[override]
        if z.is_zero:
            return sp.Rational(1, 2)
        if z.is_Float:
            with mpmath.workprec(2 * z._prec + 20):
                x = z._to_mpmath(2 * z._prec + 20)
                v = ((x - 1) * mpmath.exp(x) + 1) / x**2
            return sp.Float(v, precision=z._prec)
        if z.is_Number:
            return ((z - 1) * sp.exp(z) + 1) / z**2
        return None

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        z = self.args[0]
        return Where(sp.Eq(z, 0), sp.Rational(1, 3), (sp.exp(z) - 2 * exprel_d(z)) / z)


# --- the spike and its reset (not callable from a model; produced by the lowering)
class SurrogateGrad(_Real, sp.Function):
    """Placeholder for S'(u) inside derivatives; replaced by the model's surrogate formula."""

    nargs = 1


class SpikeGE(_Real, sp.Function):
    """heaviside(u) with u >= 0 firing; d/du is the surrogate S'(u)."""

    nargs = 1

    def _eval_derivative(self, s):
        u = self.args[0]
        return SurrogateGrad(u) * u.diff(s)


class SpikeGT(_Real, sp.Function):
    """heaviside(u) with u > 0 firing; d/du is the surrogate S'(u)."""

    nargs = 1

    def _eval_derivative(self, s):
        u = self.args[0]
        return SurrogateGrad(u) * u.diff(s)


class Detach(_Real, sp.Function):
    """The value, cut from the graph (detach_reset=True)."""

    nargs = 1

    def _eval_derivative(self, s):
        return sp.Integer(0)


# --- random draws (`randn()`, `rand()`, and the normal draws of white noise): a draw is
# Draw(k, t), the k-th draw of the step t of an element, from the counter-based generator
# (the same numbers on every backend); `t` is the symbol `TNOW`, the step a backend is at (so a
# draw is never a constant of the params, and never gets a gradient).
class Randn(_Real, sp.Function):
    """A standard normal draw: the k-th of the step (args: k, the step's symbol)."""

    nargs = 2

    def _eval_derivative(self, s):
        return sp.Integer(0)


class Rand(_Real, sp.Function):
    """A uniform draw in (0, 1): the k-th of the step (args: k, the step's symbol)."""

    nargs = 2

    def _eval_derivative(self, s):
        return sp.Integer(0)


TNOW = sp.Symbol("_tnow", real=True)  # the step a draw belongs to (named by each backend's loop)
DRAW_CLASSES: dict[str, type[sp.Function]] = {"randn": Randn, "rand": Rand}


def draws_in(e: sp.Basic) -> set[sp.Expr]:
    """The draws in an expression."""
    return {a for a in sp.preorder_traversal(e) if isinstance(a, Randn | Rand)} if e.has(TNOW) else set()


def _where(cond, a, b):
    return Where(cond, a, b)


# Function.sympy -> the constructor of the sympy form
SYMPY: dict[str, Callable[..., sp.Expr]] = {
    "exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt, "Abs": sp.Abs, "sin": sp.sin, "cos": sp.cos,
    "tanh": sp.tanh, "sigmoid": sigmoid, "relu": relu, "fmin": fmin, "fmax": fmax, "clip": clip,
    "Where": _where, "heaviside": heaviside, "SpikeGE": SpikeGE, "SpikeGT": SpikeGT, "Detach": Detach,
    "sign": sp.sign, "exprel": exprel, "exprel_d": exprel_d,
}
assert {f.sympy for f in ALL_FUNCTIONS.values()} == set(SYMPY), "catalog and functions.SYMPY disagree"


def make(name: str, *args: sp.Expr) -> sp.Expr:
    """The sympy form of built-in `name` applied to `args`."""
    return SYMPY[FUNCTIONS[name].sympy](*args)


CONSTANTS: dict[str, sp.Expr] = {"pi": sp.pi}
assert set(CONSTANTS) == set(CONSTANT_VALUES)
