"""Math markup for the docs: sympy's MathML presentation printer and LaTeX printer, taught
flexdsl's own functions and its naming of variables.

- `mathml(expr)` → `<math>…</math>` (MathML Core: a browser lays it out with no script and no
  network); `latex(expr)` → LaTeX for notebooks (`_repr_latex_`) and papers.
- Names: `v_threshold` → v with subscript "threshold", `tau_m` → τ_m, `Delta_T` → Δ_T; a name
  whose first part is not one letter (or a Greek letter) stays whole and upright (`mem`,
  `was_below`). Shared subexpressions of generated code (`_t`, `_t_3`) print as t̃, t̃₃; in a
  backward, the gradient `grad_v` of `v` prints as v̄ (the adjoint); the states flexdsl adds for
  refractoriness and crossings (`_above_threshold`) without the underscore, in sans-serif.
- Functions: `sigmoid` → σ, `where(c, a, b)` → a brace of cases, `heaviside` → Θ, the spike
  `SpikeGE(u)` → the Iverson bracket [u ≥ 0] (`SpikeGT`: [u > 0]), `min`/`max`, `relu`, `clip`,
  `detach` (the stop-gradient, sg), `sgn`; |x| is printed with `\\lvert`…`\\rvert` in LaTeX (no `|`: safe in Markdown tables).

Expressions converted "as written" (`sympy.evaluate(False)`) keep their structure; the printers
parenthesize them by precedence, so `x - (v - v_reset)` keeps its parentheses.
"""
from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Collection

import sympy as sp
from sympy.printing.mathml import MathMLPresentationPrinter
from sympy.printing.precedence import PRECEDENCE, precedence_traditional

from .layout import (
    _TANGENT,
    _TEMP,
    MINUS,
    THIN,
    Product,
    UnitSymbol,
    _negated,
    _unsigned,
    bookkeeping,
    number_text,
    product,
    simple_exponent,
    split_name,
    terms,
    wordy,
)

MATHML_NS = "http://www.w3.org/1998/Math/MathML"
BAR_STYLE = "border-top: 0.07em solid currentColor; padding-top: 0.06em"  # x̄: the adjoint of x


