"""Stage 3: lowering. A CheckedModel becomes a `StepModel`: sympy SSA assignments for one
step (ODEs discretized, `update` statements, the spike and its reset), simplified and with
common subexpressions shared (sympy.cse).
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy as sp

from ..errors import FlexDSLError
from ..frontend import ast as A
from ..frontend.catalog import FUNCTIONS
from ..frontend.check import CheckedModel
from .functions import CONSTANTS, Detach, SpikeGE, SpikeGT, Where, make
from .integrate import INTEGRATORS, Context, NotApplicable
from .surrogates import BUILTIN_SURROGATES


def sym(name: str) -> sp.Symbol:
    return sp.Symbol(name, real=True)


_CMP = {"<": sp.StrictLessThan, "<=": sp.LessThan, ">": sp.StrictGreaterThan, ">=": sp.GreaterThan,
        "==": sp.Eq, "!=": sp.Ne}


MAX_EXPONENT = 32  # of a constant power of a non-constant base (sympy expands powers)
_NONFINITE = (sp.zoo, sp.oo, -sp.oo, sp.nan)


class ToSympy(A.ExprFold[sp.Expr]):
    """AST -> sympy. With `neuron` given, a value that is not a finite real (x/0, log(0),
    exp(1000), sqrt(-1)...) or a power too large to expand is a located FlexDSLError."""

    def __init__(self, env: Mapping[str, sp.Expr], neuron: A.Neuron | None = None) -> None:
        self.env = env
        self.neuron = neuron

    def fail(self, e: A.Expr, msg: str, hint: str | None = None) -> FlexDSLError:
        n = self.neuron
        assert n is not None
        return FlexDSLError(msg, n.filename, e.pos.line, e.pos.column, n.source, hint)

    def checked(self, e: A.Expr, v: sp.Expr, divides: bool) -> sp.Expr:
        if self.neuron is None:
            return v
        if v.is_number:
            try:
                z = complex(v)
            except (TypeError, ValueError, OverflowError):
                z = complex("nan")
            if not (math.isfinite(z.real) and math.isfinite(z.imag)):
                raise self.fail(e, "this expression is not a finite number (a division by zero, an overflow or "
                                   "log of 0)", "check the constants; values must stay within float range")
            if z.imag != 0:
                raise self.fail(e, "this expression is a complex number", "e.g. sqrt or log of a negative "
                                                                          "constant, or a fractional power of one")
        elif divides and v.has(*_NONFINITE):
            raise self.fail(e, "this expression divides by zero or takes log(0)")
        return v

    def visit_Num(self, e: A.Num) -> sp.Expr:
        v = e.value
        if v.is_integer() and abs(v) < 2**53 and "." not in e.text and "e" not in e.text.lower():
            return sp.Integer(int(v))
        return sp.Float(v)

    def visit_Name(self, e: A.Name) -> sp.Expr:
        if e.id in self.env:
            return self.env[e.id]
        return CONSTANTS[e.id]

    def visit_Neg(self, e: A.Neg, a: sp.Expr) -> sp.Expr:
        return -a

    def visit_BinOp(self, e: A.BinOp, a: sp.Expr, b: sp.Expr) -> sp.Expr:
        try:
            if e.op == "+":
                return self.checked(e, a + b, False)
            if e.op == "-":
                return self.checked(e, a - b, False)
            if e.op == "*":
                return self.checked(e, a * b, False)
            if e.op == "/":
                return self.checked(e, a / b, True)
            return self.checked(e, self.power(e, a, b), True)
        except (ZeroDivisionError, OverflowError) as exc:  # sympy's Float arithmetic raises these
            if self.neuron is None:
                raise
            raise self.fail(e, "this expression divides by zero or overflows") from exc

    def power(self, e: A.BinOp, a: sp.Expr, b: sp.Expr) -> sp.Expr:
        if self.neuron is not None and b.is_number and not a.is_number:
            if abs(complex(b)) > MAX_EXPONENT:
                raise self.fail(e.right, f"the exponent is too large (the limit is {MAX_EXPONENT})",
                                "write exp(k*log(x)) for large powers")
        if self.neuron is not None and a.is_number and b.is_number:
            # constant powers: sympy would compute 9**9**9 exactly; a float overflow is an error
            try:
                size = abs(float(b)) * math.log10(max(abs(float(a)), 1e-300))
            except (TypeError, ValueError, OverflowError):
                size = math.inf
            if not size < 308:
                raise self.fail(e, "this power is too large for a float", "the largest float is about 1.8e308")
        return a**b

    def visit_Call(self, e: A.Call, *args: sp.Expr) -> sp.Expr:
        return self.checked(e, make(e.func, *args), True)

    def visit_Compare(self, e: A.Compare, *vals: sp.Expr) -> sp.Expr:
        parts = [_CMP[op](left, right) for op, left, right in zip(e.ops, vals[:-1], vals[1:])]
        return parts[0] if len(parts) == 1 else sp.And(*parts)


def to_sympy(e: A.Expr, env: Mapping[str, sp.Expr], neuron: A.Neuron | None = None) -> sp.Expr:
    """An AST expression as sympy, with names replaced by env[name]; with `neuron`, values that
    are not finite reals are located errors."""
    return ToSympy(env, neuron).fold(e)


@dataclass
class ParamInfo:
    """A param of the step: declared in the model (`decl`), or derived from the declared ones
    (`decl` None: an entry of a `MatrixExp`, learnable when its definition involves a learnable
    param). Every backend takes the derived params after the declared ones."""

    name: str
    symbol: sp.Symbol
    decl: A.Param | None
    derived_learnable: bool = False

    @property
    def learnable(self) -> bool:
        return self.decl.learnable if self.decl is not None else self.derived_learnable

    @property
    def derived(self) -> bool:
        return self.decl is None


@dataclass
class MatrixExp:
    """Derived params: entries of expm(matrix), where the matrix is made of params only. They are
    computed once per call, numerically (the torch backend's `derived_params`), before any
    backend's program runs, and passed to it like params (with autograd to the declared ones)."""

    states: list[str]  # the coupled states whose propagator this is
    matrix: sp.Matrix
    entries: list[tuple[sp.Symbol, int, int]]  # (symbol, row, column)
    pos: A.Pos  # the equations that need it

    def describe(self) -> str:
        names = ", ".join(s.name for s, _, _ in self.entries)
        rows = ", ".join("[" + ", ".join(sp.sstr(e) for e in self.matrix.row(i)) + "]"
                         for i in range(self.matrix.rows))
        return f"{names} = entries {[(i, j) for _, i, j in self.entries]} of expm([{rows}])"


@dataclass
class SurrogateInfo:
    name: str
    kwargs: dict[str, sp.Expr]  # keyword -> value (numbers or params)
    derivative: sp.Expr  # S'(u) in terms of `u`
    u: sp.Symbol


@dataclass
class StepModel:
    """One discretized step as SSA assignments. Symbols of `inputs`, `states` (previous values)
    and `params` are the free variables; `next_states` and `outputs` are what a step returns."""

    checked: CheckedModel
    inputs: list[sp.Symbol]
    states: list[sp.Symbol]
    params: list[ParamInfo]  # declared, then derived
    assignments: list[tuple[sp.Symbol, sp.Expr]]
    next_states: list[sp.Expr]
    outputs: list[tuple[str, sp.Expr]]
    spike: sp.Symbol | None
    surrogate: SurrogateInfo | None
    method: str | None
    method_auto: bool
    detach_reset: bool
    taken: set[str] = field(default_factory=set)
    origins: dict[str, A.Pos] = field(default_factory=dict)  # SSA name -> source position
    derived: list[MatrixExp] = field(default_factory=list)  # how the derived params are computed

    @property
    def name(self) -> str:
        return self.checked.name

    @property
    def learnable(self) -> list[ParamInfo]:
        return [p for p in self.params if p.learnable]

    @property
    def spike_u(self) -> sp.Expr | None:
        """The `u` the spike fires on (`spike` is `SpikeGE/GT(u)`, times its gates where the model
        is refractory or fires on a crossing)."""
        if self.spike is None:
            return None
        return next(e.args[0] for _, e in self.assignments if isinstance(e, SpikeGE | SpikeGT))

    @property
    def declared_params(self) -> list[ParamInfo]:
        return [p for p in self.params if not p.derived]

    def equations(self) -> list[sp.Eq]:
        eqs = [sp.Eq(y, e, evaluate=False) for y, e in self.assignments]
        return eqs


class NameGen:
    """Unique, readable names for SSA temporaries (never clashing with model names)."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)
        self.next: dict[str, int] = {}  # the next suffix to try per base (names are never freed)

    def new(self, base: str) -> sp.Symbol:
        i = self.next.get(base, 0)
        name = base if i == 0 else f"{base}_{i}"
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.next[base] = i + 1
        self.taken.add(name)
        return sym(name)


def lower(model: CheckedModel, detach_reset: bool = False) -> StepModel:
    """The model's step as sympy SSA assignments. Whatever sympy cannot do with a statement (a
    comparison of values it cannot order, a non-finite constant after folding) is a located
    FlexDSLError, never sympy's own exception."""
    here: list[A.Pos] = [model.ast.pos]
    try:
        step = _lower(model, detach_reset, here)
    except FlexDSLError:
        raise
    except (TypeError, ValueError, ArithmeticError) as e:
        n = model.ast
        raise FlexDSLError(f"this statement cannot be lowered: {str(e).splitlines()[0][:200]}", n.filename,
                           here[0].line, here[0].column, n.source,
                           "simplify the expression (e.g. a `where` inside `min`, `max` or `clip` whose branches "
                           "sympy cannot compare)") from None
    _check_finite_constants(step)
    return step


