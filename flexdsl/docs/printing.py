"""Math markup for the docs: sympy's MathML presentation printer and LaTeX printer, taught
flexdsl's own functions and its naming of variables.

- `mathml(expr)` → `<math>…</math>` (MathML Core: a browser lays it out with no script and no
  network); `latex(expr)` → LaTeX for notebooks (`_repr_latex_`) and papers.
- Names: `v_threshold` → v with subscript "threshold", `tau_m` → τ_m, `Delta_T` → Δ_T; a name
  whose first part is not one letter (or a Greek letter) stays whole and upright (`mem`,
  `was_below`). Shared subexpressions of generated code (`_t`, `_t_3`) print as t̃, t̃₃; in a
  backward, the gradient `grad_v` of `v` prints as v̄ (the adjoint).
- Functions: `sigmoid` → σ, `where(c, a, b)` → a brace of cases, `heaviside` → Θ, the spike
  `SpikeGE(u)` → the Iverson bracket [u ≥ 0] (`SpikeGT`: [u > 0]), `min`/`max`, `relu`, `clip`,
  `detach`, `sgn`; |x| is printed with `\\lvert`…`\\rvert` in LaTeX (no `|`: safe in Markdown tables).

Expressions converted "as written" (`sympy.evaluate(False)`) keep their structure; the printers
parenthesize them by precedence, so `x - (v - v_reset)` keeps its parentheses.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass, field

import sympy as sp
from sympy.core.alphabets import greeks
from sympy.printing.latex import LatexPrinter
from sympy.printing.mathml import MathMLPresentationPrinter
from sympy.printing.precedence import PRECEDENCE, precedence_traditional

MATHML_NS = "http://www.w3.org/1998/Math/MathML"
BAR_STYLE = "border-top: 0.07em solid currentColor; padding-top: 0.06em"  # x̄: the adjoint of x

_GREEK_LOWER = {g: unicodedata.lookup(f"GREEK SMALL LETTER {'LAMDA' if g == 'lambda' else g.upper()}")
                for g in greeks}
_GREEK_UPPER = {g.capitalize(): unicodedata.lookup(f"GREEK CAPITAL LETTER {'LAMDA' if g == 'lambda' else g.upper()}")
                for g in greeks}
# LaTeX has commands only for the capitals that differ from Latin letters
_TEX_UPPER = {"Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega"}
_HEAD = re.compile(r"([A-Za-z]+?)(\d*)")
_TEMP = re.compile(r"_t(?:_?(\d+))?")


class UnitSymbol(sp.Symbol):
    """A unit as written in a model (`ms`, `mV`, `uS`): printed upright, `u` as µ, `ohm` as Ω."""

    @property
    def label(self) -> str:
        name = self.name
        for word, sign in (("ohm", "\u03a9"), ("Ohm", "\u03a9")):
            if name.endswith(word):
                name = name[: -len(word)] + sign
        if len(name) > 1 and name[0] == "u":
            name = "\u00b5" + name[1:]
        return name


def split_name(name: str) -> tuple[str, str, str, bool]:
    """(base, base_tex, subscript, compound) of an identifier.

    `v_threshold` → ("v", "v", "threshold", False); `tau_m` → ("τ", "\\tau", "m", False);
    `k1_v` → ("k", "k", "1,v", False); `was_below` → ("was_below", ..., "", True): a compound
    name stays whole (upright)."""
    head, _, rest = name.partition("_")
    m = _HEAD.fullmatch(head)
    if m is not None:
        letters, digits = m.group(1), m.group(2)
        base = tex = None
        if len(letters) == 1:
            base = tex = letters
        elif letters in _GREEK_LOWER:
            base, tex = _GREEK_LOWER[letters], ("o" if letters == "omicron" else "\\" + letters)
        elif letters in _GREEK_UPPER:
            base = _GREEK_UPPER[letters]
            tex = "\\" + letters if letters in _TEX_UPPER else _latin_twin(letters)
        if base is not None:
            sub = ",".join(s for s in (digits, rest) if s)
            return base, tex, sub, False
    if rest.isdigit() and "_" not in rest:  # an SSA version of a compound name: spike_1
        return head, head, rest, False
    return name, name, "", True


def _latin_twin(greek: str) -> str:
    """The Latin capital a Greek capital looks like (Alpha → A, Beta → B, ...)."""
    return {"Alpha": "A", "Beta": "B", "Epsilon": "E", "Zeta": "Z", "Eta": "H", "Iota": "I", "Kappa": "K",
            "Mu": "M", "Nu": "N", "Omicron": "O", "Rho": "P", "Tau": "T", "Chi": "X"}.get(greek, greek)


def _tex_text(s: str) -> str:
    return s.replace("\\", "").replace("_", "\\_")


# ---------------------------------------------------------------------------------- products
MINUS = "\u2212"
THIN = "0.1667em"  # the space between a number and its unit (2 ms), and between units


def wordy(e: sp.Basic) -> bool:
    """Whether `e` prints as a name of several letters set upright (`spike`, `dt`,
    `not_refractory`, a unit): beside another factor it needs a visible operator, or two
    names would read as one (`V_r spike` as `V_rspike`)."""
    if isinstance(e, UnitSymbol):
        return True
    if isinstance(e, sp.Symbol):
        name = e.name
        if name.startswith("grad_"):
            name = name[5:]
        if _TEMP.fullmatch(name) or name == "_u":
            return False
        base, _, _, compound = split_name(name)
        return compound or len(base) > 1
    if isinstance(e, sp.Pow):
        return wordy(e.args[0])
    if isinstance(e, sp.exp):
        return not simple_exponent(e.args[0])  # exp(...), not a raised e
    if isinstance(e, sp.Function):  # relu(x), max(a, b): a name of several letters too
        return type(e).__name__ not in ("sigmoid", "heaviside", "SurrogateGrad", "Where", "Abs")
    return False


def terms(expr: sp.Add, as_written: bool, ordered: list[sp.Expr]) -> list[sp.Expr]:
    """The terms of a sum in print order: as written, or sympy's order with a positive term
    first where there is one (`v - V_T`, not `-V_T + v`)."""
    if as_written:
        return list(expr.args)
    first = next((i for i, t in enumerate(ordered) if _negated(t) is None), 0)
    return [ordered[first], *ordered[:first], *ordered[first + 1:]]


@dataclass
class Product:
    """A product laid out for printing: a sign, a quantity (a number with units: `0.1 mV⁻¹`),
    the other factors over and under the fraction bar."""

    negative: bool = False
    number: sp.Expr | None = None  # the quantity's number (only where it has units)
    units: list[tuple[sp.Expr, sp.Expr]] = field(default_factory=list)  # (unit, exponent)
    numer: list[sp.Expr] = field(default_factory=list)
    denom: list[sp.Expr] = field(default_factory=list)


def _factors(expr: sp.Expr) -> list[sp.Expr]:
    """The factors of a product, nested products (`a / b / c` as written) flattened."""
    out: list[sp.Expr] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, sp.Mul):
            stack.extend(reversed(e.args))
        else:
            out.append(e)
    return out


def product(expr: sp.Expr) -> Product:
    """`expr` as a `Product`: a leading -1 (or a negative number) is the sign, negative powers
    go under the bar, and unit powers beside the one number of a product form its quantity
    (`0.1 / mV / ms` as written: 0.1 mV⁻¹ ms⁻¹)."""
    p = Product()
    fs = _factors(expr)
    numbers = [f for f in fs if f.is_Number and f != -1]
    has_units = any(_unit_power(f) is not None for f in fs)
    quantity = has_units and len(numbers) == 1
    for f in fs:
        if f.is_Number:
            if f.is_negative:
                p.negative = not p.negative
                f = -f
            if isinstance(f, sp.Rational) and f.q != 1:
                if f.p != 1:
                    p.numer.append(sp.Integer(f.p))
                p.denom.append(sp.Integer(f.q))
            elif quantity:
                p.number = f
            elif f != 1:
                p.numer.append(f)
            continue
        up = _unit_power(f)
        if quantity and up is not None:
            p.units.append(up)
        elif isinstance(f, sp.Pow) and f.args[1].is_Number and f.args[1].is_negative:
            base, ex = f.args
            p.denom.append(base if ex == -1 else sp.Pow(base, -ex, evaluate=False))
        else:
            p.numer.append(f)
    return p


def _unit_power(f: sp.Expr) -> tuple[sp.Expr, sp.Expr] | None:
    if isinstance(f, UnitSymbol):
        return f, sp.Integer(1)
    if isinstance(f, sp.Pow) and isinstance(f.args[0], UnitSymbol) and f.args[1].is_Number:
        return f.args[0], f.args[1]
    return None


def simple_exponent(e: sp.Expr) -> bool:
    """An exponent that reads well raised (`e^{-x}`): no sum, no fraction, no function."""
    for a in sp.preorder_traversal(e):
        if isinstance(a, sp.Add | sp.Function) or (isinstance(a, sp.Pow) and a.args[1].is_negative) or (
                isinstance(a, sp.Rational) and a.q != 1):
            return False
    return True


def number_text(x: sp.Expr) -> tuple[str, str | None]:
    """(mantissa, power of ten or None) of a number, six significant digits (a page shows
    values, the generated code keeps every digit)."""
    if isinstance(x, sp.Integer):
        return str(abs(int(x))), None
    t = f"{abs(float(x)):.6g}"
    if "e" in t:
        m, e = t.split("e")
        return m, str(int(e))
    return t, None


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

    def _print_Detach(self, e):
        return self._call("detach", *e.args)

    def _print_sign(self, e):
        return self._call("sgn", *e.args)

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


def _unsigned(expr: sp.Expr) -> sp.Expr | None:
    """For a product written with a leading negation (`-a`, `-(a + b)`, `(-a)*b/c`), the
    product without it; else None."""
    if not isinstance(expr, sp.Mul) or len(expr.args) < 2:
        return None
    first, rest = expr.args[0], expr.args[1:]
    if first == -1:
        return rest[0] if len(rest) == 1 else sp.Mul(*rest, evaluate=False)
    inner = _unsigned(first)
    if inner is not None:
        return sp.Mul(inner, *rest, evaluate=False)
    return None


def _negated(term: sp.Expr) -> sp.Expr | None:
    """`-term` built structurally when `term` reads as a subtraction (a negative number, or a
    product led by one), else None."""
    if term.is_Number and term.is_negative:
        return -term
    if isinstance(term, sp.Mul) and term.args and term.args[0].is_Number and term.args[0].is_negative:
        c, rest = term.args[0], term.args[1:]
        if c == -1:
            return rest[0] if len(rest) == 1 else sp.Mul(*rest, evaluate=False)
        return sp.Mul(-c, *rest, evaluate=False)
    return None


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


# ---------------------------------------------------------------------------------- LaTeX
class LatexPrinterFlex(LatexPrinter):
    """sympy's LaTeX printer with flexdsl's names and functions (see the module doc); products,
    quantities and exponents laid out as by the MathML printer."""

    def __init__(self, adjoints: Collection[str] = (), order: str | None = None, inline: bool = False) -> None:
        super().__init__({"order": order})
        self.adjoints = set(adjoints)
        self.inline = inline

    def _print_UnitSymbol(self, expr, style="plain"):
        return r"\mathrm{" + _tex_text(expr.label).replace("\u00b5", r"\mu ").replace("\u03a9", r"\Omega ") + "}"

    def _print_Symbol(self, expr, style="plain"):
        name = expr.name
        if name in self.adjoints and name.startswith("grad_"):  # the bar over the whole name, not its index
            stem, sep, sub = self._print_Symbol(sp.Symbol(name[5:])).partition("_{")
            return r"\overline{" + stem + "}" + sep + sub
        m = _TEMP.fullmatch(name)
        if m is not None:
            return r"\tilde{t}" + (f"_{{{m.group(1)}}}" if m.group(1) else "")
        if name == "_u":
            return "u"
        base, tex, sub, compound = split_name(name)
        if compound:
            return r"\mathrm{" + _tex_text(name) + "}"
        if len(base) > 1 and not tex.startswith("\\"):
            tex = r"\mathrm{" + _tex_text(tex) + "}"
        if not sub:
            return tex
        return tex + (f"_{{{sub}}}" if sub.isdigit() else r"_{\mathrm{" + _tex_text(sub) + "}}")

    def _print_Mul(self, expr):
        return self._product(product(expr))

    def _product(self, p: Product) -> str:
        pieces: list[str] = []
        if p.number is not None:
            q = self._number(p.number)
            for u, ex in p.units:
                q += r"\," + self._print(u) + ("" if ex == 1 else "^{" + self._number(ex) + "}")
            pieces.append(q)
        if p.denom:
            num = self._factors(p.numer, alone=not self.inline) if p.numer else "1"
            if self.inline:
                d = p.denom[0]
                if len(p.denom) == 1 and not isinstance(d, sp.Add | sp.Mul) and not (d.is_Number and d.is_negative):
                    den = self._print(d)
                else:
                    den = r"\left(" + self._factors(p.denom, alone=True) + r"\right)"
                pieces.append(f"{num} / {den}")
            else:
                pieces.append(r"\frac{" + num + "}{" + self._factors(p.denom, alone=True) + "}")
        elif p.numer:
            pieces.append(self._factors(p.numer, alone=not pieces and not p.negative))
        return ("- " if p.negative else "") + r" \cdot ".join(pieces)

    def _factors(self, fs: list[sp.Expr], alone: bool = False) -> str:
        if len(fs) == 1 and alone:
            return self._print(fs[0])
        out = ""
        for i, f in enumerate(fs):
            if i:
                out += r" \cdot " if (f.is_Number or wordy(f) or wordy(fs[i - 1])) else " "
            out += self._factor(f)
        return out

    def _factor(self, f: sp.Expr) -> str:
        prec = precedence_traditional(f)
        if _unsigned(f) is not None or (f.is_Number and f.is_negative) or (
                isinstance(f, sp.Mul) and product(f).negative):
            prec = PRECEDENCE["Add"]
        s = self._print(f)
        return r"\left(" + s + r"\right)" if prec <= PRECEDENCE["Mul"] else s

    def _number(self, x: sp.Expr) -> str:
        m, e = number_text(x)
        sign = "-" if x.is_negative else ""
        return sign + (m if e is None else rf"{m} \times 10^{{{e}}}")

    def _print_Integer(self, e):
        return self._number(e)

    def _print_Float(self, e):
        return self._number(e)

    def _print_Rational(self, e):
        return self._number(e) if e.q == 1 else self._product(product(e))

    def _print_Pow(self, e):
        base, ex = e.args
        if ex.is_Number and ex.is_negative:
            return self._product(product(e))
        return super()._print_Pow(e)

    def _print_exp(self, expr, exp=None):
        arg = expr.args[0]
        if self.inline or not simple_exponent(arg):
            return self._call(r"\exp", arg, exp=exp)
        return _power("e^{" + self._print(arg) + "}", exp)

    def _print_Add(self, expr, order=None):
        ts = terms(expr, self.order == "none", [] if self.order == "none" else self._as_ordered_terms(expr, order=order))
        out = self._print(ts[0])
        for t in ts[1:]:
            neg = _negated(t)
            out += (" - " + self._term(neg)) if neg is not None else (" + " + self._term(t))
        return out

    def _term(self, t: sp.Expr) -> str:
        """A term after + or -: parenthesized where it is itself a sum or reads as negative."""
        if isinstance(t, sp.Add) or _unsigned(t) is not None or (t.is_Number and t.is_negative):
            return r"\left(" + self._print(t) + r"\right)"
        return self._print(t)

    def _call(self, name: str, *args: sp.Expr, exp: str | None = None) -> str:
        call = name + r"\left(" + ", ".join(self._print(a) for a in args) + r"\right)"
        return call if exp is None else r"\left(" + call + r"\right)^{" + str(exp) + "}"

    def _print_Abs(self, expr, exp=None):
        s = r"\left\lvert " + self._print(expr.args[0]) + r" \right\rvert"
        return s if exp is None else f"{s}^{{{exp}}}"

    def _print_sigmoid(self, e, exp=None):
        return self._call(r"\sigma", *e.args, exp=exp)

    def _print_relu(self, e, exp=None):
        return self._call(r"\operatorname{relu}", *e.args, exp=exp)

    def _print_fmin(self, e, exp=None):
        return self._call(r"\min", *e.args, exp=exp)

    def _print_fmax(self, e, exp=None):
        return self._call(r"\max", *e.args, exp=exp)

    def _print_clip(self, e, exp=None):
        return self._call(r"\operatorname{clip}", *e.args, exp=exp)

    def _print_heaviside(self, e, exp=None):
        return self._call(r"\Theta", *e.args, exp=exp)

    def _print_Detach(self, e, exp=None):
        return self._call(r"\operatorname{detach}", *e.args, exp=exp)

    def _print_sign(self, e, exp=None):
        return self._call(r"\operatorname{sgn}", *e.args, exp=exp)

    def _print_SurrogateGrad(self, e, exp=None):
        return self._call("S'", *e.args, exp=exp)

    def _print_SpikeGE(self, e, exp=None):
        return _power(r"\left[" + self._print(e.args[0]) + r" \geq 0\right]", exp)

    def _print_SpikeGT(self, e, exp=None):
        return _power(r"\left[" + self._print(e.args[0]) + r" > 0\right]", exp)

    def _print_Where(self, e, exp=None):
        cond, a, b = e.args
        cases = (r"\begin{cases} " + self._print(a) + r" & \text{if } " + self._print(cond) + r" \\ "
                 + self._print(b) + r" & \text{otherwise} \end{cases}")
        return cases if exp is None else r"\left(" + cases + r"\right)^{" + str(exp) + "}"



def _power(s: str, exp: str | None) -> str:
    return s if exp is None else s + "^{" + str(exp) + "}"


def latex(expr: sp.Basic, adjoints: Collection[str] = (), order: str | None = None, inline: bool = False) -> str:
    """`expr` as LaTeX (math mode, no delimiters); `order` and `inline` as for `mathml_inner`."""
    return LatexPrinterFlex(adjoints, order, inline).doprint(expr)


_TEX_SPECIAL = {"\\": r"\textbackslash{}", "_": r"\_", "#": r"\#", "%": r"\%", "&": r"\&", "$": r"\$",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def tex_text(s: str) -> str:
    """Plain text for `\\text{...}`: TeX's special characters escaped (`fast_sigmoid`)."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in s)


def latex_name(name: str) -> str:
    return latex(sp.Symbol(name))


def derivative_latex(state: str) -> str:
    return r"\frac{\mathrm{d}" + latex_name(state) + r"}{\mathrm{d}t}"


__all__ = ["mathml", "mathml_inner", "math_element", "equation", "latex", "latex_name", "derivative_mathml",
           "derivative_latex", "split_name", "UnitSymbol", "MathMLPrinter", "LatexPrinterFlex", "MATHML_NS"]