# ---------------------------------------------------------------------------------- MathML
class MathMLPrinter(MathMLPresentationPrinter):
    """sympy's presentation printer with flexdsl's names and functions (see the module doc)."""

    def __init__(self, adjoints: Collection[str] = (), order: str | None = None, inline: bool = False) -> None:
        super().__init__({"order": order})
        self.adjoints = set(adjoints)
        self.inline = inline  # one line: a / b instead of a fraction bar, exp(x) instead of a raised e^x
        self._depth = 0  # fraction bars around what is being printed

    # elements
    def _el(self, tag: str, *children, text: str | None = None, **attrs: str):
        el = self.dom.createElement(tag)
        for k, v in attrs.items():
            el.setAttribute(k, v)
        if text is not None:  # sympy's text nodes are written raw (for its entities): escape here
            el.appendChild(self.dom.createTextNode(html.escape(text, quote=False)))
        for c in children:
            el.appendChild(c)
        return el

    def _mo(self, op: str):
        return self._el("mo", text=op)

    def _row(self, *children):
        return self._el("mrow", *children)

    def _call(self, name: str, *args: sp.Expr):
        fn = self._el("mi", text=name, mathvariant="normal") if len(name) == 1 else self._el("mi", text=name)
        return self._row(fn, self._mo("\u2061"), self._paren_comma_separated(*args))

    # names
    def _print_Symbol(self, sym, style="plain"):
        return self._symbol(sym.name)

    def _print_UnitSymbol(self, sym, style="plain"):
        return self._el("mi", text=sym.label, mathvariant="normal")

    def _symbol(self, name: str, overline: bool = False):
        if name in self.adjoints and name.startswith("grad_") and not overline:
            return self._symbol(name[5:], overline=True)
        m = _TEMP.fullmatch(name)
        if m is not None:
            t = self._bar(self._el("mi", text="t\u0303"), overline)
            return self._el("msub", t, self._el("mn", text=m.group(1))) if m.group(1) else t
        if name == "_u":
            return self._bar(self._el("mi", text="u"), overline)
        d = _TANGENT.fullmatch(name)
        if d is not None:  # (e-prop's derivatives along the step: dy/dx)
            return self._el("mfrac", self._row(self._mo("\u2202"), self._symbol(d.group(1))),
                            self._row(self._mo("\u2202"), self._symbol(d.group(2))))
        kept = bookkeeping(name)
        if kept is not None:
            return self._bar(self._el("mi", text=kept, mathvariant="sans-serif",
                                      style="font-family: sans-serif; font-size: 0.9em"),
                             overline)
        base, _, sub, compound = split_name(name)
        mi = self._bar(self._el("mi", text=base), overline)
        if compound or not sub:
            return mi
        return self._el("msub", mi, self._el("mn" if sub.isdigit() else "mi", text=sub))

    def _bar(self, el, overline: bool):
        """A bar over the whole name (not letter by letter): a rule along the top of its box."""
        if not overline:
            return el
        return self._el("mrow", el, style=BAR_STYLE)

    def _fenced(self, inner, left: str = "(", right: str = ")"):
        """`inner` between fences that stretch only around tall content (fractions, cases, roots)."""
        tall = any(inner.getElementsByTagName(t) for t in ("mfrac", "mtable", "msqrt", "mroot")) or \
            inner.tagName in ("mfrac", "mtable", "msqrt", "mroot")
        attrs = {} if tall else {"stretchy": "false"}
        return self._row(self._el("mo", text=left, **attrs), inner, self._el("mo", text=right, **attrs))

    def _paren_comma_separated(self, *args):
        inner = self._row()
        for i, a in enumerate(args):
            if i:
                inner.appendChild(self._comma())
            inner.appendChild(self._print(a))
        return self._fenced(inner)

    # sums and products that may be unevaluated: parenthesize by precedence, never re-evaluate
    def _print_Add(self, expr, order=None):
        args = terms(expr, self.order == "none", [] if self.order == "none" else self._as_ordered_terms(expr))
        row = self._row(self._print(args[0]))
        for a in args[1:]:
            neg = _negated(a)
            if neg is not None:
                row.appendChild(self._mo(MINUS))
                row.appendChild(self.parenthesize(neg, PRECEDENCE["Add"]))
            else:
                row.appendChild(self._mo("+"))
                row.appendChild(self.parenthesize(a, PRECEDENCE["Add"]))
        return row

    def _print_Mul(self, expr):
        return self._product(product(expr))

    def _product(self, p: Product):
        row = self._row()
        if p.negative:
            row.appendChild(self._mo(MINUS))
        pieces: list[tuple[bool, object]] = []  # (wordy, element)
        if p.number is not None:
            pieces.append((True, self._quantity(p)))
        if p.denom:
            inline = self.inline or self._depth >= 1  # a fraction inside a fraction: on one line (readable size)
            self._depth += 1
            try:
                num = self._factors(p.numer, alone=not inline) if p.numer else self._el("mn", text="1")
                den_full = None if inline else self._factors(p.denom, alone=True)
            finally:
                self._depth -= 1
            if inline:
                d = p.denom[0]
                if len(p.denom) == 1 and not isinstance(d, sp.Add | sp.Mul) and not (d.is_Number and d.is_negative):
                    den = self._print(d)
                else:
                    den = self._fenced(self._factors(p.denom, alone=True))
                pieces.append((False, self._row(num, self._mo("/"), den)))
            else:
                pieces.append((False, self._el("mfrac", num, den_full)))
        elif p.numer:
            pieces.append((wordy(p.numer[0]), self._factors(p.numer, alone=not pieces and not p.negative)))
        for i, (_, el) in enumerate(pieces):
            if i:
                row.appendChild(self._mo("\u00b7"))
            row.appendChild(el)
        if len(row.childNodes) == 1:
            return row.childNodes[0]
        return row

    def _factors(self, fs: list[sp.Expr], alone: bool = False):
        """Factors side by side: a visible dot beside a name of several letters or before a
        number, else juxtaposed. `alone`: one factor needs no parentheses (a fraction's side)."""
        if len(fs) == 1 and alone:
            return self._print(fs[0])
        row = self._row()
        for i, f in enumerate(fs):
            if i:
                dot = f.is_Number or wordy(f) or wordy(fs[i - 1])
                row.appendChild(self._mo("\u00b7" if dot else "\u2062"))
            row.appendChild(self.parenthesize(f, PRECEDENCE["Mul"], strict=False))
        return row if len(fs) != 1 else row.childNodes[0]

    def _quantity(self, p: Product):
        """A number with its units, a thin space between them (2 ms, 0.1 mV⁻¹ ms⁻¹)."""
        row = self._row(self._number(p.number))
        for u, ex in p.units:
            row.appendChild(self._el("mspace", width=THIN))
            el = self._print(u)
            if ex != 1:
                el = self._el("msup", el, self._signed(ex))
            row.appendChild(el)
        return row

    def _signed(self, x: sp.Expr):
        if x.is_negative:
            return self._row(self._mo(MINUS), self._number(-x))
        return self._number(x)

    def _number(self, x: sp.Expr):
        m, e = number_text(x)
        if e is None:
            return self._el("mn", text=m)
        return self._row(self._el("mn", text=m), self._mo("\u00d7"),
                         self._el("msup", self._el("mn", text="10"), self._signed(sp.Integer(int(e)))))

    def _print_Integer(self, e):
        return self._signed(e)

    def _print_Float(self, e):
        return self._signed(e)

    def _print_Rational(self, e):
        if e.q == 1:
            return self._signed(e)
        return self._product(product(e))

    def _print_Zero(self, e):
        return self._el("mn", text="0")

    def _print_One(self, e):
        return self._el("mn", text="1")

    def _print_NegativeOne(self, e):
        return self._signed(e)

    def _print_Half(self, e):
        return self._print_Rational(e)

    def parenthesize(self, item, level, strict=False):
        prec = precedence_traditional(item)
        if _unsigned(item) is not None or (item.is_Number and item.is_negative):
            prec = PRECEDENCE["Add"]
        if isinstance(item, sp.Mul) and product(item).negative:
            prec = PRECEDENCE["Add"]
        if prec < level or (not strict and prec <= level):
            return self._fenced(self._print(item))
        return self._print(item)

    def _print_Pow(self, e):
        base, ex = e.args
        if ex.is_Number and ex.is_negative:
            return self._product(product(e))
        if base.is_Atom and not (base.is_Number and base.is_negative):
            return self._el("msup", self._print(base), self._print(ex))
        if ex == sp.Rational(1, 2) and not self.inline:
            return self._el("msqrt", self._print(base))
        return self._el("msup", self._fenced(self._print(base)), self._print(ex))

    def _print_Abs(self, expr, exp=None):
        return self._row(self._mo("|"), self._print(expr.args[0]), self._mo("|"))

    def _print_Exp1(self, e):
        return self._el("mi", text="e", mathvariant="normal")

    def _print_exp(self, expr):
        arg = expr.args[0]
        if self.inline or not simple_exponent(arg):  # a sum or a fraction raised would be set tiny
            return self._call("exp", arg)
        return self._el("msup", self._print_Exp1(None), self._print(arg))

    # flexdsl's functions
    def _print_sigmoid(self, e):
        return self._call("\u03c3", *e.args)

    def _print_relu(self, e):
        return self._call("relu", *e.args)

    def _print_fmin(self, e):
        return self._call("min", *e.args)

    def _print_fmax(self, e):
        return self._call("max", *e.args)

    def _print_clip(self, e):
        return self._call("clip", *e.args)

    def _print_heaviside(self, e):
        return self._call("\u0398", *e.args)

    def _print_Detach(self, e):  # the stop-gradient: the value, no gradient through it
        return self._call("sg", *e.args)

    def _print_sign(self, e):
        return self._call("sgn", *e.args)

    # a step's draws: a standard normal 𝒩(0, 1), a uniform 𝒰(0, 1) (anew at every step and element)
    def _print_Randn(self, e):
        return self._call("\U0001D4A9", sp.Integer(0), sp.Integer(1))

    def _print_Rand(self, e):
        return self._call("\U0001D4B0", sp.Integer(0), sp.Integer(1))

    def _print_SurrogateGrad(self, e):
        return self._row(self._el("mi", text="S"), self._el("mo", text="\u2032", lspace="0", rspace="0"),
                         self._paren_comma_separated(*e.args))

    def _iverson(self, u, op: str):
        return self._fenced(self._row(self._print(u), self._mo(op), self._el("mn", text="0")), "[", "]")

    def _print_SpikeGE(self, e):
        return self._iverson(e.args[0], "\u2265")

    def _print_SpikeGT(self, e):
        return self._iverson(e.args[0], ">")

    def _print_Where(self, e):
        cond, a, b = e.args
        rows = [self._el("mtr", self._el("mtd", self._print(a)),
                         self._el("mtd", self._el("mtext", text="if\u00a0"), self._print(cond))),
                self._el("mtr", self._el("mtd", self._print(b)),
                         self._el("mtd", self._el("mtext", text="otherwise")))]
        return self._row(self._mo("{"), self._el("mtable", *rows, columnalign="left"))

    def _print_Relational(self, e):
        ops = {"==": "=", "!=": "\u2260", ">=": "\u2265", "<=": "\u2264", ">": ">", "<": "<"}
        return self._row(self._print(e.lhs), self._mo(ops[e.rel_op]), self._print(e.rhs))

    def _print_And(self, e):
        row = self._row()
        for i, a in enumerate(e.args):
            if i:
                row.appendChild(self._mo("\u2227"))
            row.appendChild(self._print(a))
        return row

    def _print_Function(self, e):
        return self._call(type(e).__name__, *e.args)


