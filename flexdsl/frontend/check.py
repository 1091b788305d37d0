"""Stage 2: the checker. Names, declarations and their order, the rules of the language reference
(docs/language.md, sections 3–5).

Input: the AST from parse.py. Output: a `CheckedModel` (the same nodes, sorted by role and
validated). Every violation is a located FlexDSLError.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import FlexDSLError, did_you_mean
from . import ast as A
from .bounds import find_bounds
from .catalog import (
    CONSTANTS,
    DEFAULT_SURROGATE,
    DRAWS,
    FUNCTIONS,
    METHOD_ALIASES,
    METHODS,
    MODULE_ATTRIBUTES,
    STOCHASTIC_SURROGATE,
    is_noise_name,
    is_unit,
)
from .catalog import SURROGATES as BUILTIN_SURROGATES
from .convert import check_units
from .dims import DefinitionStore, model_names, suggest_unit, uses_units
from .model import CheckedModel, ResolvedSurrogate

# Bookkeeping states the lowering keeps for refractoriness and crossing rules. Their names
# start with `_`, which no model name can, so they never collide with the model's.
HIDDEN_STATES = {
    "_steps_since_spike": (1e9, "steps since the last spike (1e9 before the first): `refractory PERIOD`"),
    "_not_refractory": (1.0, "1 where the neuron is not refractory: `refractory while ...` (Brian2's meaning)"),
    "_above_threshold": (0.0, "1 where the crossing rule's value was above the threshold at the previous step"),
}


class _Checker:
    def __init__(self, neuron: A.Neuron, definitions: DefinitionStore | None = None) -> None:
        self.n = neuron
        self.definitions = definitions

    def err(self, msg: str, pos: A.Pos, hint: str | None = None) -> FlexDSLError:
        return FlexDSLError(msg, self.n.filename, pos.line, pos.column, self.n.source, hint)

    # ------------------------------------------------------------------ names
    def unknown(self, name: str, pos: A.Pos, known: set[str], what: str = "name") -> FlexDSLError:
        hint = did_you_mean(name, known)
        if name == "dt" and "dt" not in known:
            hint = self.dt_hint()
        if hint is None and name.lower() in ("nan", "inf", "infinity"):
            hint = "a model's numbers are finite: write a finite value"
        if hint is None:  # (no near name: say what there is)
            cap = 40 if what == "function" else 12
            listed = ", ".join(sorted(known)[:cap]) + (", ..." if len(known) > cap else "")
            hint = {"function": f"the functions: {listed}",
                    "output": f"an output is a state, a `let` value or `spike`: {listed}"}.get(
                what, f"declare it (`param {name} = ...`, `state {name} = ...`, `let {name} = ...`); "
                      f"known here: {listed}" if name.isidentifier() else None)
        return self.err(f"unknown {what} `{name}`", pos, hint)

    def dt_hint(self) -> str:
        """How to declare the step: a time where the model writes units (pasted, it loads)."""
        if uses_units(self.n):
            return "declare the step as a param, e.g. `param dt = 0.1 ms` (a time: the model writes units)"
        return "declare the step as a param, e.g. `param dt = 0.1` (in the time unit of the model's constants)"

    def check_expr(self, e: A.Expr, visible: set[str], context: str, allow_compare: bool = False) -> None:
        """Names defined, functions known with the right arity, comparisons only where allowed."""
        _ExprChecker(self, visible, context, allow_compare).fold(e)

    def noise_use(self, e: A.Name, context: str) -> None:
        """White noise (`xi`, `xi_1`, ...): in an ODE's right-hand side (or a subexpression of the
        equations), recorded as a noise source; anywhere else a located error."""
        if context == "in an equation":
            self.noise.setdefault(e.id, e.pos)
            return
        if context == "here":
            raise self.err(f"`{e.id}` is the white noise of an ODE (unit 1/sqrt(time)), which has no value in a "
                           "discrete statement", e.pos, "a step's noise in `update`, the spike rule or `on spike` "
                           "is a draw: `randn()` (standard normal), e.g. `v += sigma*sqrt(dt)*randn()`")
        raise self.err(f"`{e.id}` (white noise) cannot be used {context}", e.pos,
                       "white noise `xi` belongs in an ODE's right-hand side, e.g. `dv/dt = -v/tau + "
                       "sigma*sqrt(2/tau)*xi`")

    def draw_use(self, e: A.Call, context: str) -> None:
        """`randn()` and `rand()`: no arguments, in `update`, the spike rule and `on spike` only."""
        if e.args:
            raise self.err(f"`{e.func}()` takes no arguments", e.pos, f"scale it instead: e.g. `sigma*{e.func}()`"
                           if e.func == "randn" else "e.g. `spike when rand() < p`")
        if context == "here":
            return
        if context == "in an equation":
            raise self.err(f"`{e.func}()` in an equation: an ODE's noise is the white noise `xi` (unit "
                           "1/sqrt(time)), which the integration method scales with the step", e.pos,
                           "write e.g. `dv/dt = -v/tau + sigma*sqrt(2/tau)*xi`; `randn()` draws one number per "
                           "step, for `update`")
        raise self.err(f"`{e.func}()` cannot be used {context}: it draws a new value at every step", e.pos,
                       f"`{e.func}()` belongs in `update`, the spike rule or `on spike`")

    def scope_hint(self, context: str) -> str:
        if context == "in a param default":
            return "a param's default may use only params declared before it, and `pi`"
        if context == "in a state's initial value":
            return "a state's initial value is an expression of params"
        if context == "in a surrogate keyword":
            return "surrogate keywords are numbers or expressions of params"
        if context == "in the refractory period":
            return "the refractory period is an expression of params"
        if context == "in the refractory condition":
            return ("the refractory condition is evaluated at the start of a step, before `update`: it may use "
                    "inputs, params, states and the equations' subexpressions")
        return "names must be declared before they are used"

    # ------------------------------------------------------------------ main
    def run(self) -> CheckedModel:
        n = self.n
        self.inputs: list[A.Input] = n.of(A.Input)
        self.params: list[A.Param] = n.of(A.Param)
        self.states: list[A.State] = n.of(A.State)
        self.user_surrogates: dict[str, A.SurrogateDef] = {}
        self.noise: dict[str, A.Pos] = {}  # the white noise sources of the equations, by first use
        self.noisy: set[str] = set()  # the equations' subexpressions that hold white noise
        self.random_locals: set[str] = set()  # the `update` locals computed from a draw (`rand()`...)
        self.declare_all()
        self.input_names = {i.name for i in self.inputs}
        self.param_names = [p.name for p in self.params]
        self.state_names = {s.name for s in self.states}
        with_units = uses_units(n)
        self.model_names = model_names(n)
        refractory: A.Refractory | None = self.single(A.Refractory, "`refractory` declaration")
        eqs: A.Equations | None = self.single(A.Equations, "`equations` block")
        upd: A.Update | None = self.single(A.Update, "`update` block")
        spike: A.SpikeRule | None = self.single(A.SpikeRule, "spike rule")
        ons: A.OnSpike | None = self.single(A.OnSpike, "`on spike` block")
        outputs_decl: list[A.Output] = n.of(A.Output)
        if len(outputs_decl) > 1:
            raise self.err("a model has at most one `output` line", outputs_decl[1].pos)
        self.check_params(with_units)
        self.check_user_surrogates()
        self.visible = self.input_names | set(self.param_names) | self.state_names
        method, subexprs = self.check_equations(eqs, refractory)
        statements = upd.statements if upd is not None else []
        locals_ = self.check_update(statements, refractory, subexprs)
        surrogate = self.check_spike(spike, ons)
        if refractory is not None:
            self.check_refractory(refractory, spike, subexprs, set(locals_))
        out_names = self.check_outputs(outputs_decl, spike, locals_, subexprs)
        ck = CheckedModel(n, self.inputs, self.params, self.states, eqs, method, statements, spike, surrogate,
                          ons.statements if ons else [], out_names, locals_, subexprs, refractory,
                          noise=list(self.noise))
        if with_units:
            ck = dataclasses.replace(check_units(ck, self.definitions), written=ck)
            self.check_defaults(ck.params, ck.states)
        ck.bounds = find_bounds(ck)
        return _with_hidden_states(ck)

    def declare_all(self) -> None:
        """Every name declared once, none a built-in or an attribute of the loaded module."""
        n = self.n
        declared: dict[str, tuple[str, A.Pos]] = {}

        def declare(name: str, kind: str, pos: A.Pos) -> None:
            if name in declared:
                k0, p0 = declared[name]
                raise self.err(f"duplicate declaration of `{name}` (already declared as {k0} at line {p0.line})",
                               pos)
            if name in FUNCTIONS:
                raise self.err(f"`{name}` is a built-in function and cannot be declared", pos)
            if name in CONSTANTS:
                raise self.err(f"`{name}` is a built-in constant and cannot be declared", pos)
            if name in DRAWS:
                raise self.err(f"`{name}` is a built-in random draw (`{name}()`) and cannot be declared", pos)
            if is_noise_name(name):
                raise self.err(f"`{name}` is Gaussian white noise in the equations (Brian2's `xi`, `xi_1`, ...) "
                               "and cannot be declared", pos, "choose another name, e.g. `eta`")
            if kind != "an input" and name in MODULE_ATTRIBUTES:
                raise self.err(f"`{name}` cannot name {kind}: the loaded torch module has an attribute `{name}`",
                               pos, f"choose another name (e.g. `{name}_`): params and states are attributes of "
                               "the module, so the names of torch.nn.Module's and flexdsl's own (forward, to, "
                               "reset, step, ...) are taken; docs/language.md section 13 lists them")
            declared[name] = (kind, pos)

        for it in n.items:
            if isinstance(it, A.Input):
                declare(it.name, "an input", it.pos)
            elif isinstance(it, A.Param):
                declare(it.name, "a param", it.pos)
            elif isinstance(it, A.State):
                declare(it.name, "a state", it.pos)
            elif isinstance(it, A.SurrogateDef):
                if it.name in self.user_surrogates:
                    raise self.err(f"duplicate surrogate `{it.name}`", it.pos)
                self.user_surrogates[it.name] = it
        if not self.inputs:
            raise self.err(f"neuron `{n.name}` declares no input", n.pos, "add e.g. `input x`")
        for name, (kind, pos) in declared.items():  # `m.v_seq` is the sequence of state `v` (SpikingJelly's name)
            if kind != "an input" and name.endswith("_seq") and declared.get(name[:-4], ("",))[0] == "a state":
                raise self.err(f"`{name}` cannot name {kind}: the loaded module's `{name}` is the sequence of state "
                               f"`{name[:-4]}` over a call (store_state_seqs=True)", pos,
                               f"choose another name (e.g. `{name[:-4]}_trace`)")
        self.declared = declared
        self.all_declared = set(declared)

    def single(self, kind: type, what: str):
        """The one block of a kind (None if absent); a second is an error."""
        found = self.n.of(kind)
        if len(found) > 1:
            raise self.err(f"a model has at most one {what}", found[1].pos)
        return found[0] if found else None

    def check_params(self, with_units: bool) -> None:
        """Defaults use earlier params; `where` constraints mention their param; `dt` is a param;
        initial values use params."""
        seen: set[str] = set()
        for p in self.params:
            self.check_expr(p.default, seen, "in a param default")
            if p.where is not None:
                self.check_expr(p.where, seen | {p.name}, "in a param default", allow_compare=True)
                if p.name not in {nm.id for nm in A.names(p.where)}:
                    raise self.err(f"the constraint of `{p.name}` does not mention `{p.name}`", p.where.pos)
            seen.add(p.name)
        if "dt" in self.input_names or "dt" in self.state_names:
            raise self.err("`dt` is the integration step and must be a param", self.declared["dt"][1])
        for s in self.states:
            self.check_expr(s.init, set(self.param_names), "in a state's initial value")
        if not with_units:  # (with units, the defaults are evaluated once converted to base units)
            self.check_defaults(self.params, self.states)

    def check_user_surrogates(self) -> None:
        for sd in self.user_surrogates.values():
            kw = {k.name for k in sd.kwargs}
            for k in sd.kwargs:
                self.check_expr(k.value, set(self.param_names), "in a surrogate keyword")
            self.check_expr(sd.body, {sd.arg} | kw | set(self.param_names), "in the surrogate formula")

    def check_equations(self, eqs: A.Equations | None, refractory: A.Refractory | None
                        ) -> tuple[str | None, list[str]]:
        """The method (normalized, None: automatic) and the subexpressions, in order."""
        method: str | None = None
        subexprs: list[str] = []
        if eqs is None:
            return method, subexprs
        if eqs.method is not None:
            m = METHOD_ALIASES.get(eqs.method, eqs.method)
            if m not in METHODS:
                raise self.err(f"unknown integration method `{eqs.method}`", eqs.method_pos,
                               did_you_mean(eqs.method, [*METHODS, *METHOD_ALIASES])
                               or "methods: " + ", ".join(METHODS))
            method = m
        ode_states: set[str] = set()
        for ln in eqs.lines:
            if isinstance(ln, A.ODE):
                self.check_ode(ln, ode_states, refractory)
            else:
                if ln.name in self.visible:
                    raise self.err(f"`{ln.name}` is already declared; a subexpression needs a new name", ln.pos)
                self.check_expr(ln.value, self.visible, "in an equation")
                if any(is_noise_name(nm.id) or nm.id in self.noisy for nm in A.names(ln.value)):
                    self.noisy.add(ln.name)
                self.visible.add(ln.name)
                subexprs.append(ln.name)
        return method, subexprs

    def check_ode(self, ln: A.ODE, ode_states: set[str], refractory: A.Refractory | None) -> None:
        st = ln.state
        if ln.denom != "dt":
            raise self.err(f"a derivative is written `d{st or 'X'}/dt`, not `{ln.written}/{ln.denom}`",
                           ln.denom_pos or ln.pos)
        if not st:
            raise self.err(f"`{ln.written}/dt`: a derivative is written `dX/dt` for a state X", ln.pos)
        if st not in self.state_names:
            hint = did_you_mean(st, self.state_names)
            what = "an input" if st in self.input_names else "a param" if st in self.param_names else "not declared"
            raise self.err(f"`d{st}/dt`: `{st}` is not a state ({what})", ln.pos,
                           hint or "declare it with `state " + st + " = ...`")
        if st in ode_states:
            raise self.err(f"second equation for `d{st}/dt`", ln.pos)
        ode_states.add(st)
        if "dt" not in self.param_names:
            raise self.err("an ODE needs the step `dt` declared as a param", ln.pos, self.dt_hint())
        self.check_expr(ln.value, self.visible, "in an equation")
        if ln.held and refractory is None:
            raise self.err(f"`d{st}/dt ... unless refractory` in a model without a `refractory` "
                           "declaration", ln.pos, "declare e.g. `refractory 2 ms`")

    def check_update(self, statements: list[A.Assign], refractory: A.Refractory | None, subexprs: list[str]
                     ) -> list[str]:
        """The `update` statements; the locals they define, in order."""
        locals_: list[str] = []
        local_set: set[str] = set()
        subexpr_set = set(subexprs)
        state_names, visible = self.state_names, self.visible
        for st in statements:
            self.check_expr(st.value, visible, "here")
            tgt = st.target
            if tgt in self.input_names:
                raise self.err(f"cannot assign to input `{tgt}`", st.pos)
            if tgt in self.param_names:
                raise self.err(f"cannot assign to param `{tgt}`", st.pos, "params are constant during a step")
            if tgt in subexpr_set:
                raise self.err(f"cannot assign to the subexpression `{tgt}`", st.pos)
            if st.is_let and tgt in state_names:
                raise self.err(f"`let {tgt}`: `{tgt}` is a state", st.pos, f"write `{tgt} = ...` to update it")
            if st.op != "=" and tgt not in state_names and tgt not in local_set:
                raise self.err(f"`{tgt} {st.op} ...` needs `{tgt}` to be defined first", st.pos,
                               did_you_mean(tgt, visible))
            if st.held:
                if refractory is None:
                    raise self.err(f"`{tgt} {st.op} ... unless refractory` in a model without a `refractory` "
                                   "declaration", st.pos, "declare e.g. `refractory 2 ms`")
                if tgt not in state_names:
                    raise self.err(f"`unless refractory` holds a state, and `{tgt}` is not a state", st.pos)
            if tgt not in state_names and _draws_in(st.value, self.random_locals):
                self.random_locals.add(tgt)
            if tgt not in state_names and tgt not in local_set:
                if st.is_let is False and tgt in self.all_declared:
                    raise self.err(f"cannot assign to `{tgt}`", st.pos)
                locals_.append(tgt)
                local_set.add(tgt)
                visible.add(tgt)
        return locals_

    def check_spike(self, spike: A.SpikeRule | None, ons: A.OnSpike | None) -> ResolvedSurrogate | None:
        """The spike rule, its surrogate (resolved) and the `on spike` statements."""
        surrogate: ResolvedSurrogate | None = None
        if spike is not None:
            self.check_expr(spike.left, self.visible, "here")
            self.check_expr(spike.right, self.visible, "here")
            surrogate = self.resolve_surrogate(spike, set(self.param_names))
        if ons is not None:
            if spike is None:
                raise self.err("`on spike:` without a spike rule", ons.pos, "add `spike when ... surrogate ...`")
            for st in ons.statements:
                if st.is_let or st.op not in ("=", "+=", "-="):
                    raise self.err(f"only `=`, `+=` and `-=` are allowed in `on spike`, not "
                                   f"`{'let' if st.is_let else st.op}`", st.pos)
                if st.target not in self.state_names:
                    raise self.err(f"`on spike` can only reset states; `{st.target}` is not a state", st.pos,
                                   did_you_mean(st.target, self.state_names))
                if st.held:
                    raise self.err("`unless refractory` is for equations and `update` statements, not for "
                                   "`on spike` (no spike happens while refractory)", st.pos)
                self.check_expr(st.value, self.visible, "here")
        return surrogate

    def check_refractory(self, refractory: A.Refractory, spike: A.SpikeRule | None, subexprs: list[str],
                         local_set: set[str]) -> None:
        if spike is None:
            raise self.err("`refractory` in a model without a spike rule", refractory.pos,
                           "refractoriness starts at a spike: add `spike when ...`")
        if refractory.period is not None:
            self.check_expr(refractory.period, set(self.param_names), "in the refractory period")
            return
        assert refractory.condition is not None
        start = self.input_names | set(self.param_names) | self.state_names | set(subexprs)
        for nm in A.names(refractory.condition):
            if nm.id in local_set:
                raise self.err(f"`{nm.id}` is computed in `update`, after the refractory condition is "
                               "decided", nm.pos, self.scope_hint("in the refractory condition"))
        self.check_expr(refractory.condition, start, "in the refractory condition", allow_compare=True)

    def check_outputs(self, outputs_decl: list[A.Output], spike: A.SpikeRule | None, locals_: list[str],
                      subexprs: list[str]) -> list[tuple[str, A.Pos]]:
        """The outputs as written, or the default: `spike`, else the first state."""
        n = self.n
        state_names = self.state_names
        out_names: list[tuple[str, A.Pos]] = []
        if not outputs_decl:
            if spike is not None:
                return [("spike", n.pos)]
            if self.states:
                return [(self.states[0].name, self.states[0].pos)]
            raise self.err(f"neuron `{n.name}` has no output", n.pos, "add e.g. `output spike`")
        local_set = set(locals_)
        for name, pos in outputs_decl[0].names:
            if name == "spike":
                if spike is None:
                    raise self.err("`output spike` in a model without a spike rule", pos)
            elif name in self.noisy:
                raise self.err(f"`{name}` holds white noise (`xi`), which has no value at a step: it cannot be an "
                               "output", pos, "output a state the noise drives instead")
            elif name not in state_names and name not in local_set and name not in subexprs:
                if name in self.input_names or name in self.param_names:
                    raise self.err(f"`{name}` cannot be an output: outputs are `spike`, states or locals", pos)
                raise self.unknown(name, pos, state_names | local_set | set(subexprs) | {"spike"}, "output")
            if name in [o for o, _ in out_names]:
                raise self.err(f"`{name}` is listed twice in `output`", pos)
            out_names.append((name, pos))
        return out_names

    def check_defaults(self, params: list[A.Param], states: list[A.State]) -> None:
        """Evaluate every default in order and check its `where` constraint; evaluate the
        states' initial values with the defaults."""
        from .evaluate import evaluate, holds, reason

        env: dict[str, float] = {}
        for p in params:
            try:
                env[p.name] = float(evaluate(p.default, env))
            except (ArithmeticError, ValueError) as e:
                raise self.err(f"the default of `{p.name}` cannot be evaluated: {reason(e)}", p.default.pos) from None
            if not math.isfinite(env[p.name]):
                raise self.err(f"the default of `{p.name}` is {env[p.name]}: params are finite numbers",
                               p.default.pos, "an overflow (or a NaN) among the constants and params it is "
                                              "computed from")
            if p.where is None:
                continue
            try:
                ok = holds(p.where, env)
            except (ArithmeticError, ValueError) as e:
                shown = ", ".join(f"{k} = {v:g}" for k, v in env.items() if k in _names_in(p.where))
                raise self.err(f"the constraint of `{p.name}` cannot be evaluated with the defaults ({shown}): "
                               f"{reason(e)}", p.where.pos, "a constraint must be defined for the values it "
                                                            "accepts; e.g. write `k * (tau - 2) < 1` with "
                                                            "`tau > 2`") from None
            if not ok:
                raise self.err(f"the default `{p.name} = {env[p.name]:g}` violates the constraint of `{p.name}`",
                               p.where.pos, f"`{p.name}` must satisfy the `where` condition, or change the default")
        for s in states:
            try:
                float(evaluate(s.init, env))
            except (ArithmeticError, ValueError) as e:
                raise self.err(f"the initial value of `{s.name}` cannot be evaluated: {reason(e)}",
                               s.init.pos) from None

    def resolve_surrogate(self, spike: A.SpikeRule, params: set[str]) -> ResolvedSurrogate:
        use = spike.surrogate
        if use is None:
            # a stochastic spike (`spike when rand() < p`): the derivative of the firing probability
            stochastic = _draws_in(spike.left, self.random_locals) or _draws_in(spike.right, self.random_locals)
            spec = BUILTIN_SURROGATES[STOCHASTIC_SURROGATE if stochastic else DEFAULT_SURROGATE]
            kw = {k: A.Num(v, repr(v), spike.pos) for k, v in spec.defaults.items()}
            return ResolvedSurrogate(spec.name, "x", kw, None, spike.pos)
        given: dict[str, A.Kwarg] = {}
        for k in use.kwargs:
            if k.name in given:
                raise self.err(f"keyword `{k.name}` given twice", k.pos)
            given[k.name] = k
            self.check_expr(k.value, params, "in a surrogate keyword")
        if use.name in self.user_surrogates:
            sd = self.user_surrogates[use.name]
            defaults = {k.name: k.value for k in sd.kwargs}
            arg = sd.arg
        elif use.name in BUILTIN_SURROGATES:
            spec = BUILTIN_SURROGATES[use.name]
            defaults = {k: A.Num(v, repr(v), use.pos) for k, v in spec.defaults.items()}
            arg = "x"
            sd = None
        else:
            known = set(BUILTIN_SURROGATES) | set(self.user_surrogates)
            raise self.err(f"unknown surrogate `{use.name}`", use.pos,
                           did_you_mean(use.name, known) or "built-in surrogates: " + ", ".join(sorted(known)))
        for k in given.values():
            if k.name not in defaults:
                hint = did_you_mean(k.name, defaults) or (
                    f"`{use.name}` takes " + (", ".join(f"`{d}`" for d in defaults) or "no keywords"))
                raise self.err(f"unknown keyword `{k.name}` for surrogate `{use.name}`", k.pos, hint)
        kwargs = {name: (given[name].value if name in given else dv) for name, dv in defaults.items()}
        return ResolvedSurrogate(use.name, arg, kwargs, sd, use.pos)


