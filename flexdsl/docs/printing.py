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

import sympy as sp
from sympy.core.alphabets import greeks
from sympy.printing.latex import LatexPrinter
from sympy.printing.mathml import MathMLPresentationPrinter
from sympy.printing.precedence import PRECEDENCE, precedence_traditional

MATHML_NS = "http://www.w3.org/1998/Math/MathML"

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


# ---------------------------------------------------------------------------------- MathML
class MathMLPrinter(MathMLPresentationPrinter):
    """sympy's presentation printer with flexdsl's names and functions (see the module doc)."""

    def __init__(self, adjoints: Collection[str] = (), order: str | None = None) -> None:
        super().__init__({"order": order})
        self.adjoints = set(adjoints)

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
        bar = (lambda s: "".join(ch + "\u0305" for ch in s)) if overline else (lambda s: s)
        m = _TEMP.fullmatch(name)
        if m is not None:
            t = self._el("mi", text=bar("t\u0303"))
            return self._el("msub", t, self._el("mn", text=m.group(1))) if m.group(1) else t
        if name == "_u":
            return self._el("mi", text=bar("u"))
        base, _, sub, compound = split_name(name)
        mi = self._el("mi", text=bar(base))
        if compound or not sub:
            return mi
        return self._el("msub", mi, self._el("mn" if sub.isdigit() else "mi", text=sub))

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
        args = list(expr.args) if self.order == "none" else self._as_ordered_terms(expr)
        row = self._row(self._print(args[0]))
        for a in args[1:]:
            neg = _negated(a)
            if neg is not None:
                row.appendChild(self._mo("-"))
                row.appendChild(self.parenthesize(neg, PRECEDENCE["Add"]))
            else:
                row.appendChild(self._mo("+"))
                row.appendChild(self.parenthesize(a, PRECEDENCE["Add"]))
        return row

    def _print_Mul(self, expr):
        from sympy.simplify import fraction

        inner = _unsigned(expr)
        if inner is not None and not (isinstance(expr.args[0], sp.Number) and len(expr.args) == 2
                                      and expr.args[1].is_Atom):
            return self._row(self._mo("-"), self.parenthesize(inner, PRECEDENCE["Mul"], strict=True))
        numer, denom = fraction(expr, exact=True)
        if denom is not sp.S.One and denom != 1:
            return self._el("mfrac", self._print(numer), self._print(denom))
        factors = list(expr.args)
        row = self._row()
        if factors and factors[0] == -1 and len(factors) > 1:
            row.appendChild(self._mo("-"))
            factors = factors[1:]
        for i, f in enumerate(factors):
            number = f.is_Number
            if i:
                row.appendChild(self._mo("\u00b7" if number else "\u2062"))
            if i == 0 and _negated(f) is not None and not f.is_Number:  # -a b: no parentheses needed
                row.appendChild(self._print(f))
            else:  # a product inside a product needs none either: (a b) c is a b c
                row.appendChild(self.parenthesize(f, PRECEDENCE["Mul"], strict=isinstance(f, sp.Mul)))
        return row

    def parenthesize(self, item, level, strict=False):
        prec = precedence_traditional(item)
        if _unsigned(item) is not None:
            prec = PRECEDENCE["Add"]
        if prec < level or (not strict and prec <= level):
            return self._fenced(self._print(item))
        return self._print(item)

    def _print_Pow(self, e):
        base, ex = e.args
        if ex == -1:
            return self._el("mfrac", self._el("mn", text="1"), self._print(base))
        return super()._print_Pow(e)

    def _print_Abs(self, expr, exp=None):
        return self._row(self._mo("|"), self._print(expr.args[0]), self._mo("|"))

    def _print_Exp1(self, e):
        return self._el("mi", text="e", mathvariant="normal")

    def _print_exp(self, expr):
        return self._el("msup", self._print_Exp1(None), self._print(expr.args[0]))

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


def mathml_inner(expr: sp.Basic, adjoints: Collection[str] = (), order: str | None = None) -> str:
    """The presentation markup of `expr`, without the `<math>` element. `order="none"` keeps the
    terms as they are (an expression as written); the default orders an evaluated one."""
    return _plain_entities(MathMLPrinter(adjoints, order).doprint(expr))


def math_element(inner: str, display: bool = False, alttext: str = "") -> str:
    """`<math>` around presentation markup."""
    attrs = f' xmlns="{MATHML_NS}"' + (' display="block"' if display else "")
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
    """sympy's LaTeX printer with flexdsl's names and functions (see the module doc)."""

    def __init__(self, adjoints: Collection[str] = (), order: str | None = None) -> None:
        super().__init__({"order": order})
        self.adjoints = set(adjoints)

    def _print_UnitSymbol(self, expr, style="plain"):
        return r"\mathrm{" + _tex_text(expr.label).replace("\u00b5", r"\mu ").replace("\u03a9", r"\Omega ") + "}"

    def _print_Symbol(self, expr, style="plain"):
        name = expr.name
        if name in self.adjoints and name.startswith("grad_"):
            return r"\overline{" + self._print_Symbol(sp.Symbol(name[5:])) + "}"
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
        inner = _unsigned(expr)
        if inner is not None:  # an unevaluated negation: -(a + b), -a b, (-a)/b
            return "- " + self.parenthesize(inner, PRECEDENCE["Mul"], strict=True)
        return super()._print_Mul(expr)

    def _print_Add(self, expr, order=None):
        terms = list(expr.args) if self.order == "none" else self._as_ordered_terms(expr, order=order)
        out = self._print(terms[0])
        for t in terms[1:]:
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


def latex(expr: sp.Basic, adjoints: Collection[str] = (), order: str | None = None) -> str:
    """`expr` as LaTeX (math mode, no delimiters); `order` as for `mathml_inner`."""
    return LatexPrinterFlex(adjoints, order).doprint(expr)


def latex_name(name: str) -> str:
    return latex(sp.Symbol(name))


def derivative_latex(state: str) -> str:
    return r"\frac{\mathrm{d}" + latex_name(state) + r"}{\mathrm{d}t}"


__all__ = ["mathml", "mathml_inner", "math_element", "equation", "latex", "latex_name", "derivative_mathml",
           "derivative_latex", "split_name", "UnitSymbol", "MathMLPrinter", "LatexPrinterFlex", "MATHML_NS"]
