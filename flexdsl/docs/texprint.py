"""The docs' LaTeX printer: sympy's, taught flexdsl's names and functions, with products,
quantities and exponents laid out as the MathML printer lays them out (`layout.py`)."""

from __future__ import annotations

from collections.abc import Collection

import sympy as sp
from sympy.printing.latex import LatexPrinter
from sympy.printing.precedence import PRECEDENCE, precedence_traditional

from .layout import (
    _TANGENT,
    _TEMP,
    Product,
    _negated,
    _tex_text,
    _unsigned,
    bookkeeping,
    number_text,
    product,
    simple_exponent,
    split_name,
    terms,
    wordy,
)


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
        d = _TANGENT.fullmatch(name)
        if d is not None:  # (e-prop's derivatives along the step: dy/dx)
            return (r"\frac{\partial " + self._print_Symbol(sp.Symbol(d.group(1))) + r"}{\partial "
                    + self._print_Symbol(sp.Symbol(d.group(2))) + "}")
        kept = bookkeeping(name)
        if kept is not None:
            return r"\mathsf{" + _tex_text(kept) + "}"
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

    def _print_Detach(self, e, exp=None):  # the stop-gradient: the value, no gradient through it
        return self._call(r"\operatorname{sg}", *e.args, exp=exp)

    def _print_sign(self, e, exp=None):
        return self._call(r"\operatorname{sgn}", *e.args, exp=exp)

    # a step's draws: a standard normal, a uniform in (0, 1) (anew at every step and element)
    def _print_Randn(self, e, exp=None):
        return self._call(r"\mathcal{N}", sp.Integer(0), sp.Integer(1), exp=exp)

    def _print_Rand(self, e, exp=None):
        return self._call(r"\mathcal{U}", sp.Integer(0), sp.Integer(1), exp=exp)

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


__all__ = ["LatexPrinterFlex", "latex", "latex_name", "derivative_latex", "tex_text"]