class _ExprChecker(A.ExprFold[None]):
    """The checks of one expression, top-down (so the first error in source order is reported)."""

    def __init__(self, ck: _Checker, visible: set[str], context: str, allow_compare: bool) -> None:
        self.ck, self.visible, self.context, self.allow_compare = ck, visible, context, allow_compare

    def enter(self, e: A.Expr, parent: A.Expr | None) -> None:
        ck = self.ck
        if isinstance(e, A.Compare):
            in_where = isinstance(parent, A.Call) and parent.func == "where" and parent.args[0] is e
            if not (in_where or (parent is None and self.allow_compare)):
                raise ck.err("a comparison is only allowed in `where(...)` and `where` constraints", e.pos,
                             "use where(cond, a, b) to choose between values")
        elif isinstance(e, A.Name):
            if e.id in ck.noisy and self.context != "in an equation":
                raise ck.err(f"`{e.id}` holds white noise (`xi`), which only an ODE can integrate: it cannot be "
                             f"used {self.context}", e.pos, "in `update`, draw a step's noise with `randn()`, e.g. "
                                                            "`v += sigma*sqrt(dt)*randn()`")
            if e.id not in self.visible and e.id not in CONSTANTS:
                if is_noise_name(e.id):
                    ck.noise_use(e, self.context)
                    return
                if e.id in ck.all_declared:
                    raise ck.err(f"`{e.id}` cannot be used {self.context}", e.pos, ck.scope_hint(self.context))
                if is_unit(e.id) and e.id not in ck.model_names:  # a bare unit (`0.02 / ms`): see unitcheck.py
                    return
                raise ck.unknown(e.id, e.pos, self.visible | set(CONSTANTS))
        elif isinstance(e, A.Quantity):
            if not is_unit(e.unit):
                if e.unit in ck.all_declared or e.unit in self.visible:
                    raise ck.err(f"`{e.unit}` is not a unit", e.unit_pos,
                                 f"a number followed by a name is a value with a unit (`10 ms`); to multiply, "
                                 f"write `{e.text} * {e.unit}`")
                raise ck.err(f"unknown unit `{e.unit}`", e.unit_pos,
                             suggest_unit(e.unit) or "e.g. `ms`, `mV`, `nA`, `nS`, `pF`, `um`")
        elif isinstance(e, A.Call):
            if e.func in DRAWS:
                ck.draw_use(e, self.context)
                return
            b = FUNCTIONS.get(e.func)
            if b is None:
                if e.func in ck.user_surrogates or e.func in BUILTIN_SURROGATES:
                    raise ck.err(f"`{e.func}` is a surrogate, not a function", e.pos,
                                 "surrogates are used in the spike rule: `spike when ... surrogate name(...)`")
                raise ck.unknown(e.func, e.pos, set(FUNCTIONS), "function")
            if len(e.args) != b.arity:
                raise ck.err(f"`{e.func}` takes {b.arity} argument{'s' if b.arity != 1 else ''}, "
                             f"got {len(e.args)}", e.pos, f"{e.func}: {b.doc}")
            if e.func == "where" and not isinstance(e.args[0], A.Compare):
                raise ck.err("the first argument of `where` must be a comparison", e.args[0].pos,
                             "e.g. where(v > 0, a, b)")

    def visit_Num(self, e: A.Num) -> None:
        return None

    visit_Name = visit_Quantity = visit_Num

    def visit_BinOp(self, e: A.BinOp, *_: None) -> None:
        return None

    visit_Neg = visit_Call = visit_Compare = visit_BinOp