def _check_finite_constants(step: StepModel) -> None:
    """Every constant of the generated step must be a finite float: sympy folds constants with
    unbounded exponents (`x*1e300*1e300` is `1e600*x`), which a float64 cannot hold."""
    n = step.checked.ast
    for y, e in step.assignments:
        bad = e.has(*_NONFINITE) or any(not _fits_float(c) for c in e.atoms(sp.Number))
        if bad:
            pos = step.origins.get(y.name) or n.pos
            raise FlexDSLError("this statement's constants overflow a float (they fold to a value beyond "
                               "1.8e308)", n.filename, pos.line, pos.column, n.source,
                               "the largest float is about 1.8e308: rescale the constants (or their units)")


def _fits_float(c: sp.Number) -> bool:
    try:
        return math.isfinite(float(c))
    except (TypeError, OverflowError):
        return False


def _lower(model: CheckedModel, detach_reset: bool, here: list[A.Pos]) -> StepModel:
    n = model.ast
    inputs = [sym(i.name) for i in model.inputs]
    states = [sym(s.name) for s in model.states]
    params = [ParamInfo(p.name, sym(p.name), p) for p in model.params]
    taken = {i.name for i in model.inputs} | {s.name for s in model.states} | {p.name for p in model.params}
    taken |= set(model.locals) | set(model.subexprs) | {"spike"} | set(FUNCTIONS) | set(CONSTANTS)
    names = NameGen(taken)
    env: dict[str, sp.Expr] = {s.name: s for s in [*inputs, *states]} | {p.name: p.symbol for p in params}
    assignments: list[tuple[sp.Symbol, sp.Expr]] = []
    origins: dict[str, A.Pos] = {}

    dynamic: set[sp.Symbol] = {*inputs, *states}  # symbols that depend on inputs or states

    def emit(base: str, expr: sp.Expr) -> sp.Expr:
        if expr.is_Atom or expr.is_number:  # constants stay inline (printed as numbers)
            return expr
        y = names.new(base)
        assignments.append((y, expr))
        origins[y.name] = here[0]
        if expr.free_symbols & dynamic:
            dynamic.add(y)
        return y

    subexpr_defs: dict[str, A.Expr] = {}
    if model.equations is not None:
        for ln in model.equations.lines:
            if isinstance(ln, A.Subexpr):
                subexpr_defs[ln.name] = ln.value

    def value(e: A.Expr) -> sp.Expr:
        if not subexpr_defs:
            return to_sympy(e, env, n)
        subs: dict[str, sp.Expr] = {}
        local = ChainMap(subs, env)
        for name, d in subexpr_defs.items():
            subs[name] = to_sympy(d, local, n)
        return to_sympy(e, local, n)

    # the subexpressions' values at the step's start (e.g. alpha_m(v)): a shared temporary that holds one
    # takes its name in the generated code
    named = {value(A.Name(name, A.Pos(0, 0))): name for name in subexpr_defs}

    # -- 0. refractoriness, decided at the start of the step (Brian2's `not_refractory`)
    not_refractory = _refractoriness(model, env, value, emit, here)

    # -- 1. equations
    derived: list[MatrixExp] = []
    method = model.method
    auto = method is None
    if model.equations is not None:
        odes = [ln for ln in model.equations.lines if isinstance(ln, A.ODE)]
        ode_syms = [sym(o.state) for o in odes]
        held = {sym(o.state) for o in odes if o.held}

        rhs_cache: list[dict[sp.Symbol, sp.Expr]] = []

        def rhs_at(values: dict[sp.Symbol, sp.Expr]) -> dict[sp.Symbol, sp.Expr]:
            """The right-hand sides at given state values: built (and checked) once from the
            AST, then substituted for each stage of a method."""
            if not rhs_cache:
                local = dict(env)
                for name, e in subexpr_defs.items():
                    local[name] = to_sympy(e, local, n)
                rhs_cache.append({sym(o.state): to_sympy(o.value, local, n) for o in odes})
            sub = {k: v for k, v in values.items() if k != v}
            return {k: e.xreplace(sub) for k, e in rhs_cache[0].items()} if sub else dict(rhs_cache[0])

        dt = _step(model, env)
        here[0] = model.equations.pos
        constants = {p.symbol for p in params}

        def matrix_exp(states_: list[sp.Symbol], matrix: sp.Matrix, wanted: dict[tuple[int, int], str]
                       ) -> dict[tuple[int, int], sp.Symbol]:
            pos = next(o.pos for o in odes if o.state == states_[0].name)
            out = {k: names.new(base) for k, base in wanted.items()}
            derived.append(MatrixExp([s_.name for s_ in states_], matrix, [(y, i, j) for (i, j), y in out.items()],
                                     pos))
            for y in out.values():
                origins[y.name] = pos
            return out

        ctx = Context(emit, lambda e: e.free_symbols <= constants, matrix_exp)

        def integrate(m: str) -> dict[sp.Symbol, sp.Expr]:
            if held and not_refractory is not None:
                return _integrate_held(m, ode_syms, rhs_at, dt, ctx, held, not_refractory, assignments, derived)
            return INTEGRATORS[m](ode_syms, rhs_at, dt, ctx)

        if auto:  # `exact` where it applies, else `euler`
            try:
                new = integrate("exact")
                method = "exact"
            except NotApplicable:
                method = "euler"
                new = integrate("euler")
        else:
            try:
                new = integrate(method)
            except NotApplicable as e:
                line = next(o for o in odes if o.state == e.state.name)
                raise FlexDSLError(f"method `{method}` does not apply: {e.reason}", n.filename, line.pos.line,
                                   line.pos.column, n.source, e.hint or
                                   "use `method euler`, `rk4` or `exponential_euler` for nonlinear equations") from None
        learnable = {p.symbol for p in params if p.learnable}
        for d in derived:
            dl = bool(d.matrix.free_symbols & learnable)
            params += [ParamInfo(y.name, y, None, dl) for y, _, _ in d.entries]
        for s_, o in zip(ode_syms, odes):
            here[0] = o.pos
            env[s_.name] = emit(s_.name, new[s_])

    # -- 2. update
    for st in model.update:
        here[0] = st.pos
        v = value(st.value)
        cur = env.get(st.target)
        if st.op == "+=":
            v = cur + v
        elif st.op == "-=":
            v = cur - v
        elif st.op == "*=":
            v = cur * v
        elif st.op == "/=":
            v = cur / v
            if v.has(*_NONFINITE):
                raise FlexDSLError("this statement divides by zero", n.filename, st.value.pos.line,
                                   st.value.pos.column, n.source)
        if st.held and not_refractory is not None:
            v = Where(sp.StrictGreaterThan(not_refractory, 0), v, cur)
        env[st.target] = emit(st.target, v)

    # -- 3. spike, 4. on spike
    spike_sym = None
    surrogate = None
    if model.spike is not None:
        rule = model.spike
        here[0] = rule.pos
        u_value = value(rule.left) - value(rule.right)
        if not u_value.free_symbols & dynamic:
            raise FlexDSLError("the spike condition does not depend on any input or state: it is the same at "
                               "every step", n.filename, rule.left.pos.line, rule.left.pos.column, n.source,
                               "compare a state (or an expression of states and inputs) with a threshold")
        u = emit("u_spike", u_value)
        fire = SpikeGE if rule.op == ">=" else SpikeGT  # `crosses`: above (u > 0) now ...
        spike_sym = sym("spike")  # `spike` is reserved: never a model name
        gates: list[sp.Expr] = []
        if not_refractory is not None:
            gates.append(not_refractory)
        if rule.op == "crosses":  # ... and not above at the previous step
            gates.append(1 - Detach(env["_above_threshold"]))
        if gates:
            raw = emit("spike_raw", fire(u))
            assignments.append((spike_sym, sp.Mul(*gates) * raw))
        else:
            assignments.append((spike_sym, fire(u)))
        origins["spike"] = rule.pos
        surrogate = _surrogate(model, env)
        s = spike_sym
        if model.on_spike:
            here[0] = rule.pos
            if detach_reset:
                s = emit("spike_detached", Detach(spike_sym))
            pre = dict(env)
            new_vals: dict[str, sp.Expr] = {}
            for st in model.on_spike:
                subs: dict[str, sp.Expr] = {}
                local = ChainMap(subs, pre)
                for name, d in subexpr_defs.items():
                    subs[name] = to_sympy(d, local, n)
                e = to_sympy(st.value, local, n)
                x = pre[st.target]
                if st.op == "=":
                    new_vals[st.target] = s * e + (1 - s) * x
                elif st.op == "+=":
                    new_vals[st.target] = x + s * e
                else:
                    new_vals[st.target] = x - s * e
            for st in model.on_spike:
                here[0] = st.pos
                env[st.target] = emit(st.target, new_vals[st.target])
        # the bookkeeping states for the next step
        fired = sp.StrictGreaterThan(spike_sym, 0)
        if "_steps_since_spike" in env:
            here[0] = model.refractory.pos  # type: ignore[union-attr]
            env["_steps_since_spike"] = emit("_steps_since_spike", Where(fired, 0, env["_steps_since_spike"]))
        if "_not_refractory" in env:
            here[0] = model.refractory.pos  # type: ignore[union-attr]
            env["_not_refractory"] = emit("_not_refractory", Where(fired, 0, not_refractory))
        if rule.op == "crosses":
            here[0] = rule.pos
            env["_above_threshold"] = emit("_above_threshold", Where(sp.StrictGreaterThan(u, 0), 1, 0))

    # -- 5. outputs
    outputs: list[tuple[str, sp.Expr]] = []
    for name, _ in model.outputs:
        if name == "spike":
            outputs.append((name, spike_sym))
        else:
            outputs.append((name, value(A.Name(name, A.Pos(0, 0)))))
    next_states = [env[s_.name] for s_ in states]
    assignments = share_subexpressions(assignments, names, named)
    return StepModel(model, inputs, states, params, assignments, next_states, outputs, spike_sym, surrogate,
                     method if model.equations is not None else None, auto, detach_reset, names.taken, origins,
                     derived)


