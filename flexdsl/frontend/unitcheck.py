"""Stage 2b: physical units. The dimension check of a model that writes units (the conversion
of its values to flexdsl's base unit system is `convert.py`, the unit definitions `dims.py`).

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
keyword, `alpha`, has the inverse unit of the spike rule's `u`); white noise (`xi`) has the unit
1/sqrt(time), as in Brian2, and the draws `randn()` and `rand()` are dimensionless.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from ..errors import FlexDSLError
from . import ast as A
from .catalog import CONSTANTS, UNIT_BASES, UNIT_PREFIXES, is_unit
from .catalog import SURROGATES as BUILTIN_SURROGATES
from .dims import (
    DIMENSIONLESS,
    MAX_UNIT_POWER,
    TIME,
    DefinitionStore,
    Dim,
    as_fraction,
    exact_exponent,
    exact_value,
    literal_unit,
    model_names,
    show,
    suggest_unit,
    unit,
    unit_text,
    value_add,
    value_div,
    value_finite,
    value_mul,
    value_neg,
    value_pow,
)
from .model import UnitInfo

if TYPE_CHECKING:
    from .model import CheckedModel


# ---------------------------------------------------------------- the check
@dataclass
class DimValue:
    """What the fold knows of a sub-expression: its dimension; whether it is a literal zero
    (which agrees with every unit); its exact value when it is a constant without model
    names (`number`: no unit in it; `const`: units allowed, the value in base units)."""

    dim: Dim
    zero: bool = False
    number: Fraction | float | None = None
    const: Fraction | float | None = None
    has_unit: bool = False


class DimFold(A.ExprFold[DimValue]):
    """The dimension of an expression, raising a located error at the first mismatch. Sums
    are checked at their top (the terms of `a + b - c` together), against `expect` at the
    root when given, else against the unit most of their terms share."""

    def __init__(self, uc: UnitChecker, env: Mapping[str, Dim], expect: Dim | None, what: str,
                 checking: bool = True) -> None:
        self.uc, self.env, self.expect, self.what = uc, env, expect, what
        self.checking = checking
        self.parent: dict[int, A.Expr | None] = {}
        self.memo: dict[int, DimValue] = {}
        self.root: A.Expr | None = None

    def enter(self, node: A.Expr, parent: A.Expr | None) -> None:
        self.parent[id(node)] = parent
        if parent is None:
            self.root = node

    def _keep(self, node: A.Expr, d: DimValue) -> DimValue:
        self.memo[id(node)] = d
        return d

    # leaves
    def visit_Num(self, e: A.Num) -> DimValue:
        v = exact_value(e.text, e.value)
        return self._keep(e, DimValue(DIMENSIONLESS, e.value == 0, v, v))

    def visit_Quantity(self, e: A.Quantity) -> DimValue:
        f, d = self.uc.unit_at(e.unit, e.unit_pos)
        p = exact_exponent(e.power, e.power_text)
        if abs(p) > MAX_UNIT_POWER or p.denominator > 2:
            raise self.uc.err(f"the power of a unit must be a small integer or a half, not {e.power_text}",
                              e.unit_pos, f"e.g. `2 cm**2`; powers up to {MAX_UNIT_POWER}")
        v = exact_value(e.text, e.value)
        c = value_mul(v, value_pow(f, p))
        if not value_finite(c):
            raise self.uc.err(f"`{expr_text(e)}` is too large for a float in base units ({show(d ** p, 'base')})",
                              e.pos, "the largest float is about 1.8e308")
        return self._keep(e, DimValue(d ** p, False, None, c, True))

    def visit_Name(self, e: A.Name) -> DimValue:
        if e.id in self.env:
            return self._keep(e, DimValue(self.env[e.id]))
        if e.id in CONSTANTS:
            return self._keep(e, DimValue(DIMENSIONLESS, False, CONSTANTS[e.id], CONSTANTS[e.id]))
        f, d = self.uc.unit_at(e.id, e.pos)
        return self._keep(e, DimValue(d, False, None, f, True))

    # operators
    def visit_Neg(self, e: A.Neg, a: DimValue) -> DimValue:
        return self._keep(e, DimValue(a.dim, a.zero, value_neg(a.number), value_neg(a.const), a.has_unit))

    def visit_BinOp(self, e: A.BinOp, a: DimValue, b: DimValue) -> DimValue:
        op = e.op
        if op in "+-":
            parent = self.parent.get(id(e))
            top = not (isinstance(parent, A.BinOp) and parent.op in "+-")
            if top and self.checking:
                self._check_sum(e)
            dim = a.dim if not a.zero else b.dim
            num = value_add(a.number, b.number, op)
            const = value_add(a.const, b.const, op)
            return self._keep(e, DimValue(dim, a.zero and b.zero, num, const, a.has_unit or b.has_unit))
        if op == "*":  # (a zero times a quantity with a unit has that unit: `0*v*v/ms` is checked)
            zero = (a.zero and (b.zero or b.dim.dimensionless)) or (b.zero and a.dim.dimensionless)
            return self._keep(e, DimValue(a.dim * b.dim, zero, value_mul(a.number, b.number),
                                    value_mul(a.const, b.const), a.has_unit or b.has_unit))
        if op == "/":
            return self._keep(e, DimValue(a.dim / b.dim, a.zero, value_div(a.number, b.number), value_div(a.const, b.const),
                                    a.has_unit or b.has_unit))
        # **
        has_unit = a.has_unit or b.has_unit
        exponent = b.number if b.number is not None else b.const
        if not self.checking:
            p = as_fraction(exponent) if exponent is not None else Fraction(1)
            return self._keep(e, DimValue(a.dim ** p, False, value_pow(a.number, b.number), value_pow(a.const, b.const), has_unit))
        if not b.dim.dimensionless:
            raise self.uc.err(f"an exponent must be dimensionless, but `{expr_text(e.right)}` is {b.dim}",
                              e.right.pos)
        if a.dim.dimensionless:
            return self._keep(e, DimValue(DIMENSIONLESS, False, value_pow(a.number, b.number), value_pow(a.const, b.const),
                                    has_unit))
        if exponent is None:
            raise self.uc.err(f"`{expr_text(e.left)}` has the unit {a.dim}, so its exponent must be a number, "
                              f"not `{expr_text(e.right)}`", e.right.pos,
                              "a quantity with a unit can only be raised to a constant power")
        p = as_fraction(exponent)
        if abs(p) > 4 * MAX_UNIT_POWER:
            raise self.uc.err(f"`{expr_text(e.left)}` has the unit {a.dim}: its power must be a small number, not "
                              f"{expr_text(e.right)}", e.right.pos, f"powers of a quantity with a unit are limited to "
                              f"{4 * MAX_UNIT_POWER}")
        return self._keep(e, DimValue(a.dim ** p, False, None, value_pow(a.const, p), True))

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
                raise self.uc.err(f"the terms of a sum must have the same unit, but `{expr_text(t)}` is {d.dim} "
                                  f"and `{expr_text(ref_term)}` is {ref}", t.pos, self.uc.hint_for(t, ref))

    def visit_Call(self, e: A.Call, *args: DimValue) -> DimValue:
        f = e.func
        if f in ("exp", "log", "sin", "cos", "tanh", "sigmoid"):
            a = args[0]
            if self.checking and not a.dim.dimensionless:
                raise self.uc.err(f"the argument of `{f}` must be dimensionless, but `{expr_text(e.args[0])}` "
                                  f"is {a.dim}", e.args[0].pos,
                                  "divide by a scale of the same unit, e.g. `exp((v - v_T)/delta_T)`")
            return self._keep(e, DimValue(DIMENSIONLESS, has_unit=a.has_unit))
        if f == "sqrt":
            return self._keep(e, DimValue(args[0].dim ** Fraction(1, 2), has_unit=args[0].has_unit))
        if f in ("abs", "relu"):
            return self._keep(e, DimValue(args[0].dim, args[0].zero, has_unit=args[0].has_unit))
        if f in ("heaviside", "randn", "rand"):
            return self._keep(e, DimValue(DIMENSIONLESS))
        if f == "where":
            vals = list(zip(e.args[1:], args[1:]))
        else:  # min, max, clip
            vals = list(zip(e.args, args))
        d = self._agree(f, vals)
        return self._keep(e, DimValue(d, all(a.zero for _, a in vals), has_unit=any(a.has_unit for _, a in vals)))

    def _agree(self, f: str, vals: list[tuple[A.Expr, DimValue]]) -> Dim:
        real = [(x, d) for x, d in vals if not d.zero]
        if not real:
            return DIMENSIONLESS
        x0, d0 = real[0]
        if not self.checking:
            return d0.dim
        for x, d in real[1:]:
            if d.dim != d0.dim:
                what = "the two values of `where`" if f == "where" else f"the arguments of `{f}`"
                raise self.uc.err(f"{what} must have the same unit, but `{expr_text(x0)}` is {d0.dim} "
                                  f"and `{expr_text(x)}` is {d.dim}", x.pos, self.uc.hint_for(x, d0.dim))
        return d0.dim

    def visit_Compare(self, e: A.Compare, *vals: DimValue) -> DimValue:
        if self.checking:
            self._agree_cmp(e, vals)
        return self._keep(e, DimValue(DIMENSIONLESS))

    def _agree_cmp(self, e: A.Compare, vals: tuple[DimValue, ...]) -> None:
        real = [(x, d) for x, d in zip(e.operands, vals) if not d.zero]
        for (x0, d0), (x, d) in zip(real, real[1:]):
            if d.dim != d0.dim:
                raise self.uc.err(f"a comparison needs the same unit on both sides, but `{expr_text(x0)}` is "
                                  f"{d0.dim} and `{expr_text(x)}` is {d.dim}", x.pos, self.uc.hint_for(x, d0.dim))


def expr_text(e: A.Expr, limit: int = 60) -> str:
    """An expression for a message (long ones shortened)."""
    t = A.to_text(e)
    return t if len(t) <= limit else t[: limit - 3] + "..."



class UnitChecker:
    def __init__(self, ck: CheckedModel, definitions: DefinitionStore | None = None) -> None:
        self.ck = ck
        self.definitions = definitions  # where unit definitions are kept (see `dims.unit`)
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
        return self.err(f"{what} has unit {expected}{also}, but {kind}`{expr_text(e)}` is {got} — expected {expected}",
                        e.pos, self.hint_for(e, expected, got))

    def hint_for(self, e: A.Expr, expected: Dim, got: Dim | None = None) -> str | None:
        noise = next((n.id for n in A.names(e) if n.id in self.ck.noise), None)
        if noise is not None and got is not None:
            return (f"white noise `{noise}` has the unit 1/sqrt(time) (Brian2's meaning): its coefficient needs the "
                    f"unit {expected * Dim.of(TIME) ** Fraction(1, 2)}, e.g. `sigma*sqrt(2/tau)*{noise}` for a "
                    "sigma in the unit of the state")
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
        return unit(name, self.definitions)

    # ------------------------------------------------------------------ folds
    def dim(self, e: A.Expr, env: Mapping[str, Dim], expect: Dim | None = None, what: str = "") -> DimValue:
        d = DimFold(self, env, expect, what).fold(e)
        if expect is not None and not d.zero and d.dim != expect:
            raise self.mismatch(what, expect, e, d.dim)
        return d

    # ------------------------------------------------------------------ the model
    def run(self) -> None:
        ck = self.ck
        self.note_bare_units()
        env: dict[str, Dim] = {}
        self.declarations(env)
        time = env.get("dt", DIMENSIONLESS)
        for name in ck.noise:  # white noise (Brian2's `xi`): 1/sqrt(time)
            env[name] = time ** Fraction(-1, 2)
        self.dims = env
        if ck.equations is not None:
            for ln in ck.equations.lines:
                if isinstance(ln, A.ODE):
                    self.in_ode = True
                    self.dim(ln.value, env, env[ln.state] / time, f"`d{ln.state}/dt`")
                else:
                    env[ln.name] = self.dim(ln.value, env).dim
        self.in_ode = False  # from here on, discrete statements: a stray time is not a missing `/ tau`
        for st in ck.update:
            self.assignment(st, env, "update")
        if ck.refractory is not None:
            self.refractory(ck.refractory, env)
        if ck.spike is not None:
            rule = ck.spike
            left = self.dim(rule.left, env)
            right = self.dim(rule.right, env)
            if not left.zero and not right.zero and left.dim != right.dim:
                raise self.err(f"the spike rule compares `{expr_text(rule.left)}` ({left.dim}) with "
                               f"`{expr_text(rule.right)}` ({right.dim}): both sides need the same unit",
                               rule.right.pos, self.hint_for(rule.right, left.dim))
            u_dim = left.dim if not left.zero else right.dim
            self.surrogate(u_dim, env, A.BinOp("-", rule.left, rule.right, rule.left.pos))
        for st in ck.on_spike:
            self.assignment(st, env, "on spike")
        for name, d in env.items():
            self.info.dim[name] = d

    def declarations(self, env: dict[str, Dim]) -> None:
        """The units of the inputs, the params (in order; `dt` a time) and the states."""
        ck = self.ck
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
        for s in ck.states:
            d = self.dim(s.init, {k: v for k, v in env.items() if k in {q.name for q in ck.params}})
            env[s.name] = d.dim
            if d.zero:
                self.zero_init.add(s.name)
            lit = literal_unit(s.init, env)
            s.meta["unit"] = lit[2] if lit is not None else show(d.dim, "base")
            self.info.unit[s.name] = show(d.dim, "base")

    def refractory(self, rf: A.Refractory, env: dict[str, Dim]) -> None:
        """The refractory period is a time (a number of steps without `dt`)."""
        if rf.period is not None:
            pd = self.dim(rf.period, env)
            if "dt" in env and pd.dim != Dim.of(TIME) and not pd.zero:
                raise self.err(f"the refractory period must be a time, but `{expr_text(rf.period)}` is {pd.dim}",
                               rf.period.pos, "e.g. `refractory 2 ms`")
            if "dt" not in env and not pd.dim.dimensionless:
                raise self.err(f"without `dt`, the refractory period is a number of steps, but "
                               f"`{expr_text(rf.period)}` is {pd.dim}", rf.period.pos,
                               "declare the step, e.g. `param dt = 0.1 ms`, to give the period in time")
        if rf.condition is not None:
            self.dim(rf.condition, env)

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
                               f"`{expr_text(st.value)}` is {d.dim}, but it must be dimensionless", st.value.pos)
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
                               f"dimensionless, but `{expr_text(u_expr)}` is {u_dim}", pos,
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
                                   f"`{expr_text(u_expr)}` is {u_dim}), but `{expr_text(k.value)}` is {d.dim}",
                                   k.value.pos, f"the surrogate's argument (`{name}` with u) must be dimensionless"
                                   + (f": write e.g. `{name}={expr_text(k.value)}/{show(u_dim, 'base')}`"
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
                               f"`{expr_text(defaults[n].value)}`, but `{expr_text(k.value)}` is "
                               f"{self.dim(k.value, env).dim}", k.value.pos,
                               f"d spike / d u must have the unit of 1/u, and u (the spike rule's left side "
                               f"minus its right side) is {u_dim}")
        for k in sd.kwargs:  # the defaults given are checked against the same use
            if k.name in given:
                self.dim(k.value, env)
        self.dim(sd.body, local, DIMENSIONLESS / u_dim, f"the surrogate `{sd.name}` (d spike / d u, u = "
                                                         f"`{expr_text(u_expr)}`)")

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
                raise self.err(f"a unit is written with unit names, `*`, `/` and `**`, not `{expr_text(n)}`",
                               n.pos, "e.g. `input I : nA` or `input I : uA/cm**2`")
        d = DimFold(self, {}, None, "").fold(e)
        exponents = {id(k) for m in A.nodes(e) if isinstance(m, A.BinOp) and m.op == "**" for k in A.nodes(m.right)}
        for n in A.nodes(e):
            if isinstance(n, A.Num) and id(n) not in exponents and n.value != 1:
                raise self.err(f"a unit has no number in it (`{n.text}`)", n.pos,
                               "the unit of an input is like `nA` or `1/ms`")
        assert d.const is not None
        return Fraction(d.const) if not isinstance(d.const, Fraction) else d.const, d.dim



__all__ = ["UnitChecker"]
