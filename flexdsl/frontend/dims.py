"""Dimensions and unit definitions: the algebra of physical dimensions (`Dim`), the units a
model may write and what they mean (scale to flexdsl's base units and dimension, from
`sympy.physics.units`), their names in messages (`show`), how a model writes them (the
sympy-free scan `uses_units`, `literal_unit`), and exact arithmetic on constant values.

The base system is the one of NEST: ms, mV, pA, nS, pF (so `C dv/dt = g (E - v) + I` needs
no constants), with lengths in um (per-area densities near 1: 1.2 nS/um**2 is 120 mS/cm**2)
and concentrations in mM. The dimension check is `unitcheck.py`, the conversion to base units
`convert.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from .._sympy import load as load_sympy
from ..errors import did_you_mean
from . import ast as A
from .catalog import CONSTANTS, UNIT_BASES, UNIT_PREFIXES, is_unit, unit_parts

# ampere, kelvin, mole, candela).
BASE_DIMENSIONS = ("length", "mass", "time", "current", "temperature", "amount_of_substance",
                   "luminous_intensity")

# The base unit system: these units are 1 in it (one per base dimension, mV standing for mass).
BASE_UNITS = ("um", "mV", "ms", "pA", "K", "mM", "cd")

TIME = (0, 0, 1, 0, 0, 0, 0)
MAX_UNIT_POWER = 8


# ---------------------------------------------------------------- dimensions
@dataclass(frozen=True)
class Dim:
    """A dimension: exponents of the SI base dimensions (BASE_DIMENSIONS order)."""

    exps: tuple[Fraction, ...] = (Fraction(0),) * 7

    @staticmethod
    def of(exps) -> Dim:
        return Dim(tuple(Fraction(x) for x in exps))

    def __mul__(self, o: Dim) -> Dim:
        return Dim(tuple(a + b for a, b in zip(self.exps, o.exps)))

    def __truediv__(self, o: Dim) -> Dim:
        return Dim(tuple(a - b for a, b in zip(self.exps, o.exps)))

    def __pow__(self, p: Fraction | int) -> Dim:
        return Dim(tuple(a * Fraction(p) for a in self.exps))

    @property
    def dimensionless(self) -> bool:
        return not any(self.exps)

    def __str__(self) -> str:
        return show(self, "SI")


DIMENSIONLESS = Dim()

# Named units for messages and docs: (SI name, base-system name, exponents over V, A, s, m, K, mol, cd)
_NAMED = [
    ("V", "mV", (1, 0, 0, 0, 0, 0, 0)), ("A", "pA", (0, 1, 0, 0, 0, 0, 0)), ("s", "ms", (0, 0, 1, 0, 0, 0, 0)),
    ("m", "um", (0, 0, 0, 1, 0, 0, 0)), ("S", "nS", (-1, 1, 0, 0, 0, 0, 0)), ("F", "pF", (-1, 1, 1, 0, 0, 0, 0)),
    ("ohm", "GOhm", (1, -1, 0, 0, 0, 0, 0)), ("C", "fC", (0, 1, 1, 0, 0, 0, 0)),
    ("M", "mM", (0, 0, 0, -3, 0, 1, 0)), ("K", "K", (0, 0, 0, 0, 1, 0, 0)), ("mol", "amol", (0, 0, 0, 0, 0, 1, 0)),
    ("cd", "cd", (0, 0, 0, 0, 0, 0, 1)),
]


def _vasm(d: Dim) -> tuple[Fraction, ...]:
    """Exponents over V, A, s, m, K, mol, cd (V carries the mass: V = kg m**2 s**-3 A**-1)."""
    L, M, T, I, Th, N, J = d.exps
    return (M, I + M, T + 3 * M, L - 2 * M, Th, N, J)


def _fmt_power(name: str, p: Fraction) -> str:
    if p == 1:
        return name
    return f"{name}**{p}" if p.denominator == 1 else f"{name}**({p})"


def _fmt(factors: list[tuple[str, Fraction]]) -> str:
    num = [_fmt_power(n, p) for n, p in factors if p > 0]
    den = [_fmt_power(n, -p) for n, p in factors if p < 0]
    top = "*".join(num) or "1"
    if not den:
        return top
    return f"{top}/{den[0]}" if len(den) == 1 else f"{top}/({'*'.join(den)})"


@lru_cache(maxsize=512)
def show(d: Dim, system: str = "SI") -> str:
    """A dimension as a short unit: `V/s`, `A/m**2`, `S`, `1/(V*s)` (system "SI"), or the
    unit of flexdsl's base system (`mV/ms`, `pA/um**2`, `nS`; system "base")."""
    if d.dimensionless:
        return "1"
    col = 0 if system == "SI" else 1
    target = _vasm(d)
    names = [(n[col], n[2]) for n in _NAMED]
    best: tuple | None = None
    powers = [Fraction(p) for p in (1, -1, 2, -2, 3, -3)]
    for i, (n1, v1) in enumerate(names):
        for p1 in powers:
            rest = tuple(t - p1 * a for t, a in zip(target, v1))
            if not any(rest):
                cand = (1, abs(p1), i, [(n1, p1)])
                best = min(best, cand, key=lambda c: c[:3]) if best else cand
                continue
            for j, (n2, v2) in enumerate(names):
                if j <= i:
                    continue
                for p2 in powers:
                    if all(r == p2 * b for r, b in zip(rest, v2)):
                        factors = sorted([(n1, p1), (n2, p2)], key=lambda f: -f[1])
                        cand = (2, abs(p1) + abs(p2), i * 100 + j, factors)
                        best = min(best, cand, key=lambda c: c[:3]) if best else cand
    if best is not None:
        return _fmt(best[3])
    base = [n[col] for n in _NAMED[:4]] + [n[col] for n in _NAMED[9:]]
    order = [0, 1, 2, 3, 4, 5, 6]
    return _fmt([(base[k], target[k]) for k in order if target[k]])