_ENTITY = re.compile(r"&(#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
_XML_SPECIAL = {"<", ">", "&", '"', "'"}


def _plain_entities(markup: str) -> str:
    """Character references as the characters (sympy writes `&#964;`, `&InvisibleTimes;`), except
    those XML needs escaped: readable markup that is also well-formed XML."""

    def repl(m: re.Match[str]) -> str:
        ch = html.unescape(m.group(0))
        return m.group(0) if ch in _XML_SPECIAL or ch == m.group(0) else ch

    return _ENTITY.sub(repl, markup)


def mathml_inner(expr: sp.Basic, adjoints: Collection[str] = (), order: str | None = None,
                 inline: bool = False) -> str:
    """The presentation markup of `expr`, without the `<math>` element. `order="none"` keeps the
    terms as they are (an expression as written); the default orders an evaluated one. `inline`:
    on one line (a / b, exp(x)), for table cells."""
    return _plain_entities(MathMLPrinter(adjoints, order, inline).doprint(expr))


def math_element(inner: str, display: bool = False, alttext: str = "") -> str:
    """`<math>` around presentation markup; `display`: set as a display (block) equation, else
    inline but in display style all the same (fractions at full size)."""
    attrs = f' xmlns="{MATHML_NS}"' + (' display="block"' if display else ' displaystyle="true"')
    if alttext:
        attrs += f' alttext="{html.escape(alttext, quote=True)}"'
    return f"<math{attrs}>{inner}</math>"


_BREAK_BEFORE = {"+", MINUS, "\u00b7", "/", "=", "<", ">", "\u2264", "\u2265"}
_FENCES = {"(", ")", "[", "]", "{", "}", "|"}


def _flat(el: ET.Element) -> list[ET.Element]:
    """The row's pieces with the rows that only group (no attribute, no stretching fence) opened:
    a line may break between any two of them."""
    if el.tag != "mrow" or el.attrib or any(
            c.tag == "mo" and (c.text or "") in _FENCES and c.get("stretchy") != "false" for c in el):
        return [el]
    return [x for c in el for x in _flat(c)]


def wrapping(inner: str, alttext: str = "") -> str:
    """Presentation markup as several `<math>` elements with a line-break opportunity (`<wbr>`)
    before each `+`, `−`, `·`, `/`: a long value in a table cell wraps like text instead of
    running off (MathML Core does not break lines itself); the operator that begins a piece keeps
    its spacing (`form="infix"`). Markup with nothing to break at stays one element."""
    try:
        root = ET.fromstring(inner)
    except ET.ParseError:
        return math_element(inner, alttext=alttext)
    pieces: list[list[ET.Element]] = [[]]
    for el in _flat(root):
        prev = pieces[-1][-1] if pieces[-1] else None
        binary = prev is not None and (prev.tag != "mo" or (prev.text or "") in (")", "]", "|"))  # (not a sign)
        if el.tag == "mo" and (el.text or "") in _BREAK_BEFORE and binary:
            el.set("form", "infix")
            pieces.append([])
        pieces[-1].append(el)
    if len(pieces) == 1:
        return math_element(inner, alttext=alttext)
    out = []
    for k, els in enumerate(pieces):
        body = "".join(ET.tostring(e, encoding="unicode") for e in els)
        out.append(math_element(f"<mrow>{body}</mrow>", alttext=alttext if k == 0 else ""))
    return "<wbr>".join(out)


def mathml(expr: sp.Basic, display: bool = False, adjoints: Collection[str] = (), order: str | None = None) -> str:
    """`expr` as a `<math>` element (MathML Core)."""
    return math_element(mathml_inner(expr, adjoints, order), display, alttext=sp.sstr(expr, order=order))


class _Row:
    """Builds MathML rows from already-printed pieces (for equations: lhs, operator, rhs)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, markup: str) -> _Row:
        self.parts.append(markup)
        return self

    def op(self, text: str) -> _Row:
        self.parts.append(f"<mo>{html.escape(text)}</mo>")
        return self

    def text(self, text: str) -> _Row:
        self.parts.append(f"<mtext>{html.escape(text)}</mtext>")
        return self

    def markup(self) -> str:
        return "<mrow>" + "".join(self.parts) + "</mrow>"


def equation(lhs: str, op: str, rhs: str) -> str:
    """A `<math>` equation from printed sides (`mathml_inner` output) and an operator."""
    return math_element(_Row().add(lhs).op(op).add(rhs).markup())


def derivative_mathml(state: str) -> str:
    """d state / dt as presentation markup."""
    num = "<mrow><mi mathvariant=\"normal\">d</mi>" + mathml_inner(sp.Symbol(state)) + "</mrow>"
    return f"<mfrac>{num}<mrow><mi mathvariant=\"normal\">d</mi><mi>t</mi></mrow></mfrac>"


from .texprint import LatexPrinterFlex, derivative_latex, latex, latex_name, tex_text  # noqa: E402 - re-exported

__all__ = ["mathml", "mathml_inner", "math_element", "wrapping", "equation", "latex", "latex_name", "derivative_mathml",
           "derivative_latex", "split_name", "UnitSymbol", "MathMLPrinter", "LatexPrinterFlex", "MATHML_NS",
           "tex_text"]