def _step(model: CheckedModel, env: Mapping[str, sp.Expr]) -> sp.Expr:
    """The step `dt` in base units (with units, `dt` is a param in its declared unit)."""
    f = model.units.factor.get("dt", 1) if model.units is not None else 1
    return env["dt"] if f == 1 else sp.Rational(f.numerator, f.denominator) * env["dt"]


def _refractoriness(model: CheckedModel, env: dict[str, sp.Expr], value, emit, here: list[A.Pos]
                    ) -> sp.Expr | None:
    """`not_refractory` of this step (1 or 0), as Brian2 computes it before integrating:

    - `refractory PERIOD`: `timestep(t - lastspike, dt) >= timestep(PERIOD, dt)` with Brian2's
      `timestep(x, dt) = int((x + 1e-3 dt)/dt)`; the hidden state `_steps_since_spike` counts
      the steps since the last spike (t - lastspike = steps * dt). Without `dt`, PERIOD is a
      number of steps;
    - `refractory while COND`: `not_refractory or not COND` (a spike sets it to 0; it becomes 1
      again at the first step that starts with COND false), COND on the step's starting values.

    It is a gate without gradient (the surrogate sees `not_refractory * S'(u)`)."""
    rf = model.refractory
    if rf is None:
        return None
    here[0] = rf.pos
    if rf.period is not None:
        steps = emit("steps_since_spike", Detach(env["_steps_since_spike"]) + 1)
        period = value(rf.period)
        if "dt" in env:
            dt = _step(model, env)
            last = (period + dt / 1000) / dt - 1
        else:
            last = period + sp.Rational(1, 1000) - 1
        bound = emit("refractory_steps", last)
        env["_steps_since_spike"] = steps
        return emit("not_refractory", Where(sp.StrictGreaterThan(steps, bound), 1, 0))
    assert rf.condition is not None
    return emit("not_refractory", Where(value(rf.condition), Detach(env["_not_refractory"]), 1))