# ---------------------------------------------------------------- unit definitions (sympy)
@lru_cache(maxsize=1)
def _system() -> tuple[Fraction, ...]:
    """The base system's scale of each SI base dimension (an exact solve: every unit of
    BASE_UNITS is 1 in it)."""
    sp = load_sympy()

    rows, logs = [], []
    for name in BASE_UNITS:
        c, e = _si(name)
        rows.append([int(x) for x in e])
        logs.append(c)
    m = sp.Matrix(rows)
    inv = m.inv()
    assert all(x.is_integer for x in inv), "the base units must be a unimodular basis"
    scales = []
    for i in range(7):  # dimension i: prod_U c_U ** inv[i, U]
        s = sp.Integer(1)
        for k in range(7):
            s *= sp.Rational(logs[k].numerator, logs[k].denominator) ** int(inv[i, k])
        scales.append(Fraction(int(s.p), int(s.q)))
    return tuple(scales)


@lru_cache(maxsize=256)
def _si(name: str) -> tuple[Fraction, tuple[Fraction, ...]]:
    """(value in SI base units, dimension exponents) of the unit `name`, from sympy."""
    u = load_sympy("sympy.physics.units")
    convert_to = u.convert_to
    PREFIXES = load_sympy("sympy.physics.units.prefixes").PREFIXES

    if name == "cd":
        q = u.candela
    else:
        parts = unit_parts(name)
        assert parts is not None, name
        prefix, base = parts
        key = UNIT_BASES[base]
        q = u.mole / u.liter if key == "molar" else getattr(u, key)
        if prefix:
            q = PREFIXES[UNIT_PREFIXES[prefix]].scale_factor * q
    base_units = [u.meter, u.kilogram, u.second, u.ampere, u.kelvin, u.mole, u.candela]
    r = convert_to(q, base_units)
    coeff, rest = r.as_coeff_Mul()
    powers = rest.as_powers_dict()
    exps = tuple(Fraction(str(powers.get(b, 0))) for b in base_units)
    return Fraction(str(coeff)), exps


