"""How the docs lay out math, shared by the MathML and the LaTeX printers: flexdsl's names
(`v_threshold` → v with subscript "threshold", `tau_m` → τ_m, a compound name upright), units as
written (`UnitSymbol`), and products (`product`: the sign, a quantity `0.1 mV⁻¹`, the factors over
and under the bar, a visible dot beside a name of several letters)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

import sympy as sp
from sympy.core.alphabets import greeks

_GREEK_LOWER = {g: unicodedata.lookup(f"GREEK SMALL LETTER {'LAMDA' if g == 'lambda' else g.upper()}")
                for g in greeks}
_GREEK_UPPER = {g.capitalize(): unicodedata.lookup(f"GREEK CAPITAL LETTER {'LAMDA' if g == 'lambda' else g.upper()}")
                for g in greeks}
# LaTeX has commands only for the capitals that differ from Latin letters
_TEX_UPPER = {"Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega"}
_HEAD = re.compile(r"([A-Za-z]+?)(\d*)")
_TEMP = re.compile(r"_t(?:_?(\d+))?")
_TANGENT = re.compile(r"_d_(.+?)__(.+)")  # e-prop's derivative of y along the step with respect to x (ir/eprop.py)


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


def bookkeeping(name: str) -> str | None:
    """The shown name of a state flexdsl adds for refractoriness and crossings (`_above_threshold`,
    `_steps_since_spike`, their versions: names a model cannot write) without its underscore, set
    apart in sans-serif by the printers; None for any other name (the temporaries `_t…` and the
    spike rule's `_u` have their own forms)."""
    if not name.startswith("_") or name == "_u" or _TEMP.fullmatch(name):
        return None
    return name.lstrip("_")


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