def _integrate_held(method: str, xs: list[sp.Symbol], rhs_at, dt: sp.Expr, ctx: Context, held: set[sp.Symbol],
                    not_refractory: sp.Expr, assignments: list, derived: list[MatrixExp]
                    ) -> dict[sp.Symbol, sp.Expr]:
    """The step of a system whose `held` states do not move while refractory, with Brian2's
    meaning (`dX/dt = int(not_refractory) * f` for each held X):

    - the explicit methods integrate exactly that right-hand side;
    - `exponential_euler` treats each equation on its own, from the step's starting values, so
      a held state keeps its value and the others are unaffected;
    - `exact` steps both systems (free, and with the held rows 0) and chooses per state (the
      free one where the state is neither held nor driven by a held one)."""
    active = sp.StrictGreaterThan(not_refractory, 0)
    if method not in ("exact", "exponential_euler"):
        def gated(values):
            rhs = rhs_at(values)
            return {x: (not_refractory * f if x in held else f) for x, f in rhs.items()}

        return INTEGRATORS[method](xs, gated, dt, ctx)
    free = INTEGRATORS[method](xs, rhs_at, dt, ctx)
    if method == "exponential_euler":
        return {x: (Where(active, free[x], x) if x in held else free[x]) for x in xs}
    # exact: the states driven by a held one (transitively) need the held system's solution
    rhs = rhs_at({x: x for x in xs})
    driven = set(held)
    changed = True
    while changed:
        changed = False
        for x in xs:
            if x not in driven and rhs[x].free_symbols & driven:
                driven.add(x)
                changed = True
    start, start_derived = len(assignments), len(derived)

    def frozen(values):
        r = rhs_at(values)
        return {x: (sp.Integer(0) if x in held else f) for x, f in r.items()}

    stopped = INTEGRATORS[method](xs, frozen, dt, ctx)
    out = {x: (Where(active, free[x], stopped[x]) if x in driven else free[x]) for x in xs}
    # drop what the held system computed for states that do not need it
    need: set[sp.Symbol] = set()
    for e in out.values():
        need |= e.free_symbols
    for y, e in reversed(assignments[start:]):
        if y in need:
            need |= e.free_symbols
    assignments[start:] = [(y, e) for y, e in assignments[start:] if y in need]
    derived[start_derived:] = [d for d in derived[start_derived:] if any(y in need for y, _, _ in d.entries)]
    return out


