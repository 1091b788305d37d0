"""Stage 2b: physical units. The dimension check of a model that writes units, and the
conversion of its values to flexdsl's base unit system before lowering.

A model "has units" when it writes a number with a unit (`10 ms`), a bare unit name that is
no model name (`0.02 / ms`) or an input unit (`input I : nA`). A model without units never
reaches the sympy part of this module (loading it stays sympy-free).

The unit definitions (SI prefixes, scale factors, dimensions) are `sympy.physics.units`'s.
The base system is the one of NEST: ms, mV, pA, nS, pF (so `C dv/dt = g (E - v) + I` needs
no constants), with lengths in um (per-area densities near 1: 1.2 nS/um**2 is 120 mS/cm**2)
and concentrations in mM. Every value is converted to it before lowering, so the generated
code computes with plain floats, exactly as a model written without units in those units:

- a number with a unit becomes a number in base units (`-70.6 mV` -> -70.6, `1 uF/cm**2` -> 0.01);
- params and inputs keep the unit they are declared in (the unit written after a param's
  default, `param tau = 0.01 second`, or the input's `: unit`); where that unit is not the
  base unit, the generated code multiplies the name by the constant factor (`1000*I` for an
  input in nA). Overrides (`tau=20`, or `tau="20 ms"`) and the module's attributes are in
  that declared unit;
- states are in base units (their initial value is converted).

The check: `dX/dt` has the unit of X per time (`dt` is a time); both sides of `+`, `-`,
comparisons, `min`, `max`, `clip`, `where` agree (a plain `0` agrees with every unit);
`exp`, `log`, `sin`, `cos`, `tanh`, `sigmoid` take dimensionless arguments; assignments,
resets and `+=` keep a state's unit; a surrogate's argument is dimensionless (its scale
keyword, `alpha`, has the inverse unit of the spike rule's `u`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import FlexDSLError, did_you_mean
from . import ast as A
from .catalog import CONSTANTS, UNIT_BASES, UNIT_PREFIXES, is_unit, unit_parts
from .catalog import SURROGATES as BUILTIN_SURROGATES

if TYPE_CHECKING:
    from .check import CheckedModel

# The SI base dimensions, in the order of their sympy base units (meter, kilogram, second,
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
    import sympy as sp

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
    from sympy.physics import units as u
    from sympy.physics.units import convert_to
    from sympy.physics.units.prefixes import PREFIXES

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


# Where unit definitions are kept between processes: the runtime installs its disk cache here
# (`runtime/compiler.py`), so a process that loads a model with units seen before does not
# import sympy. A store is `store(name, make) -> definition`, `make()` giving the definition
# from sympy as JSON-able data.
DefinitionStore = Callable[[str, Callable[[], list]], list]
_STORE: list[DefinitionStore] = []


def set_definition_store(store: DefinitionStore | None) -> None:
    _STORE[:] = [store] if store is not None else []
    unit.cache_clear()


@lru_cache(maxsize=256)
def unit(name: str) -> tuple[Fraction, Dim]:
    """(factor to base units, dimension) of a unit name: `unit("nA") == (1000, current)`."""

    def make() -> list:
        c, e = _si(name)
        scales = _system()
        f = c
        for s, x in zip(scales, e):
            f /= s ** int(x) if x.denominator == 1 else Fraction(float(s) ** float(x))
        return [str(f), [str(x) for x in e]]

    data = _STORE[0](name, make) if _STORE else make()
    return Fraction(data[0]), Dim(tuple(Fraction(x) for x in data[1]))


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


# ---------------------------------------------------------------- the check
@dataclass
class _D:
    """What the fold knows of a sub-expression: its dimension; whether it is a literal zero
    (which agrees with every unit); its exact value when it is a constant without model
    names (`number`: no unit in it; `const`: units allowed, the value in base units)."""

    dim: Dim
    zero: bool = False
    number: Fraction | float | None = None
    const: Fraction | float | None = None
    has_unit: bool = False


@dataclass
class UnitInfo:
    """The units of a model, for the runtime and the docs (sympy-free data).

    `factor[name]`: the factor from a param's or an input's declared unit to base units;
    `unit[name]`: the unit the API exchanges the value in (declared for params and inputs,
    base for states); `dim[name]`: the dimension of every declared name."""

    factor: dict[str, Fraction] = field(default_factory=dict)
    unit: dict[str, str] = field(default_factory=dict)
    dim: dict[str, Dim] = field(default_factory=dict)


class _Dims(A.ExprFold[_D]):
    """The dimension of an expression, raising a located error at the first mismatch. Sums
    are checked at their top (the terms of `a + b - c` together), against `expect` at the
    root when given, else against the unit most of their terms share."""

    def __init__(self, uc: _UnitChecker, env: Mapping[str, Dim], expect: Dim | None, what: str,
                 checking: bool = True) -> None:
        self.uc, self.env, self.expect, self.what = uc, env, expect, what
        self.checking = checking
        self.parent: dict[int, A.Expr | None] = {}
        self.memo: dict[int, _D] = {}
        self.root: A.Expr | None = None

    def enter(self, node: A.Expr, parent: A.Expr | None) -> None:
        self.parent[id(node)] = parent
        if parent is None:
            self.root = node

    def _keep(self, node: A.Expr, d: _D) -> _D:
        self.memo[id(node)] = d
        return d

    # leaves
    def visit_Num(self, e: A.Num) -> _D:
        v = _exact(e.text, e.value)
        return self._keep(e, _D(DIMENSIONLESS, e.value == 0, v, v))

    def visit_Quantity(self, e: A.Quantity) -> _D:
        f, d = self.uc.unit_at(e.unit, e.unit_pos)
        p = _exponent(e.power, e.power_text)
        if abs(p) > MAX_UNIT_POWER or p.denominator > 2:
            raise self.uc.err(f"the power of a unit must be a small integer or a half, not {e.power_text}",
                              e.unit_pos, f"e.g. `2 cm**2`; powers up to {MAX_UNIT_POWER}")
        v = _exact(e.text, e.value)
        c = _mul(v, _pow(f, p))
        if not _finite(c):
            raise self.uc.err(f"`{_text(e)}` is too large for a float in base units ({show(d ** p, 'base')})",
                              e.pos, "the largest float is about 1.8e308")
        return self._keep(e, _D(d ** p, False, None, c, True))

    def visit_Name(self, e: A.Name) -> _D:
        if e.id in self.env:
            return self._keep(e, _D(self.env[e.id]))
        if e.id in CONSTANTS:
            return self._keep(e, _D(DIMENSIONLESS, False, CONSTANTS[e.id], CONSTANTS[e.id]))
        f, d = self.uc.unit_at(e.id, e.pos)
        return self._keep(e, _D(d, False, None, f, True))

    # operators
    def visit_Neg(self, e: A.Neg, a: _D) -> _D:
        return self._keep(e, _D(a.dim, a.zero, _neg(a.number), _neg(a.const), a.has_unit))

    def visit_BinOp(self, e: A.BinOp, a: _D, b: _D) -> _D:
        op = e.op
        if op in "+-":
            parent = self.parent.get(id(e))
            top = not (isinstance(parent, A.BinOp) and parent.op in "+-")
            if top and self.checking:
                self._check_sum(e)
            dim = a.dim if not a.zero else b.dim
            num = _add(a.number, b.number, op)
            const = _add(a.const, b.const, op)
            return self._keep(e, _D(dim, a.zero and b.zero, num, const, a.has_unit or b.has_unit))
        if op == "*":  # (a zero times a quantity with a unit has that unit: `0*v*v/ms` is checked)
            zero = (a.zero and (b.zero or b.dim.dimensionless)) or (b.zero and a.dim.dimensionless)
            return self._keep(e, _D(a.dim * b.dim, zero, _mul(a.number, b.number),
                                    _mul(a.const, b.const), a.has_unit or b.has_unit))
        if op == "/":
            return self._keep(e, _D(a.dim / b.dim, a.zero, _div(a.number, b.number), _div(a.const, b.const),
                                    a.has_unit or b.has_unit))
        # **
        has_unit = a.has_unit or b.has_unit
        exponent = b.number if b.number is not None else b.const
        if not self.checking:
            p = _as_fraction(exponent) if exponent is not None else Fraction(1)
            return self._keep(e, _D(a.dim ** p, False, _pow(a.number, b.number), _pow(a.const, b.const), has_unit))
        if not b.dim.dimensionless:
            raise self.uc.err(f"an exponent must be dimensionless, but `{_text(e.right)}` is {b.dim}",
                              e.right.pos)
        if a.dim.dimensionless:
            return self._keep(e, _D(DIMENSIONLESS, False, _pow(a.number, b.number), _pow(a.const, b.const),
                                    has_unit))
        if exponent is None:
            raise self.uc.err(f"`{_text(e.left)}` has the unit {a.dim}, so its exponent must be a number, "
                              f"not `{_text(e.right)}`", e.right.pos,
                              "a quantity with a unit can only be raised to a constant power")
        p = _as_fraction(exponent)
        if abs(p) > 4 * MAX_UNIT_POWER:
            raise self.uc.err(f"`{_text(e.left)}` has the unit {a.dim}: its power must be a small number, not "
                              f"{_text(e.right)}", e.right.pos, f"powers of a quantity with a unit are limited to "
                              f"{4 * MAX_UNIT_POWER}")
        return self._keep(e, _D(a.dim ** p, False, None, _pow(a.const, p), True))

    def _check_sum(self, top: A.BinOp) -> None:
        terms: list[A.Expr] = []
        stack: list[A.Expr] = [top]
        while stack:
            n = stack.pop()
            if isinstance(n, A.BinOp) and n.op in "+-":
                stack.append(n.right)
                stack.append(n.left)
            else:
                terms.append(n)
        ds = [(t, self.memo[id(t)]) for t in terms]
        real = [(t, d) for t, d in ds if not d.zero]
        if not real:
            return
        if top is self.root and self.expect is not None:
            for t, d in real:
                if d.dim != self.expect:
                    raise self.uc.mismatch(self.what, self.expect, t, d.dim, term=True)
            return
        counts: dict[Dim, int] = {}
        for _, d in real:
            counts[d.dim] = counts.get(d.dim, 0) + 1
        ref = max(counts, key=lambda k: (counts[k], -next(i for i, (_, d) in enumerate(real) if d.dim == k)))
        ref_term = next(t for t, d in real if d.dim == ref)
        for t, d in real:
            if d.dim != ref:
                raise self.uc.err(f"the terms of a sum must have the same unit, but `{_text(t)}` is {d.dim} "
                                  f"and `{_text(ref_term)}` is {ref}", t.pos, self.uc.hint_for(t, ref))

    def visit_Call(self, e: A.Call, *args: _D) -> _D:
        f = e.func
        if f in ("exp", "log", "sin", "cos", "tanh", "sigmoid"):
            a = args[0]
            if self.checking and not a.dim.dimensionless:
                raise self.uc.err(f"the argument of `{f}` must be dimensionless, but `{_text(e.args[0])}` "
                                  f"is {a.dim}", e.args[0].pos,
                                  "divide by a scale of the same unit, e.g. `exp((v - v_T)/delta_T)`")
            return self._keep(e, _D(DIMENSIONLESS, has_unit=a.has_unit))
        if f == "sqrt":
            return self._keep(e, _D(args[0].dim ** Fraction(1, 2), has_unit=args[0].has_unit))
        if f in ("abs", "relu"):
            return self._keep(e, _D(args[0].dim, args[0].zero, has_unit=args[0].has_unit))
        if f == "heaviside":
            return self._keep(e, _D(DIMENSIONLESS))
        if f == "where":
            vals = list(zip(e.args[1:], args[1:]))
        else:  # min, max, clip
            vals = list(zip(e.args, args))
        d = self._agree(f, vals)
        return self._keep(e, _D(d, all(a.zero for _, a in vals), has_unit=any(a.has_unit for _, a in vals)))

    def _agree(self, f: str, vals: list[tuple[A.Expr, _D]]) -> Dim:
        real = [(x, d) for x, d in vals if not d.zero]
        if not real:
            return DIMENSIONLESS
        x0, d0 = real[0]
        if not self.checking:
            return d0.dim
        for x, d in real[1:]:
            if d.dim != d0.dim:
                what = "the two values of `where`" if f == "where" else f"the arguments of `{f}`"
                raise self.uc.err(f"{what} must have the same unit, but `{_text(x0)}` is {d0.dim} "
                                  f"and `{_text(x)}` is {d.dim}", x.pos, self.uc.hint_for(x, d0.dim))
        return d0.dim

    def visit_Compare(self, e: A.Compare, *vals: _D) -> _D:
        if self.checking:
            self._agree_cmp(e, vals)
        return self._keep(e, _D(DIMENSIONLESS))

    def _agree_cmp(self, e: A.Compare, vals: tuple[_D, ...]) -> None:
        real = [(x, d) for x, d in zip(e.operands, vals) if not d.zero]
        for (x0, d0), (x, d) in zip(real, real[1:]):
            if d.dim != d0.dim:
                raise self.uc.err(f"a comparison needs the same unit on both sides, but `{_text(x0)}` is "
                                  f"{d0.dim} and `{_text(x)}` is {d.dim}", x.pos, self.uc.hint_for(x, d0.dim))


def _text(e: A.Expr, limit: int = 60) -> str:
    """An expression for a message (long ones shortened)."""
    t = A.to_text(e)
    return t if len(t) <= limit else t[: limit - 3] + "..."


def _exact(text: str, value: float) -> Fraction | float:
    """A literal's exact value (its decimal text as a fraction), or the float where the text
    would make a huge fraction (`1e-999999`, a thousand digits)."""
    mantissa, _, exponent = text.lower().partition("e")
    if len(mantissa) > 40 or (exponent and abs(int(exponent)) > 330):
        return value
    return Fraction(text)


def _exponent(power: float, text: str) -> Fraction:
    if not text:
        return Fraction(1)
    v = _exact(text, power)
    if isinstance(v, Fraction):
        return v
    return Fraction(power).limit_denominator(1000) if math.isfinite(power) else Fraction(10**6)


def _as_fraction(x: Fraction | float) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(x).limit_denominator(1000)


def _neg(a):
    return None if a is None else -a


def _add(a, b, op):
    if a is None or b is None:
        return None
    try:
        return a + b if op == "+" else a - b
    except OverflowError:  # a fraction beyond float range mixed with a float
        return None


def _mul(a, b):
    if a is None or b is None:
        return None
    try:
        if isinstance(a, float) or isinstance(b, float):
            return float(a) * float(b)
        return a * b
    except OverflowError:
        return None


def _div(a, b):
    if a is None or b is None or b == 0:
        return None
    try:
        if isinstance(a, float) or isinstance(b, float):
            return float(a) / float(b)
        return a / b
    except (OverflowError, ZeroDivisionError):
        return None


def _finite(c) -> bool:
    try:
        return c is not None and math.isfinite(float(c))
    except OverflowError:
        return False


def _pow(a, p):
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


class _UnitChecker:
    def __init__(self, ck: CheckedModel) -> None:
        self.ck = ck
        self.n = ck.ast
        self.dims: dict[str, Dim] = {}
        self.info = UnitInfo()
        self.zero_init: set[str] = set()
        self.bare_units: set[str] = set()

    # ------------------------------------------------------------------ errors
    def err(self, msg: str, pos: A.Pos, hint: str | None = None) -> FlexDSLError:
        return FlexDSLError(msg, self.n.filename, pos.line, pos.column, self.n.source, hint)

    def mismatch(self, what: str, expected: Dim, e: A.Expr, got: Dim, term: bool = False) -> FlexDSLError:
        also = f" = {show(expected, 'base')}" if show(expected, "base") != str(expected) else ""
        kind = "the term " if term else ""
        return self.err(f"{what} has unit {expected}{also}, but {kind}`{_text(e)}` is {got} — expected {expected}",
                        e.pos, self.hint_for(e, expected, got))

    def hint_for(self, e: A.Expr, expected: Dim, got: Dim | None = None) -> str | None:
        if got is not None and not got.dimensionless and got / expected == Dim.of(TIME):
            if getattr(self, "in_ode", True):
                return "a derivative is per time: divide by a time constant (e.g. `(E_L - v) / tau`)"
            return (f"this term has an extra {got / expected}: `update`, `on spike` and the spike rule compute one "
                    "discrete step, where a time appears only divided by another, e.g. `x * dt / tau`")
        if isinstance(e, A.Name):
            unit_ = show(expected, "base")
            if any(i.name == e.id and i.unit is None for i in self.ck.inputs) and not expected.dimensionless:
                return f"`{e.id}` is an input without a unit: declare it, e.g. `input {e.id} : {unit_}`"
            decl = next((p for p in self.ck.params if p.name == e.id), None)
            if decl is not None and isinstance(decl.default, A.Num) and not expected.dimensionless:
                return f"`{e.id}` is a plain number: give its value a unit, e.g. `param {e.id} = " \
                       f"{decl.default.text} {unit_}`"
            if e.id in self.zero_init:
                return (f"`{e.id}` starts at a plain 0, so it is dimensionless: give its initial value a unit, "
                        f"e.g. `state {e.id} = 0 {show(expected, 'base')}`")
            if e.id in self.bare_units:
                return f"`{e.id}` is the unit {e.id} here: no input, param, state or local of that name is declared"
        if isinstance(e, A.Num) and e.value != 0:
            return f"a plain number is dimensionless: write `{e.text} {show(expected, 'base')}`"
        return None

    def unit_at(self, name: str, pos: A.Pos) -> tuple[Fraction, Dim]:
        if not is_unit(name):
            declared = {it.name for it in self.n.items if isinstance(it, A.Input | A.Param | A.State)}
            if name in declared:
                raise self.err(f"`{name}` is not a unit", pos, f"a number followed by a name is a quantity "
                                                                 f"(`10 ms`); to multiply, write `* {name}`")
            raise self.err(f"unknown unit `{name}`", pos, suggest_unit(name)
                           or "units: " + ", ".join(sorted(set(UNIT_BASES))) + " with a prefix "
                           + " ".join(UNIT_PREFIXES))
        return unit(name)

    # ------------------------------------------------------------------ folds
    def dim(self, e: A.Expr, env: Mapping[str, Dim], expect: Dim | None = None, what: str = "") -> _D:
        d = _Dims(self, env, expect, what).fold(e)
        if expect is not None and not d.zero and d.dim != expect:
            raise self.mismatch(what, expect, e, d.dim)
        return d

    # ------------------------------------------------------------------ the model
    def run(self) -> CheckedModel:
        ck = self.ck
        self.note_bare_units()
        env: dict[str, Dim] = {}
        # inputs
        for i in ck.inputs:
            if i.unit is not None:
                f, d = self.unit_expr(i.unit)
                env[i.name] = d
                self.info.factor[i.name] = f
                text = unit_text(i.unit)
                i.meta["unit"] = text
                self.info.unit[i.name] = text
            else:
                env[i.name] = DIMENSIONLESS
                i.meta["unit"] = "1"
                self.info.unit[i.name] = "1"
        # params, in order
        for p in ck.params:
            lit = literal_unit(p.default, env)
            d = self.dim(p.default, env).dim
            env[p.name] = d
            if lit is not None:
                _, u_expr, text = lit
                f, _ = self.unit_expr(u_expr)
                self.info.factor[p.name] = f
                p.meta["unit"] = text
            else:
                self.info.factor[p.name] = Fraction(1)
                p.meta["unit"] = show(d, "base")
            self.info.unit[p.name] = p.meta["unit"]
            if p.where is not None:
                self.dim(p.where, env)
        if "dt" in env and env["dt"] != Dim.of(TIME):
            p = ck.param("dt")
            raise self.err(f"`dt` is the integration step: it must be a time, but it is {env['dt']}", p.default.pos,
                           "give it a unit of time, e.g. `param dt = 0.1 ms`")
        time = env.get("dt", DIMENSIONLESS)
        # states
        for s in ck.states:
            d = self.dim(s.init, {k: v for k, v in env.items() if k in {q.name for q in ck.params}})
            env[s.name] = d.dim
            if d.zero:
                self.zero_init.add(s.name)
            lit = literal_unit(s.init, env)
            s.meta["unit"] = lit[2] if lit is not None else show(d.dim, "base")
            self.info.unit[s.name] = show(d.dim, "base")
        self.dims = env
        # equations
        if ck.equations is not None:
            for ln in ck.equations.lines:
                if isinstance(ln, A.ODE):
                    self.in_ode = True
                    self.dim(ln.value, env, env[ln.state] / time, f"`d{ln.state}/dt`")
                else:
                    env[ln.name] = self.dim(ln.value, env).dim
        self.in_ode = False  # from here on, discrete statements: a stray time is not a missing `/ tau`
        # update
        for st in ck.update:
            self.assignment(st, env, "update")
        # refractoriness
        rf = ck.refractory
        if rf is not None:
            if rf.period is not None:
                pd = self.dim(rf.period, env)
                if "dt" in env and pd.dim != Dim.of(TIME) and not pd.zero:
                    raise self.err(f"the refractory period must be a time, but `{_text(rf.period)}` is {pd.dim}",
                                   rf.period.pos, "e.g. `refractory 2 ms`")
                if "dt" not in env and not pd.dim.dimensionless:
                    raise self.err(f"without `dt`, the refractory period is a number of steps, but "
                                   f"`{_text(rf.period)}` is {pd.dim}", rf.period.pos,
                                   "declare the step, e.g. `param dt = 0.1 ms`, to give the period in time")
            if rf.condition is not None:
                self.dim(rf.condition, env)
        # the spike rule and its surrogate
        if ck.spike is not None:
            rule = ck.spike
            left = self.dim(rule.left, env)
            right = self.dim(rule.right, env)
            if not left.zero and not right.zero and left.dim != right.dim:
                raise self.err(f"the spike rule compares `{_text(rule.left)}` ({left.dim}) with "
                               f"`{_text(rule.right)}` ({right.dim}): both sides need the same unit",
                               rule.right.pos, self.hint_for(rule.right, left.dim))
            u_dim = left.dim if not left.zero else right.dim
            self.surrogate(u_dim, env, A.BinOp("-", rule.left, rule.right, rule.left.pos))
        for st in ck.on_spike:
            self.assignment(st, env, "on spike")
        for name, d in env.items():
            self.info.dim[name] = d
        return convert(ck, self)

    def note_bare_units(self) -> None:
        names = model_names(self.n)
        for it in self.n.items:
            for e in A.item_exprs(it):
                for n in A.nodes(e):
                    if isinstance(n, A.Name) and n.id not in names and is_unit(n.id):
                        self.bare_units.add(n.id)

    def assignment(self, st: A.Assign, env: dict[str, Dim], where: str) -> None:
        tgt = st.target
        if st.op in ("*=", "/="):
            d = self.dim(st.value, env)
            if not d.dim.dimensionless:
                raise self.err(f"`{tgt} {st.op} ...` would change the unit of `{tgt}`: the factor "
                               f"`{_text(st.value)}` is {d.dim}, but it must be dimensionless", st.value.pos)
            return
        what = f"`{tgt}`" if st.op == "=" else f"`{tgt} {st.op} ...`"
        if tgt in {s.name for s in self.ck.states}:
            self.dim(st.value, env, env[tgt], what)
        elif tgt in env:  # a local assigned again keeps its unit
            self.dim(st.value, env, env[tgt], f"the local {what}")
        else:
            env[tgt] = self.dim(st.value, env).dim

    def surrogate(self, u_dim: Dim, env: dict[str, Dim], u_expr: A.Expr) -> None:
        rs = self.ck.surrogate
        if rs is None:
            return
        given = {k.name: k for k in (self.ck.spike.surrogate.kwargs if self.ck.spike.surrogate else [])}
        pos = rs.pos or self.ck.spike.pos
        if rs.user is None:
            spec = BUILTIN_SURROGATES[rs.name]
            if spec.unitless_arg and not u_dim.dimensionless:
                raise self.err(f"the surrogate `{rs.name}` has no scale keyword, so its argument must be "
                               f"dimensionless, but `{_text(u_expr)}` is {u_dim}", pos,
                               "compare dimensionless values (e.g. `v / v_th > 1`) or use a surrogate with a "
                               f"scale, e.g. `sigmoid(alpha=4/{show(u_dim, 'base')})`")
            for name, k in given.items():
                p = spec.scales.get(name, 0)
                want = u_dim ** p
                d = self.dim(k.value, env)
                if d.dim != want:
                    role = ("dimensionless" if p == 0 else f"{want}, the unit of 1/u" if p == -1
                            else f"{want}, the unit of u" if p == 1 else str(want))
                    raise self.err(f"`{name}` of the surrogate `{rs.name}` must be {role} (u = "
                                   f"`{_text(u_expr)}` is {u_dim}), but `{_text(k.value)}` is {d.dim}",
                                   k.value.pos, f"the surrogate's argument (`{name}` with u) must be dimensionless"
                                   + (f": write e.g. `{name}={_text(k.value)}/{show(u_dim, 'base')}`"
                                      if p == -1 and d.dim.dimensionless else ""))
            return
        sd = rs.user
        local = dict(env)
        local[sd.arg] = u_dim
        for kname, kexpr in rs.kwargs.items():
            local[kname] = self.dim(kexpr, env).dim
        # a keyword given at the spike rule with another unit than its default, where the default
        # fits the body: the error belongs at the spike rule, naming the unit the keyword needs
        defaults = {k.name: k for k in sd.kwargs}
        wrong = [(n, k) for n, k in given.items() if n in defaults
                 and self.dim(k.value, env).dim != self.dim(defaults[n].value, env).dim]
        if wrong:
            with_defaults = {**local, **{n: self.dim(defaults[n].value, env).dim for n, _ in wrong}}
            try:
                self.dim(sd.body, with_defaults, DIMENSIONLESS / u_dim, "")
            except FlexDSLError:
                pass  # the default does not fit either: the body's own error below says why
            else:
                n, k = wrong[0]
                want = self.dim(defaults[n].value, env).dim
                raise self.err(f"`{n}` of the surrogate `{sd.name}` must be {want}, as its default "
                               f"`{_text(defaults[n].value)}`, but `{_text(k.value)}` is "
                               f"{self.dim(k.value, env).dim}", k.value.pos,
                               f"d spike / d u must have the unit of 1/u, and u (the spike rule's left side "
                               f"minus its right side) is {u_dim}")
        for k in sd.kwargs:  # the defaults given are checked against the same use
            if k.name in given:
                self.dim(k.value, env)
        self.dim(sd.body, local, DIMENSIONLESS / u_dim, f"the surrogate `{sd.name}` (d spike / d u, u = "
                                                         f"`{_text(u_expr)}`)")

    def unit_expr(self, e: A.Expr) -> tuple[Fraction, Dim]:
        """A unit written as an expression of unit names (`uA/cm**2`, `1/ms`)."""
        for n in A.nodes(e):
            if isinstance(n, A.Name):
                if not is_unit(n.id):
                    raise self.err(f"`{n.id}` is not a unit", n.pos, suggest_unit(n.id))
            elif isinstance(n, A.Num):
                pass
            elif isinstance(n, A.BinOp) and n.op in ("*", "/", "**"):
                pass
            else:
                raise self.err(f"a unit is written with unit names, `*`, `/` and `**`, not `{_text(n)}`",
                               n.pos, "e.g. `input I : nA` or `input I : uA/cm**2`")
        d = _Dims(self, {}, None, "").fold(e)
        exponents = {id(k) for m in A.nodes(e) if isinstance(m, A.BinOp) and m.op == "**" for k in A.nodes(m.right)}
        for n in A.nodes(e):
            if isinstance(n, A.Num) and id(n) not in exponents and n.value != 1:
                raise self.err(f"a unit has no number in it (`{n.text}`)", n.pos,
                               "the unit of an input is like `nA` or `1/ms`")
        assert d.const is not None
        return Fraction(d.const) if not isinstance(d.const, Fraction) else d.const, d.dim


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


# ---------------------------------------------------------------- the conversion
class _Convert(A.ExprFold[tuple[A.Expr, _D]]):
    """An expression rewritten in base units: each constant with a unit becomes one number,
    each param or input declared in another unit is multiplied by its factor."""

    def __init__(self, uc: _UnitChecker, factors: Mapping[str, Fraction], env: Mapping[str, Dim]) -> None:
        self.uc, self.factors, self.env = uc, factors, env
        self.dims = _Dims(uc, env, None, "", checking=False)

    def _node(self, e: A.Expr, new: A.Expr, kids: tuple[_D, ...]) -> tuple[A.Expr, _D]:
        d = getattr(self.dims, f"visit_{type(e).__name__}")(e, *kids)
        if d.has_unit and d.const is not None:
            if _finite(d.const):
                return _number(d.const, e), d
        if isinstance(new, A.Quantity):  # (not finite: reported where the quantity was checked)
            raise self.uc.err(f"`{_text(e)}` is not a finite number in base units", e.pos)
        return new, d

    def enter(self, node: A.Expr, parent: A.Expr | None) -> None:
        self.dims.enter(node, parent)

    def visit_Num(self, e: A.Num) -> tuple[A.Expr, _D]:
        return self._node(e, e, ())

    def visit_Quantity(self, e: A.Quantity) -> tuple[A.Expr, _D]:
        return self._node(e, e, ())

    def visit_Name(self, e: A.Name) -> tuple[A.Expr, _D]:
        new, d = self._node(e, e, ())
        f = self.factors.get(e.id)
        if e.id in self.env and f is not None and f != 1:
            new = A.BinOp("*", _factor(f, e.pos), e, e.pos)
        return new, d

    def visit_Neg(self, e: A.Neg, a) -> tuple[A.Expr, _D]:
        return self._node(e, A.Neg(a[0], e.pos), (a[1],))

    def visit_BinOp(self, e: A.BinOp, a, b) -> tuple[A.Expr, _D]:
        return self._node(e, A.BinOp(e.op, a[0], b[0], e.pos), (a[1], b[1]))

    def visit_Call(self, e: A.Call, *args) -> tuple[A.Expr, _D]:
        return self._node(e, A.Call(e.func, tuple(a[0] for a in args), e.pos), tuple(a[1] for a in args))

    def visit_Compare(self, e: A.Compare, *vals) -> tuple[A.Expr, _D]:
        return self._node(e, A.Compare(tuple(v[0] for v in vals), e.ops, e.pos), tuple(v[1] for v in vals))


def _number(v: Fraction | float, at: A.Expr) -> A.Expr:
    """A number node for an exact value: integer text where the value is an integer written
    with integers only, else the shortest float text (as a model written in base units has)."""
    ints = all(isinstance(n, A.Name) or (isinstance(n, A.Num | A.Quantity) and _int_text(n.text))
               for n in A.nodes(at) if isinstance(n, A.Num | A.Quantity | A.Name))
    if isinstance(v, Fraction) and v.denominator == 1 and ints:
        return A.Num(float(v), str(v.numerator), at.pos)
    x = float(v)
    return A.Num(x, repr(x), at.pos)


def _factor(f: Fraction, pos: A.Pos) -> A.Expr:
    """An exact factor (`1000`, or `1/100` as a ratio of integers, which sympy keeps exact, so
    that `R/1000 * 1000*I` cancels)."""
    if f.denominator == 1:
        return A.Num(float(f), str(f.numerator), pos)
    return A.BinOp("/", A.Num(float(f.numerator), str(f.numerator), pos),
                   A.Num(float(f.denominator), str(f.denominator), pos), pos)


def _int_text(text: str) -> bool:
    return "." not in text and "e" not in text.lower()


def convert(ck: CheckedModel, uc: _UnitChecker) -> CheckedModel:
    """The checked model with every expression in base units (see the module docstring)."""
    env = uc.dims
    factors = uc.info.factor

    def cv(e: A.Expr, local: Mapping[str, Dim] | None = None, shadowed: frozenset[str] = frozenset()) -> A.Expr:
        own = {k: v for k, v in factors.items() if k not in shadowed}
        return _Convert(uc, own, local if local is not None else env).fold(e)[0]

    def cv_cmp(e: A.Compare) -> A.Compare:
        out = cv(e)
        assert isinstance(out, A.Compare)
        return out

    params = []
    for p in ck.params:
        lit = literal_unit(p.default, env)
        default = lit[0] if lit is not None else cv(p.default)
        params.append(dataclasses.replace(p, default=default,
                                          where=cv_cmp(p.where) if p.where is not None else None))
    states = [dataclasses.replace(s, init=cv(s.init)) for s in ck.states]
    eqs = ck.equations
    if eqs is not None:
        eqs = dataclasses.replace(eqs, lines=[dataclasses.replace(ln, value=cv(ln.value)) for ln in eqs.lines])
    update = [dataclasses.replace(st, value=cv(st.value)) for st in ck.update]
    on_spike = [dataclasses.replace(st, value=cv(st.value)) for st in ck.on_spike]
    spike = ck.spike
    if spike is not None:
        spike = dataclasses.replace(spike, left=cv(spike.left), right=cv(spike.right))
    sur = ck.surrogate
    if sur is not None:
        user = sur.user
        if user is not None:
            shadowed = frozenset({user.arg, *(k.name for k in user.kwargs)})
            local = dict(env)
            for k in shadowed:  # (the check is done: their dimensions do not matter here)
                local[k] = DIMENSIONLESS
            user = dataclasses.replace(user, body=cv(user.body, local, shadowed),
                                       kwargs=[dataclasses.replace(k, value=cv(k.value)) for k in user.kwargs])
        sur = dataclasses.replace(sur, kwargs={k: cv(v) for k, v in sur.kwargs.items()}, user=user)
    rf = ck.refractory
    if rf is not None:
        rf = dataclasses.replace(rf, period=cv(rf.period) if rf.period is not None else None,
                                 condition=cv_cmp(rf.condition) if rf.condition is not None else None)
    return dataclasses.replace(ck, params=params, states=states, equations=eqs, update=update, on_spike=on_spike,
                               spike=spike, surrogate=sur, refractory=rf, units=uc.info)


def check_units(ck: CheckedModel) -> CheckedModel:
    """The dimension check of a model with units, and the model converted to base units."""
    return _UnitChecker(ck).run()


# ---------------------------------------------------------------- values at the API
def param_value(ck: CheckedModel, name: str, value: Any) -> Any:
    """A param value given to `load` or assigned: numbers are in the param's declared unit; in
    a model with units, a string is a value with a unit (`"20 ms"`), converted to the declared
    unit. (Anything else, and strings for a model without units, is returned as it is.)"""
    if not isinstance(value, str) or ck.units is None:
        return value
    decl = next(p for p in ck.params if p.name == name)
    info = ck.units
    unit_ = info.unit.get(name, "1")
    want = info.dim.get(name, DIMENSIONLESS)

    def fail(reason: str, hint: str | None = None) -> FlexDSLError:
        example = f"\"{_example(decl)} {unit_}\"" if unit_ != "1" else "2.0"
        return FlexDSLError(f"`{name}` takes a number (in {unit_}) or a value with a unit, not {value!r}: {reason}",
                            ck.filename, decl.pos.line, decl.pos.column, ck.source, hint or f"e.g. {name}={example}")

    text = value.strip()
    if not text or any(ch in text for ch in "\n\r\"#\x00"):
        raise fail("not a number with a unit")
    from .parse import parse

    try:
        tree = parse(f"neuron Value:\n    input x\n    param value = {text}\n", "<value>")
    except FlexDSLError as e:
        raise fail(e.reason) from None
    decl_v = next(it for it in tree.items if isinstance(it, A.Param))
    expr = decl_v.default
    if decl_v.where is not None or decl_v.learnable or decl_v.doc or len(tree.items) != 2:
        raise fail("not a number with a unit")
    for n in A.nodes(expr):
        if isinstance(n, A.Name) and n.id not in CONSTANTS and not is_unit(n.id):
            raise fail(f"`{n.id}` is not a unit", suggest_unit(n.id))
        if isinstance(n, A.Quantity) and not is_unit(n.unit):
            raise fail(f"`{n.unit}` is not a unit", suggest_unit(n.unit))
        if isinstance(n, A.Call | A.Compare):
            raise fail("not a number with a unit")
    try:
        d = _Dims(_UnitChecker(ck), {}, None, "").fold(expr)
    except FlexDSLError as e:
        raise fail(e.reason, e.hint) from None
    if d.dim != want and not (d.zero and not d.has_unit):
        raise fail(f"that is {d.dim}, but `{name}` is {want}")
    base = d.const if d.const is not None else d.number
    if base is None:
        raise fail("not a constant")
    factor = info.factor.get(name, Fraction(1)) if d.has_unit else Fraction(1)  # plain numbers: declared unit
    result = _div(base, factor)
    if not _finite(result):
        raise fail("the value is too large for a float")
    return float(result)


def _example(p: A.Param) -> str:
    """The declared default as an example (defaults are numbers in the declared unit once converted)."""
    d = p.default
    return A.to_text(d) if isinstance(d, A.Num) or (isinstance(d, A.Neg) and isinstance(d.operand, A.Num)) else "1"


def value_unit(ck: CheckedModel, name: str) -> str | None:
    """The unit a name's values are exchanged in at the API (None for a model without units)."""
    return ck.units.unit.get(name) if ck.units is not None else None


__all__ = ["check_units", "uses_units", "param_value", "value_unit", "show", "unit", "Dim", "UnitInfo",
           "literal_unit", "BASE_UNITS"]