# Where unit definitions may be kept between processes, given by the caller (the pipeline
# passes its disk cache, `store.pipeline.unit_definition`, so that a process that loads a model
# with units seen before does not import sympy): `store(name, make) -> definition`, `make()`
# giving the definition from sympy as JSON-able data. None: from sympy each time.
DefinitionStore = Callable[[str, Callable[[], list]], list]


@lru_cache(maxsize=256)
def unit(name: str, definitions: DefinitionStore | None = None) -> tuple[Fraction, Dim]:
    """(factor to base units, dimension) of a unit name: `unit("nA") == (1000, current)`."""

    def make() -> list:
        c, e = _si(name)
        scales = _system()
        f = c
        for s, x in zip(scales, e):
            f /= s ** int(x) if x.denominator == 1 else Fraction(float(s) ** float(x))
        return [str(f), [str(x) for x in e]]

    data = definitions(name, make) if definitions is not None else make()
    return Fraction(data[0]), Dim(tuple(Fraction(x) for x in data[1]))



def suggest_unit(name: str) -> str | None:
    """A did-you-mean hint for a misspelt unit (`pf` -> `pF`, `msec` -> `ms`...)."""
    same = [u for u in unit_vocabulary() if u.lower() == name.lower()]
    if same:
        return "did you mean " + " or ".join(f"`{u}`" for u in same[:3]) + "? (units are case-sensitive)"
    return did_you_mean(name, unit_vocabulary())


@lru_cache(maxsize=1)
def unit_vocabulary() -> tuple[str, ...]:
    """Unit names for did-you-mean hints (bases, and the prefixed forms of short bases)."""
    names = set(UNIT_BASES)
    for p in UNIT_PREFIXES:
        for b in UNIT_BASES:
            if len(b) <= 3:
                names.add(p + b)
    return tuple(sorted(names))



# ---------------------------------------------------------------- the sympy-free scan
def uses_units(neuron: A.Neuron) -> bool:
    """Whether a model writes units (without importing anything): a number with a unit, an
    input unit, or a bare unit name that no name of the model shadows."""
    names = model_names(neuron)
    for it in neuron.items:
        if isinstance(it, A.Input) and it.unit is not None:
            return True
        shadow = names
        if isinstance(it, A.SurrogateDef):
            shadow = names | {it.arg} | {k.name for k in it.kwargs}
        for e in A.item_exprs(it):
            for n in A.nodes(e):
                if isinstance(n, A.Quantity):
                    return True
                if isinstance(n, A.Name) and n.id not in shadow and n.id not in CONSTANTS and is_unit(n.id):
                    return True
    return False


def model_names(neuron: A.Neuron) -> set[str]:
    """Every name the model defines: inputs, params, states, locals and subexpressions."""
    out: set[str] = set()
    for it in neuron.items:
        if isinstance(it, A.Input | A.Param | A.State):
            out.add(it.name)
        elif isinstance(it, A.Update):
            out |= {s.target for s in it.statements}
        elif isinstance(it, A.Equations):
            out |= {ln.name for ln in it.lines if isinstance(ln, A.Subexpr)}
    return out


