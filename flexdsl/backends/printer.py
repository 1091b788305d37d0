"""Code printers shared by the backends: sympy's PythonCodePrinter, specialised.

`BasePrinter` prints numbers, names (through the one naming scheme, `naming.ident`) and
operators; a subclass names its target (`TARGET`) and spells every built-in function of
`frontend.catalog` in its own `SPELL` table (function name -> a format string over the printed
arguments, `{0}`, `{1}`...). `_print_<SympyClass>` methods are installed from that table when
the class is defined, as sympy's own printers install theirs from a table; a function the table
lacks (and no `_print_<SympyClass>` method prints) is an error then, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

from ..frontend.ast import Pos
from ..frontend.catalog import ALL_FUNCTIONS, Function
from ..ir.constants import exact_integer
from . import naming


class BasePrinter(PythonCodePrinter):
    TARGET = ""  # the target's name ("" for a printer that is not a target: no check)
    SPELL: Mapping[str, str] = {}  # built-in function name -> format string over the printed arguments

    def __init__(self, settings: dict | None = None) -> None:
        super().__init__(settings or {"fully_qualified_modules": False})

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.TARGET:
            return
        missing = []
        for f in ALL_FUNCTIONS.values():
            if f.sympy == "sqrt":  # sympy's sqrt is a Pow: see _print_Pow
                continue
            method = f"_print_{f.sympy}"
            if method in cls.__dict__:  # a subclass may still print one function by hand
                continue
            spelling = cls.SPELL.get(f.name)
            if spelling is None:
                missing.append(f.name)
                continue
            setattr(cls, method, _printer_of(f, spelling))
        if missing:
            raise TypeError(f"printer {cls.__name__} (target {cls.TARGET!r}) cannot print the built-in "
                            f"function{'s' if len(missing) > 1 else ''} {', '.join(missing)}: give each a format "
                            f"string in its SPELL table (e.g. SPELL = {{{missing[0]!r}: \"...({{0}})\"}}) or a "
                            "`_print_<SympyName>` method")

    # names and numbers
    def _print_Symbol(self, expr: sp.Symbol) -> str:
        return naming.ident(expr.name)

    def _print_Float(self, expr: sp.Float) -> str:
        return repr(float(expr))

    def _print_Rational(self, expr: sp.Rational) -> str:
        if expr.q == 1:
            return self._print_Integer(sp.Integer(expr.p))
        return repr(float(expr))

    def _print_Integer(self, expr: sp.Integer) -> str:
        # an integer no float64 holds exactly is that float64 (`ir/constants.py`: no target takes it as an integer)
        return str(int(expr)) if exact_integer(expr) else repr(float(expr))

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

    def arg(self, a: sp.Expr) -> str:
        """An argument of a built-in function (a backend may print numbers differently there)."""
        return self._print(a)

    def call(self, name: str, *args: sp.Expr) -> str:
        return self.SPELL[name].format(*(self.arg(a) for a in args))

    def _print_And(self, e):
        return " & ".join(f"({self._print(a)})" for a in e.args)

    def _print_Or(self, e):
        return " | ".join(f"({self._print(a)})" for a in e.args)

    def _print_Relational(self, e):
        return f"{self._print(e.lhs)} {e.rel_op} {self._print(e.rhs)}"

    def _print_Randn(self, e) -> str:
        """A random draw (`Randn/Rand(k, TNOW)`): a backend that runs noisy models spells it."""
        raise TypeError(f"printer {type(self).__name__} cannot print the random draws of a noisy model: give it "
                        "`_print_Randn` and `_print_Rand` (see the torch backend's `TorchPrinter`)")

    _print_Rand = _print_Randn

    def _print_Pow(self, e, rational=False):
        base, ex = e.args
        if ex == sp.Rational(1, 2):
            return self.call("sqrt", base)
        if ex == -sp.Rational(1, 2):
            return f"1/{self.call('sqrt', base)}"
        return super()._print_Pow(e, rational=rational)


def _printer_of(f: Function, spelling: str):
    def _print(self: BasePrinter, e: sp.Expr) -> str:
        return spelling.format(*(self.arg(a) for a in e.args))

    _print.__name__ = f"_print_{f.sympy}"
    return _print


def lhs_rhs_lines(printer: BasePrinter, assignments, origins: dict[str, Pos] | None = None,
                  source_lines: Sequence[str] | None = None, indent: str = "    ") -> list[str]:
    """`name = expr` lines; where an assignment comes from a source line, a comment quoting that
    line comes first."""
    out = []
    last = None
    for y, e in assignments:
        pos = origins.get(y.name) if origins else None
        if pos is not None and source_lines and pos.line != last and 0 < pos.line <= len(source_lines):
            out.append(f"{indent}# line {pos.line}: {comment_text(source_lines[pos.line - 1])}")
            last = pos.line
        out.append(f"{indent}{printer._print(y)} = {printer._print(e)}")
    return out


def load_notes(ck, code: bool = True) -> list[str]:
    """What the model was shaped into at load (`CheckedModel.options`) and how its bounded
    learnable params are computed (`CheckedModel.bounds`), as lines of text: for a generated
    file's header (`code`, comment text without the marker), else one line per fact (the docs)."""
    from ..frontend.ast import constraint_text

    out = []
    o = ck.options
    if o.surrogate is not None:
        given = f", given as {o.origin}" if o.origin else ""
        out.append(f"Chosen at load: surrogate={o.surrogate} (the model writes "
                   f"{ck.ast.meta.get('surrogate_written', '?')}{given})")
    if o.learnable is not None:
        learn = [p.name for p in ck.params if p.learnable]
        out.append(f"Chosen at load: learnable={o.learnable_text()} (trained: {', '.join(learn) or 'no param'})")
    if ck.bounds and code:
        out += ["Bounded learnable params train as unconstrained Parameters raw_<name>; each value is computed",
                "from its Parameter once per call, on the host (float64; strictly inside a strict bound in the",
                "precision of the call):"]
    for b in ck.bounds.values():
        wheres = "; ".join(constraint_text(ck.source, ck.param(n).where)
                           for n in dict.fromkeys(lim.source for lim in (*b.lower, *b.upper)))
        out.append(f"- {b.formula()}    (where {wheres})" if code else
                   f"Bounded: {b.formula()} (where {wheres}): `{b.param}` trains as the unconstrained Parameter "
                   f"`{b.raw}`, its value computed from it once per call")
    return [comment_text(line, 400) for line in out]


def comment_text(text: str, limit: int = 160) -> str:
    """User text made safe for a `#` comment: one line, printable, bounded."""
    s = "".join(ch if ch.isprintable() else " " for ch in text.strip())
    return s if len(s) <= limit else s[: limit - 3] + "..."
