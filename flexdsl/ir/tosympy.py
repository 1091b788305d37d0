"""AST expressions as sympy: `to_sympy(e, env)`, a fold over the AST. With the model given,
a value that is not a finite real (x/0, log(0), exp(1000), sqrt(-1)...) or a power too large
to expand is a located FlexDSLError. Used by the lowering, and by the docs and NIR to read a
model's expressions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import sympy as sp

from ..errors import FlexDSLError
from ..frontend import ast as A
from ..frontend.catalog import DRAWS
from .functions import CONSTANTS, DRAW_CLASSES, TNOW, make


def sym(name: str) -> sp.Symbol:
    return sp.Symbol(name, real=True)


_CMP = {"<": sp.StrictLessThan, "<=": sp.LessThan, ">": sp.StrictGreaterThan, ">=": sp.GreaterThan,
        "==": sp.Eq, "!=": sp.Ne}


MAX_EXPONENT = 32  # of a constant power of a non-constant base (sympy expands powers)
NONFINITE = (sp.zoo, sp.oo, -sp.oo, sp.nan)


class ToSympy(A.ExprFold[sp.Expr]):
    """AST -> sympy. With `neuron` given, a value that is not a finite real (x/0, log(0),
    exp(1000), sqrt(-1)...) or a power too large to expand is a located FlexDSLError."""

    def __init__(self, env: Mapping[str, sp.Expr], neuron: A.Neuron | None = None,
                 draw: Callable[[A.Call], sp.Expr] | None = None) -> None:
        self.env = env
        self.neuron = neuron
        self.draw = draw  # a draw's value (`randn()`: the lowering's SSA symbol of that call)

    def fail(self, e: A.Expr, msg: str, hint: str | None = None) -> FlexDSLError:
        n = self.neuron
        assert n is not None
        return FlexDSLError(msg, n.filename, e.pos.line, e.pos.column, n.source, hint)

    def checked(self, e: A.Expr, v: sp.Expr, divides: bool) -> sp.Expr:
        if self.neuron is None:
            return v
        if v.is_number:
            try:
                z = complex(v)
            except (TypeError, ValueError, OverflowError):
                z = complex("nan")
            if not (math.isfinite(z.real) and math.isfinite(z.imag)):
                raise self.fail(e, "this expression is not a finite number (a division by zero, an overflow or "
                                   "log of 0)", "check the constants; values must stay within float range")
            if z.imag != 0:
                raise self.fail(e, "this expression is a complex number", "e.g. sqrt or log of a negative "
                                                                          "constant, or a fractional power of one")
        elif divides and v.has(*NONFINITE):
            raise self.fail(e, "this expression divides by zero or takes log(0)")
        return v

    def visit_Num(self, e: A.Num) -> sp.Expr:
        v = e.value
        if v.is_integer() and abs(v) < 2**53 and "." not in e.text and "e" not in e.text.lower():
            return sp.Integer(int(v))
        return sp.Float(v)

    def visit_Name(self, e: A.Name) -> sp.Expr:
        if e.id in self.env:
            return self.env[e.id]
        return CONSTANTS[e.id]

    def visit_Neg(self, e: A.Neg, a: sp.Expr) -> sp.Expr:
        return -a

    def visit_BinOp(self, e: A.BinOp, a: sp.Expr, b: sp.Expr) -> sp.Expr:
        try:
            if e.op == "+":
                return self.checked(e, a + b, False)
            if e.op == "-":
                return self.checked(e, a - b, False)
            if e.op == "*":
                return self.checked(e, a * b, False)
            if e.op == "/":
                return self.checked(e, a / b, True)
            return self.checked(e, self.power(e, a, b), True)
        except (ZeroDivisionError, OverflowError) as exc:  # sympy's Float arithmetic raises these
            if self.neuron is None:
                raise
            raise self.fail(e, "this expression divides by zero or overflows") from exc

    def power(self, e: A.BinOp, a: sp.Expr, b: sp.Expr) -> sp.Expr:
        if self.neuron is not None and b.is_number and not a.is_number:
            if abs(complex(b)) > MAX_EXPONENT:
                raise self.fail(e.right, f"the exponent is too large (the limit is {MAX_EXPONENT})",
                                "write exp(k*log(x)) for large powers")
        if self.neuron is not None and a.is_number and b.is_number:
            # constant powers: sympy would compute 9**9**9 exactly; a float overflow is an error
            try:
                size = abs(float(b)) * math.log10(max(abs(float(a)), 1e-300))
            except (TypeError, ValueError, OverflowError):
                size = math.inf
            if not size < 308:
                raise self.fail(e, "this power is too large for a float", "the largest float is about 1.8e308")
        return a**b

    def visit_Call(self, e: A.Call, *args: sp.Expr) -> sp.Expr:
        if e.func in DRAWS:
            return self.draw(e) if self.draw is not None else DRAW_CLASSES[e.func](sp.Integer(-1), TNOW)
        return self.checked(e, make(e.func, *args), True)

    def visit_Compare(self, e: A.Compare, *vals: sp.Expr) -> sp.Expr:
        parts = [_CMP[op](left, right) for op, left, right in zip(e.ops, vals[:-1], vals[1:])]
        return parts[0] if len(parts) == 1 else sp.And(*parts)


def to_sympy(e: A.Expr, env: Mapping[str, sp.Expr], neuron: A.Neuron | None = None,
             draw: Callable[[A.Call], sp.Expr] | None = None) -> sp.Expr:
    """An AST expression as sympy, with names replaced by env[name]; with `neuron`, values that
    are not finite reals are located errors; `draw` gives the value of a draw (`randn()`)."""
    return ToSympy(env, neuron, draw).fold(e)


__all__ = ["ToSympy", "to_sympy", "sym", "MAX_EXPONENT", "NONFINITE"]