def _surrogate(model: CheckedModel, env: Mapping[str, sp.Expr]) -> SurrogateInfo:
    """S'(u) with the keywords' values; a surrogate that is degenerate (not finite, or zero
    everywhere, e.g. `rect(alpha=0)`) is a located error."""
    rs = model.surrogate
    assert rs is not None
    n = model.ast
    u = sym("_u")
    kwargs = {k: to_sympy(v, env, n) for k, v in rs.kwargs.items()}
    pos = rs.pos or n.pos
    try:
        if rs.user is not None:
            local = ChainMap({**kwargs, rs.arg: u}, env)
            deriv = to_sympy(rs.user.body, local, n)
        else:
            deriv = BUILTIN_SURROGATES[rs.name].derivative(u, **kwargs)
        degenerate = deriv.has(*_NONFINITE) or deriv == 0
    except (TypeError, ValueError, ZeroDivisionError):  # sympy refuses e.g. |x| < 1/(2*0)
        degenerate = True
    if degenerate:
        shown = ", ".join(f"{k}={sp.sstr(v)}" for k, v in kwargs.items())
        raise FlexDSLError(f"the surrogate `{rs.name}({shown})` is degenerate: its derivative is not finite or is "
                           "zero everywhere", n.filename, pos.line, pos.column, n.source,
                           "surrogate widths must be finite and nonzero (e.g. alpha > 0)")
    if deriv.free_symbols <= {u}:  # constant keywords: the peak S'(0) must be a usable float
        try:
            peak = float(deriv.subs(u, 0))
        except (TypeError, ValueError, OverflowError):
            peak = math.inf
        shown = ", ".join(f"{k}={sp.sstr(v)}" for k, v in kwargs.items())
        if not abs(peak) <= FLOAT32_MAX:
            raise FlexDSLError(f"the surrogate `{rs.name}({shown})` peaks at S'(0) = {peak:.3g}, beyond float32 "
                               "(about 3.4e38): its gradients would be inf or NaN", n.filename, pos.line,
                               pos.column, n.source, "choose a smaller scale (e.g. alpha between 1 and 100)")
        if rs.user is None and peak <= 0:
            raise FlexDSLError(f"the surrogate `{rs.name}({shown})` has S'(0) = {peak:.3g}: a surrogate's "
                               "derivative must be positive at the threshold, or the gradients point the wrong "
                               "way", n.filename, pos.line, pos.column, n.source, "use a positive scale, e.g. "
                               "alpha=4.0")
    return SurrogateInfo(rs.name, kwargs, deriv, u)


