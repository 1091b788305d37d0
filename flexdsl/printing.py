"""Code printers shared by the backends: sympy's PythonCodePrinter, specialised.

`BasePrinter` knows the flexdsl functions (functions.py); a backend subclass says how each
is spelled (the `FUNCS` table) and how numbers and comparisons print.
"""

from __future__ import annotations

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

from . import functions as F

# Names used by generated code itself: model symbols with these names get a trailing `_`.
GENERATED_NAMES = frozenset({"torch", "ops", "tl", "triton", "math", "libdevice"})


class BasePrinter(PythonCodePrinter):
    FUNCS: dict[str, str] = {}

    def __init__(self, settings: dict | None = None) -> None:
        super().__init__(settings or {"fully_qualified_modules": False})

    # names and numbers
    def _print_Symbol(self, expr: sp.Symbol) -> str:
        name = expr.name
        return name + "_" if name in GENERATED_NAMES else name

    def _print_Float(self, expr: sp.Float) -> str:
        return repr(float(expr))

    def _print_Rational(self, expr: sp.Rational) -> str:
        if expr.q == 1:
            return str(expr.p)
        return repr(float(expr))

    def _print_Integer(self, expr: sp.Integer) -> str:
        return str(int(expr))

    def _print_Pi(self, expr) -> str:
        return repr(float(sp.pi))

    def _print_Exp1(self, expr) -> str:
        return repr(float(sp.E))

    def _print_NumberSymbol(self, expr) -> str:
        return repr(float(expr))

    def _print(self, expr, **kwargs) -> str:  # fold constant subexpressions (sqrt(pi), exp(2)...)
        if isinstance(expr, sp.Expr) and expr.is_number and not expr.is_Atom:
            try:
                return repr(float(expr))
            except TypeError:
                pass
        return super()._print(expr, **kwargs)

    def call(self, name: str, *args: sp.Expr) -> str:
        return f"{self.FUNCS[name]}({', '.join(self._print(a) for a in args)})"

    # functions
    def _print_exp(self, e):
        return self.call("exp", *e.args)

    def _print_log(self, e):
        return self.call("log", *e.args)

    def _print_sin(self, e):
        return self.call("sin", *e.args)

    def _print_cos(self, e):
        return self.call("cos", *e.args)

    def _print_tanh(self, e):
        return self.call("tanh", *e.args)

    def _print_Abs(self, e):
        return self.call("abs", *e.args)

    def _print_sign(self, e):
        return self.call("sign", *e.args)

    def _print_sigmoid(self, e):
        return self.call("sigmoid", *e.args)

    def _print_relu(self, e):
        return self.call("relu", *e.args)

    def _print_fmin(self, e):
        return self.call("min", *e.args)

    def _print_fmax(self, e):
        return self.call("max", *e.args)

    def _print_clip(self, e):
        return self.call("clip", *e.args)

    def _print_Where(self, e):
        return self.call("where", *e.args)

    def _print_heaviside(self, e):
        return self.call("heaviside", *e.args)

    def _print_Detach(self, e):
        return self.call("detach", *e.args)

    def _print_And(self, e):
        return " & ".join(f"({self._print(a)})" for a in e.args)

    def _print_Or(self, e):
        return " | ".join(f"({self._print(a)})" for a in e.args)

    def _print_Relational(self, e):
        return f"{self._print(e.lhs)} {e.rel_op} {self._print(e.rhs)}"

    def _print_Pow(self, e, rational=False):
        base, ex = e.args
        if ex == sp.Rational(1, 2):
            return self.call("sqrt", base)
        if ex == -sp.Rational(1, 2):
            return f"1/{self.call('sqrt', base)}"
        return super()._print_Pow(e, rational=rational)


def lhs_rhs_lines(printer: BasePrinter, assignments, origins=None, source_lines=None, indent="    ") -> list[str]:
    """`name = expr` lines; where an assignment comes from a source line, that line follows as a comment."""
    out = []
    last = None
    for y, e in assignments:
        pos = origins.get(y.name) if origins else None
        if pos is not None and source_lines and pos.line != last and 0 < pos.line <= len(source_lines):
            out.append(f"{indent}# line {pos.line}: {source_lines[pos.line - 1].strip()}")
            last = pos.line
        out.append(f"{indent}{printer._print(y)} = {printer._print(e)}")
    return out


def is_fire(e: sp.Expr) -> bool:
    return isinstance(e, F.SpikeGE | F.SpikeGT)
