"""Long equations broken over lines for LaTeX, so that a model's step and backward fit a page
(`latexdoc.py`): the right-hand side of a statement is cut where a reader expects it — before the
`+` or `−` of a sum, between the factors of a product, inside the parentheses of a sum or a
function's argument (`\\left( … \\right.` then `\\left. … \\right)`), and a fraction whose numerator
is too long becomes `\\frac{1}{den}` times it — and the pieces are filled greedily into lines of
a width measured by `tex_width`, an estimate of the typeset width (in em, of LaTeX's default
10 pt fonts) from the LaTeX itself. What cannot be cut (a `cases` brace, a long denominator) stays
whole.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import sympy as sp

from .layout import _negated, product, terms, wordy
from .texprint import LatexPrinterFlex

# ----------------------------------------------------------------------------- width
_SPACES = {",": 0.17, ";": 0.28, ":": 0.22, "!": -0.17, "quad": 1.0, "qquad": 2.0, " ": 0.33}
_RELATIONS = {"leftarrow", "geq", "leq", "nearrow", "neq", "approx", "times", "pm", "mp", "to"}
_GROUPED = {"mathrm", "operatorname", "mathsf", "text", "overline", "mathcal", "tilde", "hat", "mathrel",
            "mathbf", "mathit", "underline"}
_CHARS = {"(": 0.39, ")": 0.39, "[": 0.28, "]": 0.28, ",": 0.45, ".": 0.28, "'": 0.3, "|": 0.28, "/": 0.5,
          "+": 1.22, "-": 1.22, "=": 1.33, "<": 1.33, ">": 1.33, "*": 0.5}


class _Measure:
    """A small reader of LaTeX math that adds up the widths of what it sets."""

    def __init__(self, s: str) -> None:
        self.s, self.i = s, 0

    def run(self, stop: str = "") -> float:
        w = 0.0
        while self.i < len(self.s) and self.s[self.i] not in stop:
            w += self.atom()
        return w

    def group(self) -> float:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1
        if self.i < len(self.s) and self.s[self.i] == "{":
            self.i += 1
            w = self.run("}")
            self.i += 1
            return w
        return self.atom()

    def atom(self) -> float:
        ch = self.s[self.i]
        self.i += 1
        if ch == "{":
            w = self.run("}")
            self.i += 1
            return w
        if ch in "^_":
            return 0.7 * self.group()
        if ch in " &}":
            return 0.0
        if ch == "\\":
            return self.command()
        return _CHARS.get(ch, 0.5)

    def command(self) -> float:
        m = re.compile(r"[A-Za-z]+|.").match(self.s, self.i)
        if m is None:
            return 0.0
        name = m.group(0)
        self.i = m.end()
        if name in _SPACES:
            return _SPACES[name]
        if name == "\\":
            return 0.0
        if name == "frac":
            return max(self.group(), self.group()) + 0.24
        if name in ("left", "right"):
            d = self.s[self.i] if self.i < len(self.s) else "."
            if d == "\\":
                self.i += 1
                self.command()
                return 0.3
            self.i += 1
            return 0.0 if d == "." else 0.42
        if name == "begin":
            return self.environment()
        if name in _GROUPED:
            return self.group()
        if name == "sqrt":
            return self.group() + 0.85
        if name in _RELATIONS:
            return 1.3
        if name == "cdot":
            return 0.72
        if name in ("exp", "log", "min", "max", "sin", "cos", "tanh"):
            return 0.5 * len(name)
        return 0.6  # a Greek letter, \partial, \lvert, ...

    def environment(self) -> float:
        """`\\begin{cases} a & \\text{if } c \\\\ b & \\text{otherwise} \\end{cases}`: the brace and the
        widest of each column."""
        name_end = self.s.index("}", self.i)
        env = self.s[self.i + 1:name_end]
        end = self.s.find(f"\\end{{{env}}}", name_end)
        body = self.s[name_end + 1:end if end >= 0 else len(self.s)]
        self.i = end + len(f"\\end{{{env}}}") if end >= 0 else len(self.s)
        cols: dict[int, float] = {}
        for row in body.split("\\\\"):
            for k, cell in enumerate(row.split("&")):
                cols[k] = max(cols.get(k, 0.0), tex_width(cell))
        return 0.9 + sum(cols.values()) + 1.0 * max(len(cols) - 1, 0)


def tex_width(s: str) -> float:
    """The typeset width of LaTeX math, estimated in em (1 em = 10 pt in LaTeX's default size)."""
    return _Measure(s).run()


# ----------------------------------------------------------------------------- pieces
class BreakingPrinter(LatexPrinterFlex):
    """The docs' LaTeX printer, able to give an expression as pieces between which a line may
    break (`pieces`): joined, they are what `doprint` prints, but for the rewrites that let a
    long fraction or product break (see the module doc)."""

    def pieces(self, e: sp.Expr, budget: float) -> list[str]:
        whole = self._print(e)
        if tex_width(whole) <= budget:
            return [whole]
        if isinstance(e, sp.Add):
            return self._sum(e, budget)
        if isinstance(e, sp.Mul):
            return self._mul(e, budget)
        if isinstance(e, sp.Function) and len(e.args) == 1 and whole.endswith(r"\right)"):
            head = whole[: whole.index(r"\left(")]
            return self._wrapped(head + r"\left(", e.args[0], r"\right)", budget)
        return [whole]

    def _wrapped(self, left: str, inner: sp.Expr, right: str, budget: float) -> list[str]:
        ps = self.pieces(inner, budget)
        return [left + ps[0], *ps[1:-1], ps[-1] + right] if len(ps) > 1 else [left + ps[0] + right]

    def _sum(self, e: sp.Add, budget: float) -> list[str]:
        ts = terms(e, self.order == "none", [] if self.order == "none" else self._as_ordered_terms(e))
        out = self.pieces(ts[0], budget)
        for t in ts[1:]:
            neg = _negated(t)
            op, body = (" - ", neg) if neg is not None else (" + ", t)
            if isinstance(body, sp.Add) or (body.is_Number and body.is_negative):
                ps = self._wrapped(r"\left(", body, r"\right)", budget)
            else:
                ps = self.pieces(body, budget)
            out += [op + ps[0], *ps[1:]]
        return out

    def _mul(self, e: sp.Mul, budget: float) -> list[str]:
        p = product(e)
        if p.units or not p.numer:
            return [self._print(e)]
        out: list[str] = []
        for i, f in enumerate(p.numer):
            ps = self._wrapped(r"\left(", f, r"\right)", budget) if isinstance(f, sp.Add) else self.pieces(f, budget)
            if i:  # (a visible dot: a line may begin with this factor)
                ps[0] = r" \cdot " + ps[0]
            out += ps
        head = "- " if p.negative else ""
        if p.denom:  # (a numerator too long for one line: 1 / den times it)
            first = p.numer[0]
            head += r"\frac{1}{" + self._factors(p.denom, alone=True) + "}" + (
                r" \cdot " if first.is_Number or wordy(first) else " ")
        out[0] = head + out[0]
        return out


def _depth(s: str) -> int:
    return len(re.findall(r"\\left(?![a-zA-Z])", s)) - len(re.findall(r"\\right(?![a-zA-Z])", s))


def fill(pieces: list[str], first: float, rest: float) -> list[str]:
    """The pieces as lines: greedily, the first line at most `first` em wide, the others `rest`; a
    line that ends inside `\\left( … \\right)` is closed with `\\right.` and the next opened with
    `\\left.` (TeX needs each line's delimiters paired)."""
    lines: list[str] = []
    cur, empty, budget = "", True, first
    for p in pieces:
        if not empty and tex_width(cur + p) > budget:
            d = _depth(cur)
            lines.append(cur + r"\right." * d)
            cur, budget = r"\left." * d, rest
        cur += p
        empty = False
    lines.append(cur)
    return lines


def broken(expr: sp.Expr, adjoints: Collection[str], order: str | None, first: float, rest: float) -> list[str]:
    """`expr` as LaTeX lines (see `fill`); one line where it fits."""
    printer = BreakingPrinter(adjoints, order)
    return fill(printer.pieces(expr, rest), first, rest)


__all__ = ["tex_width", "broken", "fill", "BreakingPrinter"]