FLOAT32_MAX = 3.4028234663852886e38


def _negation(d: sp.Expr) -> bool:
    return isinstance(d, sp.Mul) and len(d.args) == 2 and d.args[0] == -1 and isinstance(d.args[1], sp.Symbol)


def _inline_negations(repl: list[tuple[sp.Symbol, sp.Expr]], reduced: list[sp.Expr]
                      ) -> tuple[list[tuple[sp.Symbol, sp.Expr]], list[sp.Expr]]:
    """Temporaries that only negate a name, substituted back (sympy then folds the signs)."""
    subs: dict[sp.Symbol, sp.Expr] = {}
    kept = []
    for t, d in repl:
        d = d.xreplace(subs)
        if _negation(d):
            subs[t] = d
        else:
            kept.append((t, d))
    if not subs:
        return repl, reduced
    return kept, [e.xreplace(subs) for e in reduced]


def _name_temporaries(repl: list[tuple[sp.Symbol, sp.Expr]], reduced: list[sp.Expr], named: Mapping[sp.Expr, str],
                      names: NameGen) -> tuple[list[tuple[sp.Symbol, sp.Expr]], list[sp.Expr]]:
    """Temporaries whose value is a quantity the model names take its name."""
    full: dict[sp.Symbol, sp.Expr] = {}
    rename: dict[sp.Symbol, sp.Symbol] = {}
    for t, d in repl:
        full[t] = d.xreplace(full)
        name = named.get(full[t])
        if name is not None:
            rename[t] = names.new(name)
    if not rename:
        return repl, reduced
    return [(rename.get(t, t), d.xreplace(rename)) for t, d in repl], [e.xreplace(rename) for e in reduced]