def _with_hidden_states(ck: CheckedModel) -> CheckedModel:
    """The model with the bookkeeping states its refractoriness and crossing rule need."""
    names = []
    rf = ck.refractory
    if rf is not None:
        names.append("_steps_since_spike" if rf.period is not None else "_not_refractory")
    if ck.spike is not None and ck.spike.op == "crosses":
        names.append("_above_threshold")
    if not names:
        return ck
    hidden = []
    for name in names:
        value, doc = HIDDEN_STATES[name]
        pos = rf.pos if rf is not None and name != "_above_threshold" else ck.spike.pos  # type: ignore[union-attr]
        hidden.append(A.State(name, A.Num(value, repr(value), pos), pos, doc, {"hidden": True, "unit": "1"}))
    return dataclasses.replace(ck, states=[*ck.states, *hidden])


def check(neuron: A.Neuron, definitions: DefinitionStore | None = None) -> CheckedModel:
    """Validate a parsed model; raises FlexDSLError at the first problem. `definitions`: where
    the definitions of the units a model writes are kept (see `dims.unit`)."""
    return _Checker(neuron, definitions).run()


def _draws_in(e: A.Expr, random_locals: set[str]) -> bool:
    """Whether an expression draws (`rand()`, `randn()`) or reads a local computed from a draw."""
    return any((isinstance(n, A.Call) and n.func in DRAWS) or (isinstance(n, A.Name) and n.id in random_locals)
               for n in A.nodes(e))


def _names_in(e: A.Expr) -> set[str]:
    return {n.id for n in A.nodes(e) if isinstance(n, A.Name)}


__all__ = ["check", "CheckedModel", "ResolvedSurrogate", "METHODS"]
