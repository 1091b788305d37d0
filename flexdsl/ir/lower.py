"""Stage 3: lowering. A CheckedModel becomes a `StepModel`: sympy SSA assignments for one
step (ODEs discretized, `update` statements, the spike and its reset), simplified and with
common subexpressions shared (sympy.cse).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy as sp

from ..errors import FlexDSLError
from ..frontend import ast as A
from ..frontend.catalog import DRAWS, FUNCTIONS
from ..frontend.check import CheckedModel
from . import constants
from .functions import CONSTANTS, DRAW_CLASSES, TNOW, Detach, SpikeGE, SpikeGT, Where
from .integrate import INTEGRATORS, Context, MatrixExp, NotApplicable, integrate_held
from .noise import Stochastic, integrate_noisy, split
from .surrogates import SurrogateInfo, surrogate_info
from .tosympy import MAX_EXPONENT, NONFINITE, ToSympy, sym, to_sympy


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
    matrix_exps: list[MatrixExp] = field(default_factory=list)  # how the derived params are computed
    draws: int = 0  # random draws per step and element (`Randn/Rand(k, TNOW)`, k < draws): 0, a model without noise

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
    constants.check(step)
    constants.normalize(step)
    return step


def _lower(model: CheckedModel, detach_reset: bool, here: list[A.Pos]) -> StepModel:
    return _Lowering(model, detach_reset, here).run()


class _Lowering:
    """One lowering: the environment (each name's current value), the SSA assignments emitted
    so far with their source positions (`here[0]`: the statement being lowered, for errors),
    and the derived params' matrix exponentials."""

    def __init__(self, model: CheckedModel, detach_reset: bool, here: list[A.Pos]) -> None:
        self.model, self.n, self.detach_reset, self.here = model, model.ast, detach_reset, here
        self.inputs = [sym(i.name) for i in model.inputs]
        self.states = [sym(s.name) for s in model.states]
        self.params = [ParamInfo(p.name, sym(p.name), p) for p in model.params]
        taken = {i.name for i in model.inputs} | {s.name for s in model.states} | {p.name for p in model.params}
        taken |= set(model.locals) | set(model.subexprs) | {"spike"} | set(FUNCTIONS) | set(CONSTANTS) | set(DRAWS)
        self.names = NameGen(taken)
        self.draw_syms: dict[tuple[int, int], sp.Expr] = {}  # a draw's call site -> its SSA symbol
        self.env: dict[str, sp.Expr] = ({s.name: s for s in [*self.inputs, *self.states]}
                                        | {p.name: p.symbol for p in self.params})
        self.assignments: list[tuple[sp.Symbol, sp.Expr]] = []
        self.origins: dict[str, A.Pos] = {}
        # symbols that depend on inputs, states or draws (the step)
        self.dynamic: set[sp.Symbol] = {*self.inputs, *self.states, TNOW}
        self.subexpr_defs: dict[str, A.Expr] = {}
        self.noisy_subexprs: set[str] = set()  # subexpressions that hold white noise (only ODEs read them)
        if model.equations is not None:
            for ln in model.equations.lines:
                if isinstance(ln, A.Subexpr):
                    self.subexpr_defs[ln.name] = ln.value
                    if any(nm.id in model.noise or nm.id in self.noisy_subexprs for nm in A.names(ln.value)):
                        self.noisy_subexprs.add(ln.name)
        self.n_draws = 0
        self.matrix_exps: list[MatrixExp] = []
        self.not_refractory: sp.Expr | None = None

    def emit(self, base: str, expr: sp.Expr) -> sp.Expr:
        """An SSA assignment `base = expr` (a fresh name); constants stay inline."""
        if expr.is_Atom or expr.is_number:  # constants stay inline (printed as numbers)
            return expr
        y = self.names.new(base)
        self.assignments.append((y, expr))
        self.origins[y.name] = self.here[0]
        if expr.free_symbols & self.dynamic:
            self.dynamic.add(y)
        return y

    def value(self, e: A.Expr) -> sp.Expr:
        """An expression's value now (the equations' subexpressions at the current values)."""
        n = self.n
        if not self.subexpr_defs:
            return to_sympy(e, self.env, n, self.draw)
        subs: dict[str, sp.Expr] = {}
        local = ChainMap(subs, self.env)
        for name, d in self.subexpr_defs.items():
            if name not in self.noisy_subexprs:
                subs[name] = to_sympy(d, local, n)
        return to_sympy(e, local, n, self.draw)

    def new_draw(self, kind: str, base: str) -> sp.Expr:
        """The next draw of the step (`kind` "randn" or "rand"), as an SSA value."""
        k = self.n_draws
        self.n_draws += 1
        return self.emit(base, DRAW_CLASSES[kind](sp.Integer(k), TNOW))

    def draw(self, e: A.Call) -> sp.Expr:
        """The value of the draw `randn()`/`rand()` written at `e` (the same call site, the same draw)."""
        key = (e.pos.line, e.pos.column)
        if key not in self.draw_syms:
            self.draw_syms[key] = self.new_draw(e.func, e.func)
        return self.draw_syms[key]

    def run(self) -> StepModel:
        model = self.model
        # the subexpressions' values at the step's start (e.g. alpha_m(v)): a shared temporary that holds
        # one takes its name in the generated code
        named = {self.value(A.Name(name, A.Pos(0, 0))): name for name in self.subexpr_defs
                 if name not in self.noisy_subexprs}
        # -- 0. refractoriness, decided at the start of the step (Brian2's `not_refractory`)
        self.not_refractory = _refractoriness(model, self.env, self.value, self.emit, self.here)
        method = model.method
        if model.equations is not None:  # -- 1. equations
            method = self.equations(model.equations)
        self.update()  # -- 2. update
        spike_sym, surrogate = self.spike() if model.spike is not None else (None, None)  # -- 3., 4.
        outputs: list[tuple[str, sp.Expr]] = []  # -- 5. outputs
        for name, _ in model.outputs:
            if name == "spike":
                outputs.append((name, spike_sym))
            else:
                outputs.append((name, self.value(A.Name(name, A.Pos(0, 0)))))
        next_states = [self.env[s_.name] for s_ in self.states]
        assignments = share_subexpressions(self.assignments, self.names, named)
        return StepModel(model, self.inputs, self.states, self.params, assignments, next_states, outputs, spike_sym,
                         surrogate, method if model.equations is not None else None, model.method is None,
                         self.detach_reset, self.names.taken, self.origins, self.matrix_exps, self.n_draws)

    # ------------------------------------------------------------------ 1. equations
    def equations(self, eqs: A.Equations) -> str:
        """The ODEs discretized by the model's method (automatic: `exact` where it applies, else
        `euler`); the method used."""
        model, n, env, here = self.model, self.n, self.env, self.here
        odes = [ln for ln in eqs.lines if isinstance(ln, A.ODE)]
        ode_syms = [sym(o.state) for o in odes]
        dt = _dt_in_base_units(model, env)
        here[0] = eqs.pos
        rhs_at = self.right_hand_sides(odes)
        constants = {p.symbol for p in self.params}
        ctx = Context(self.emit, lambda e: e.free_symbols <= constants, self.request_matrix_exp(odes))
        held = {sym(o.state) for o in odes if o.held}

        sto = self.stochastic(odes, ode_syms, rhs_at, dt) if model.noise else None

        def integrate(m: str) -> dict[sp.Symbol, sp.Expr]:
            if sto is not None:
                return integrate_noisy(m, sto, dt, ctx, held, self.not_refractory)
            if held and self.not_refractory is not None:
                return integrate_held(m, ode_syms, rhs_at, dt, ctx, held, self.not_refractory, self.assignments,
                                      self.matrix_exps)
            return INTEGRATORS[m](ode_syms, rhs_at, dt, ctx)

        method = model.method
        if method is None:  # `exact` where it applies, else `euler` (with multiplicative noise `heun`, as Brian2)
            try:
                new = integrate("exact")
                method = "exact"
            except NotApplicable:
                method = "euler" if sto is None or sto.additive else "heun"
                new = integrate(method)
        else:
            try:
                new = integrate(method)
            except NotApplicable as e:
                line = next(o for o in odes if o.state == e.state.name)
                raise FlexDSLError(f"method `{method}` does not apply: {e.reason}", n.filename, line.pos.line,
                                   line.pos.column, n.source, e.hint or
                                   "use `method euler`, `rk4` or `exponential_euler` for nonlinear equations") from None
        learnable = {p.symbol for p in self.params if p.learnable}
        for d in self.matrix_exps:
            dl = bool(d.matrix.free_symbols & learnable)
            self.params += [ParamInfo(y.name, y, None, dl) for y, _, _ in d.entries]
        for s_, o in zip(ode_syms, odes):
            here[0] = o.pos
            env[s_.name] = self.emit(s_.name, new[s_])
        return method

    def stochastic(self, odes: list[A.ODE], ode_syms: list[sp.Symbol], rhs_at, dt: sp.Expr) -> Stochastic:
        """The equations' white noise: a normal draw per source (its Wiener increment sqrt(dt)*N), and
        the right-hand sides split into drift and noise coefficients (a located error where noise does
        not enter linearly)."""
        n, model = self.n, self.model
        lines = [ln for ln in model.equations.lines]  # type: ignore[union-attr]
        dW: dict[sp.Symbol, sp.Expr] = {}
        for name in model.noise:  # in order of first use: the draws' indices follow the model text
            self.here[0] = next(ln.pos for ln in lines if any(nm.id == name for nm in A.names(ln.value)))
            dW[sym(name)] = sp.sqrt(dt) * self.new_draw("randn", f"randn_{name}")
        try:
            return split(ode_syms, rhs_at, list(dW), dW)
        except NotApplicable as e:
            line = next(o for o in odes if o.state == e.state.name)
            raise FlexDSLError(e.reason, n.filename, line.pos.line, line.pos.column, n.source, e.hint) from None

    def right_hand_sides(self, odes: list[A.ODE]):
        """`rhs_at(values)`: the right-hand sides at given state values, built (and checked) once
        from the AST, then substituted for each stage of a method."""
        n, env, subexpr_defs = self.n, self.env, self.subexpr_defs
        rhs_cache: list[dict[sp.Symbol, sp.Expr]] = []

        def rhs_at(values: dict[sp.Symbol, sp.Expr]) -> dict[sp.Symbol, sp.Expr]:
            if not rhs_cache:
                local = dict(env) | {name: sym(name) for name in self.model.noise}
                for name, e in subexpr_defs.items():
                    local[name] = to_sympy(e, local, n)
                rhs_cache.append({sym(o.state): to_sympy(o.value, local, n) for o in odes})
            sub = {k: v for k, v in values.items() if k != v}
            return {k: e.xreplace(sub) for k, e in rhs_cache[0].items()} if sub else dict(rhs_cache[0])

        return rhs_at

    def request_matrix_exp(self, odes: list[A.ODE]):
        """What an integrator calls for entries of a param-only matrix exponential: derived params."""

        def matrix_exp(states_: list[sp.Symbol], matrix: sp.Matrix, wanted: dict[tuple[int, int], str]
                       ) -> dict[tuple[int, int], sp.Symbol]:
            pos = next(o.pos for o in odes if o.state == states_[0].name)
            out = {k: self.names.new(base) for k, base in wanted.items()}
            self.matrix_exps.append(MatrixExp([s_.name for s_ in states_], matrix,
                                              [(y, i, j) for (i, j), y in out.items()], pos))
            for y in out.values():
                self.origins[y.name] = pos
            return out

        return matrix_exp

    # ------------------------------------------------------------------ 2. update
    def update(self) -> None:
        n, env = self.n, self.env
        for st in self.model.update:
            self.here[0] = st.pos
            v = self.value(st.value)
            cur = env.get(st.target)
            if st.op == "+=":
                v = cur + v
            elif st.op == "-=":
                v = cur - v
            elif st.op == "*=":
                v = cur * v
            elif st.op == "/=":
                v = cur / v
                if v.has(*NONFINITE):
                    raise FlexDSLError("this statement divides by zero", n.filename, st.value.pos.line,
                                       st.value.pos.column, n.source)
            if st.held and self.not_refractory is not None:
                v = Where(sp.StrictGreaterThan(self.not_refractory, 0), v, cur)
            env[st.target] = self.emit(st.target, v)

    # ------------------------------------------------------------------ 3. spike, 4. on spike
    def spike(self) -> tuple[sp.Symbol, SurrogateInfo]:
        """The spike (`gates * SpikeGE/GT(u)`), its surrogate, the reset, the bookkeeping states."""
        model, n, env, here = self.model, self.n, self.env, self.here
        rule = model.spike
        assert rule is not None
        here[0] = rule.pos
        u_value = self.value(rule.left) - self.value(rule.right)
        if not u_value.free_symbols & self.dynamic:
            raise FlexDSLError("the spike condition does not depend on any input or state: it is the same at "
                               "every step", n.filename, rule.left.pos.line, rule.left.pos.column, n.source,
                               "compare a state (or an expression of states and inputs) with a threshold")
        u = self.emit("u_spike", u_value)
        fire = SpikeGE if rule.op == ">=" else SpikeGT  # `crosses`: above (u > 0) now ...
        spike_sym = sym("spike")  # `spike` is reserved: never a model name
        gates: list[sp.Expr] = []
        if self.not_refractory is not None:
            gates.append(self.not_refractory)
        if rule.op == "crosses":  # ... and not above at the previous step
            gates.append(1 - Detach(env["_above_threshold"]))
        if gates:
            raw = self.emit("spike_raw", fire(u))
            self.assignments.append((spike_sym, sp.Mul(*gates) * raw))
        else:
            self.assignments.append((spike_sym, fire(u)))
        self.origins["spike"] = rule.pos
        surrogate = surrogate_info(model, env)
        if model.on_spike:
            self.on_spike(spike_sym)
        self.bookkeeping(spike_sym, u)
        return spike_sym, surrogate

    def on_spike(self, spike_sym: sp.Symbol) -> None:
        """The resets, all from the values before them: `s*e + (1 - s)*x`, `x + s*e`, `x - s*e`."""
        model, n, env, rule = self.model, self.n, self.env, self.model.spike
        assert rule is not None
        self.here[0] = rule.pos
        which = self.detach_reset  # True: every reset; names: those states' resets only
        detached = self.emit("spike_detached", Detach(spike_sym)) if which else spike_sym
        pre = dict(env)
        new_vals: dict[str, sp.Expr] = {}
        for st in model.on_spike:
            subs: dict[str, sp.Expr] = {}
            local = ChainMap(subs, pre)
            for name, d in self.subexpr_defs.items():
                if name not in self.noisy_subexprs:
                    subs[name] = to_sympy(d, local, n)
            e = to_sympy(st.value, local, n, self.draw)
            x = pre[st.target]
            s = detached if which is True or (which and st.target in which) else spike_sym
            if st.op == "=":
                new_vals[st.target] = s * e + (1 - s) * x
            elif st.op == "+=":
                new_vals[st.target] = x + s * e
            else:
                new_vals[st.target] = x - s * e
        for st in model.on_spike:
            self.here[0] = st.pos
            env[st.target] = self.emit(st.target, new_vals[st.target])

    def bookkeeping(self, spike_sym: sp.Symbol, u: sp.Expr) -> None:
        """The bookkeeping states for the next step (refractoriness, the crossing rule)."""
        model, env, here = self.model, self.env, self.here
        fired = sp.StrictGreaterThan(spike_sym, 0)
        if "_steps_since_spike" in env:
            here[0] = model.refractory.pos  # type: ignore[union-attr]
            env["_steps_since_spike"] = self.emit("_steps_since_spike", Where(fired, 0, env["_steps_since_spike"]))
        if "_not_refractory" in env:
            here[0] = model.refractory.pos  # type: ignore[union-attr]
            env["_not_refractory"] = self.emit("_not_refractory", Where(fired, 0, self.not_refractory))
        if model.spike is not None and model.spike.op == "crosses":
            here[0] = model.spike.pos
            env["_above_threshold"] = self.emit("_above_threshold", Where(sp.StrictGreaterThan(u, 0), 1, 0))


def _dt_in_base_units(model: CheckedModel, env: Mapping[str, sp.Expr]) -> sp.Expr:
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
            dt = _dt_in_base_units(model, env)
            last = (period + dt / 1000) / dt - 1
        else:
            last = period + sp.Rational(1, 1000) - 1
        bound = emit("refractory_steps", last)
        env["_steps_since_spike"] = steps
        return emit("not_refractory", Where(sp.StrictGreaterThan(steps, bound), 1, 0))
    assert rf.condition is not None
    return emit("not_refractory", Where(value(rf.condition), Detach(env["_not_refractory"]), 1))



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


__all__ = ["lower", "StepModel", "ParamInfo", "MatrixExp", "SurrogateInfo", "NameGen", "share_subexpressions",
           "ToSympy", "to_sympy", "sym", "MAX_EXPONENT"]