def share_subexpressions(assignments: list[tuple[sp.Symbol, sp.Expr]], names: NameGen,
                         named: Mapping[sp.Expr, str] | None = None) -> list[tuple[sp.Symbol, sp.Expr]]:
    """sympy.cse over the SSA right-hand sides; each shared temporary is placed just before
    its first use (after every SSA symbol it depends on). A temporary that only negates a name
    (`-v`) is not kept (`E_L - (-v)` reads `v - E_L`); one that holds a quantity the model names
    (`named`: value -> name, e.g. an `equations` subexpression) takes that name."""
    if not assignments:
        return assignments

    def gen():
        while True:
            yield names.new("_t")

    repl, reduced = sp.cse([e for _, e in assignments], symbols=gen(), order="none")
    # constants stay inline: a temporary must never hold a plain number (torch functions take tensors)
    consts: dict[sp.Symbol, sp.Expr] = {}
    kept = []
    for t, d in repl:
        d = d.xreplace(consts)
        if d.is_number:
            consts[t] = d
        else:
            kept.append((t, d))
    if consts:
        repl, reduced = kept, [e.xreplace(consts) for e in reduced]
    repl, reduced = _inline_negations(repl, reduced)
    if named:
        repl, reduced = _name_temporaries(repl, reduced, named, names)
    # a temporary assigned as-is to an SSA name takes that name (no `y = _t` aliases)
    alias: dict[sp.Symbol, sp.Symbol] = {}
    for (y, _), e in zip(assignments, reduced):
        if isinstance(e, sp.Symbol) and e.name.startswith("_t") and e not in alias:
            alias[e] = y
    if alias:
        repl = [(alias.get(t, t), d.xreplace(alias)) for t, d in repl]
        reduced = [e.xreplace(alias) for e in reduced]
    defs = dict(repl)
    out: list[tuple[sp.Symbol, sp.Expr]] = []
    placed: set[sp.Symbol] = set()

    def place(expr: sp.Expr) -> None:
        for s_ in sorted(expr.free_symbols, key=lambda z: z.name):
            if s_ in defs and s_ not in placed:
                place(defs[s_])
                placed.add(s_)
                out.append((s_, defs[s_]))

    for (y, _), e in zip(assignments, reduced):
        if y in defs:  # this SSA value was placed as a shared temporary
            if y not in placed:
                place(defs[y])
                placed.add(y)
                out.append((y, defs[y]))
            continue
        place(e)
        out.append((y, e))
    return out