# ---------------------------------------------------------------- declared units
def literal_unit(e: A.Expr, shadow: Mapping[str, Any] | set[str]) -> tuple[A.Expr, A.Expr, str] | None:
    """A value written as a number and a unit (`10 ms`, `-70.6 mV`, `120 mS/cm**2`,
    `0.02 / ms`): (the number, with its sign, as an expression; the unit as an expression;
    the unit's text), else None. Names in `shadow` are model names, never units."""
    sign = 1
    node = e
    while isinstance(node, A.Neg):
        sign = -sign
        node = node.operand
    chain: list[tuple[str, A.Expr]] = []
    while isinstance(node, A.BinOp) and node.op in ("*", "/") and _pure_unit(node.right, shadow):
        chain.append((node.op, node.right))
        node = node.left
    chain.reverse()
    if isinstance(node, A.Quantity):
        number: A.Expr = A.Num(node.value, node.text, node.pos)
        head = A.quantity_unit(node)
        unit_e: A.Expr = A.Name(node.unit, node.unit_pos)
        if node.power_text:
            unit_e = A.BinOp("**", unit_e, A.Num(float(node.power_text), node.power_text, node.unit_pos),
                             node.unit_pos)
    elif isinstance(node, A.Num) and chain:
        number, head, unit_e = node, "1", A.Num(1.0, "1", node.pos)
    else:
        return None
    text = head
    for op, r in chain:
        rt = A.to_text(r)
        if isinstance(r, A.BinOp) and r.op in ("*", "/"):
            rt = f"({rt})"
        text = f"{text}{op}{rt}"
        unit_e = A.BinOp(op, unit_e, r, unit_e.pos)
    if sign < 0:
        number = A.Neg(number, e.pos)
    return number, unit_e, text


def _pure_unit(e: A.Expr, shadow) -> bool:
    for n in A.nodes(e):
        if isinstance(n, A.Name):
            if n.id in shadow or not is_unit(n.id):
                return False
        elif isinstance(n, A.BinOp):
            if n.op not in ("*", "/", "**"):
                return False
            if n.op == "**" and any(not isinstance(m, A.Num | A.Neg) for m in [n.right]):
                return False
        elif not isinstance(n, A.Num | A.Neg):
            return False
    return any(isinstance(n, A.Name) for n in A.nodes(e))


def unit_text(e: A.Expr) -> str:
    return A.to_text(e).replace(" ", "")


# ---------------------------------------------------------------- exact values
def exact_value(text: str, value: float) -> Fraction | float:
    """A literal's exact value (its decimal text as a fraction), or the float where the text
    would make a huge fraction (`1e-999999`, a thousand digits)."""
    mantissa, _, exponent = text.lower().partition("e")
    if len(mantissa) > 40 or (exponent and abs(int(exponent)) > 330):
        return value
    return Fraction(text)


def exact_exponent(power: float, text: str) -> Fraction:
    if not text:
        return Fraction(1)
    v = exact_value(text, power)
    if isinstance(v, Fraction):
        return v
    return Fraction(power).limit_denominator(1000) if math.isfinite(power) else Fraction(10**6)


def as_fraction(x: Fraction | float) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(x).limit_denominator(1000)


def value_neg(a):
    return None if a is None else -a


def value_add(a, b, op):
    if a is None or b is None:
        return None
    try:
        return a + b if op == "+" else a - b
    except OverflowError:  # a fraction beyond float range mixed with a float
        return None


def value_mul(a, b):
    if a is None or b is None:
        return None
    try:
        if isinstance(a, float) or isinstance(b, float):
            return float(a) * float(b)
        return a * b
    except OverflowError:
        return None


def value_div(a, b):
    if a is None or b is None or b == 0:
        return None
    try:
        if isinstance(a, float) or isinstance(b, float):
            return float(a) / float(b)
        return a / b
    except (OverflowError, ZeroDivisionError):
        return None


def value_finite(c) -> bool:
    try:
        return c is not None and math.isfinite(float(c))
    except OverflowError:
        return False


def value_pow(a, p):
    if a is None or p is None:
        return None
    try:
        if isinstance(a, Fraction) and isinstance(p, Fraction) and p.denominator == 1 and (a != 0 or p >= 0):
            if abs(p) > 64:
                return float(a) ** float(p)
            return a ** int(p)
        return float(a) ** float(p)
    except (OverflowError, ZeroDivisionError, ValueError):
        return None


__all__ = ["Dim", "DIMENSIONLESS", "BASE_UNITS", "TIME", "show", "unit", "DefinitionStore", "suggest_unit",
           "unit_vocabulary", "uses_units", "model_names", "literal_unit", "unit_text"]
