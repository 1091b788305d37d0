"""Stage 2c: the conversion of a model that writes units to flexdsl's base unit system, before
lowering (`dims.py` defines the base system, `unitcheck.py` checks the dimensions first), and
the values the API takes with a unit (`tau="20 ms"`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import FlexDSLError
from . import ast as A
from .catalog import CONSTANTS, is_unit
from .dims import DIMENSIONLESS, DefinitionStore, Dim, literal_unit, suggest_unit, value_div, value_finite
from .unitcheck import DimFold, DimValue, UnitChecker, expr_text

if TYPE_CHECKING:
    from .model import CheckedModel


# ---------------------------------------------------------------- the conversion
class _Convert(A.ExprFold[tuple[A.Expr, DimValue]]):
    """An expression rewritten in base units: each constant with a unit becomes one number,
    each param or input declared in another unit is multiplied by its factor."""

    def __init__(self, uc: UnitChecker, factors: Mapping[str, Fraction], env: Mapping[str, Dim]) -> None:
        self.uc, self.factors, self.env = uc, factors, env
        self.dims = DimFold(uc, env, None, "", checking=False)

    def _node(self, e: A.Expr, new: A.Expr, kids: tuple[DimValue, ...]) -> tuple[A.Expr, DimValue]:
        d = getattr(self.dims, f"visit_{type(e).__name__}")(e, *kids)
        if d.has_unit and d.const is not None:
            if value_finite(d.const):
                if d.const != 0 and float(d.const) == 0.0:
                    raise self.uc.err(f"`{expr_text(e)}` is too small for a float in base units (it would be 0)",
                                      e.pos, "the smallest float is about 5e-324: rescale the constant")
                return _number(d.const, e), d
        if isinstance(new, A.Quantity):  # (not finite: reported where the quantity was checked)
            raise self.uc.err(f"`{expr_text(e)}` is not a finite number in base units", e.pos)
        return new, d

    def enter(self, node: A.Expr, parent: A.Expr | None) -> None:
        self.dims.enter(node, parent)

    def visit_Num(self, e: A.Num) -> tuple[A.Expr, DimValue]:
        return self._node(e, e, ())

    def visit_Quantity(self, e: A.Quantity) -> tuple[A.Expr, DimValue]:
        return self._node(e, e, ())

    def visit_Name(self, e: A.Name) -> tuple[A.Expr, DimValue]:
        new, d = self._node(e, e, ())
        f = self.factors.get(e.id)
        if e.id in self.env and f is not None and f != 1:
            new = A.BinOp("*", _factor(f, e.pos), e, e.pos)
        return new, d

    def visit_Neg(self, e: A.Neg, a) -> tuple[A.Expr, DimValue]:
        return self._node(e, A.Neg(a[0], e.pos), (a[1],))

    def visit_BinOp(self, e: A.BinOp, a, b) -> tuple[A.Expr, DimValue]:
        return self._node(e, A.BinOp(e.op, a[0], b[0], e.pos), (a[1], b[1]))

    def visit_Call(self, e: A.Call, *args) -> tuple[A.Expr, DimValue]:
        return self._node(e, A.Call(e.func, tuple(a[0] for a in args), e.pos), tuple(a[1] for a in args))

    def visit_Compare(self, e: A.Compare, *vals) -> tuple[A.Expr, DimValue]:
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


def convert(ck: CheckedModel, uc: UnitChecker) -> CheckedModel:
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


def check_units(ck: CheckedModel, definitions: DefinitionStore | None = None) -> CheckedModel:
    """The dimension check of a model with units, and the model converted to base units
    (`definitions`: where unit definitions are kept, see `dims.unit`)."""
    uc = UnitChecker(ck, definitions)
    uc.run()
    return convert(ck, uc)


# ---------------------------------------------------------------- values at the API
def param_value(ck: CheckedModel, name: str, value: Any, definitions: DefinitionStore | None = None) -> Any:
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
        d = DimFold(UnitChecker(ck, definitions), {}, None, "").fold(expr)
    except FlexDSLError as e:
        raise fail(e.reason, e.hint) from None
    if d.dim != want and not (d.zero and not d.has_unit):
        raise fail(f"that is {d.dim}, but `{name}` is {want}")
    base = d.const if d.const is not None else d.number
    if base is None:
        raise fail("not a constant")
    factor = info.factor.get(name, Fraction(1)) if d.has_unit else Fraction(1)  # plain numbers: declared unit
    result = value_div(base, factor)
    if not value_finite(result):
        raise fail("the value is too large for a float")
    if result != 0 and float(result) == 0.0:
        raise fail("the value is too small for a float (it would be 0)")
    return float(result)


def _example(p: A.Param) -> str:
    """The declared default as an example (defaults are numbers in the declared unit once converted)."""
    d = p.default
    return A.to_text(d) if isinstance(d, A.Num) or (isinstance(d, A.Neg) and isinstance(d.operand, A.Num)) else "1"


def value_unit(ck: CheckedModel, name: str) -> str | None:
    """The unit a name's values are exchanged in at the API (None for a model without units)."""
    return ck.units.unit.get(name) if ck.units is not None else None


__all__ = ["check_units", "convert", "param_value", "value_unit"]
