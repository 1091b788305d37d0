"""A piece of math in both notations (`Math`: MathML and LaTeX) and a line of it (`Statement`), made from
sympy by `docs/printing.py` and `docs/texprint.py`: what every page's equations are (`content.py`,
`eprop.py`)."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy as sp

from .printing import latex, math_element, mathml_inner, wrapping


@dataclass
class Math:
    """One piece of math in both notations (MathML presentation markup, without `<math>`; LaTeX)."""

    mathml: str
    latex: str
    text: str = ""  # a plain-text form (alt text, Markdown fallbacks)
    expr: Any = None  # the sympy expression printed (LaTeX breaks it over lines: latexdoc.py)
    adjoints: frozenset[str] = frozenset()
    order: str | None = None

    def element(self, display: bool = False) -> str:
        return math_element(self.mathml, display, self.text)

    def wrapping(self) -> str:
        """As `element`, in pieces that wrap like text (a long value in a table cell)."""
        return wrapping(self.mathml, self.text)


@dataclass
class Statement:
    """One line of math: `lhs op rhs` (`op` is "=", "←", "+=" ...), from a source line."""

    lhs: Math
    op: str
    rhs: Math
    line: int = 0
    source: str = ""
    note: str = ""

    @property
    def mathml(self) -> str:
        op = html.escape(self.op)
        return math_element(f"<mrow>{self.lhs.mathml}<mo>{op}</mo>{self.rhs.mathml}</mrow>",
                            alttext=f"{self.lhs.text} {self.op} {self.rhs.text}")

    @property
    def latex(self) -> str:
        return f"{self.lhs.latex} {tex_op(self.op)} {self.rhs.latex}"


_TEX_OPS = {"\u2190": r"\leftarrow", "+=": r"\mathrel{+}=", "-=": r"\mathrel{-}=", "*=": r"\mathrel{*}=",
            "/=": r"\mathrel{/}=", "while": r"\quad\text{while}\quad"}


def tex_op(op: str) -> str:
    """A statement's operator in LaTeX (`←`, `+=`, `while`)."""
    return _TEX_OPS.get(op, op)


def _math(expr: sp.Basic, adjoints: frozenset[str] = frozenset(), order: str | None = None,
          inline: bool = False) -> Math:
    return Math(mathml_inner(expr, adjoints, order, inline), latex(expr, adjoints, order, inline),
                sp.sstr(expr, order=order), None if inline else expr, adjoints, order)


def without_temporaries(assignments: list[tuple[sp.Symbol, sp.Expr]], given: Mapping[sp.Symbol, sp.Expr] | None = None
                        ) -> tuple[list[tuple[sp.Symbol, sp.Expr]], dict[sp.Symbol, sp.Expr]]:
    """The SSA assignments with the shared subexpressions (`_t…`, a device of the generated code)
    and, in a backward, their gradients (`grad__t…`) substituted back: what a reader sees names
    only the model's own quantities. `given`: substitutions made before (the forward's)."""
    subs: dict[sp.Symbol, sp.Expr] = dict(given or {})
    out = []
    for y, e in assignments:
        e = e.xreplace(subs)
        if _TEMPORARY.fullmatch(y.name):
            subs[y] = e
        else:
            out.append((y, e))
    return out, subs


_TEMPORARY = re.compile(r"(grad_)?_t(_\d+)?")


__all__ = ["Math", "Statement", "mathml_inner", "latex", "tex_op", "without_temporaries"]
