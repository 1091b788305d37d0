"""Checking a plasticity rule: `A.Rule` (a `.rule` file) -> `CheckedRule`.

A rule is the neuron language run on a synapse group: its inputs are the presynaptic spikes `pre`
and the postsynaptic spikes `post` (always there; 0/1 at every step), plus modulators it declares
(`input reward`: a third factor given at each call); its states are traces, eligibilities and the
weight (named by `weight w ...`, `w` when no line names it). One step of a rule runs, in order:
its `equations` (integrated over `dt` like a neuron's: a trace's exponential decay exactly), its
`update` block, `on pre:` (where the presynaptic neuron spiked) and `on post:` (where the
postsynaptic one did). So the checker turns the rule into a neuron model (`neuron_of`) and lets the
neuron checker check names, units, params and bounds; what only a rule has is checked here,
every misfit a located `FlexDSLError`.

`on pre:` statements become update statements gated by the spike: `x += e` is `x = x + pre*(e)`
(a graded presynaptic value scales the increment, as SpikingJelly's learners), `x = e` (and
`*=`, `/=`) is `x = where(pre > 0, e, x)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FlexDSLError, did_you_mean
from . import ast as A
from .catalog import DRAWS, is_noise_name
from .check import check
from .model import CheckedModel
from .parse import _check_depth as check_depth
from .parse import _check_identifiers as check_identifiers

SPIKES = ("pre", "post")  # the rule's inputs that are always there: the synapse's two sides' spikes
EVENTS = SPIKES
POST = "post_"  # an input named post_<x> is a value per postsynaptic neuron (in a layer: the neuron's <x>)


@dataclass(frozen=True)
class CheckedRule:
    ast: A.Rule
    model: CheckedModel  # the rule as a neuron model: inputs (pre, post, modulators), params, states + weight
    weight: str  # the weight's name in the rule
    bounds: A.Compare | None  # `weight w where lo <= w <= hi` as written
    modulators: tuple[str, ...]  # declared inputs other than pre/post: given at every call
    output: str | None  # a value the synapse carries instead of `pre` (short-term plasticity), or None

    @property
    def name(self) -> str:
        return self.ast.name

    @property
    def post_inputs(self) -> tuple[str, ...]:
        """The inputs with a value per postsynaptic neuron (`post_v`: in a layer, the neuron's `v`)."""
        return tuple(m for m in self.modulators if m.startswith(POST))

    def error(self, msg: str, pos: A.Pos | None, hint: str | None = None) -> FlexDSLError:
        p = pos or self.ast.pos
        return FlexDSLError(msg, self.ast.filename, p.line, p.column, self.ast.source, hint)


def _err(rule: A.Rule, msg: str, pos: A.Pos | None, hint: str | None = None) -> FlexDSLError:
    p = pos or rule.pos
    return FlexDSLError(msg, rule.filename, p.line, p.column, rule.source, hint)


def check_rule(rule: A.Rule, definitions: Any = None) -> CheckedRule:
    """The rule checked (its own rules here, the rest by the neuron checker on `neuron_of(rule)`)."""
    weights = rule.of(A.WeightDecl)
    if len(weights) > 1:
        raise _err(rule, "a rule has one weight; this is a second `weight` line", weights[1].pos,
                   "one synapse group per rule: keep one `weight` line")
    wname = weights[0].name if weights else "w"
    wpos = weights[0].pos if weights else rule.pos
    for it in rule.items:
        name = getattr(it, "name", None)
        if isinstance(it, A.Input) and it.name in SPIKES:
            raise _err(rule, f"`{it.name}` is the rule's {it.name}synaptic spikes already: every rule has them",
                       it.pos, "remove this line; declare only modulators (e.g. `input reward`)")
        if isinstance(it, (A.Param, A.State, A.Input)) and name == wname:
            raise _err(rule, f"`{wname}` is the rule's weight; it cannot also be {_kind(it)}", it.pos,
                       f"rename one of them (the weight is named by `weight {wname}`)")
        if isinstance(it, (A.Param, A.State)) and name in SPIKES:
            raise _err(rule, f"`{name}` is the rule's {name}synaptic spikes; it cannot name {_kind(it)}", it.pos,
                       f"choose another name, e.g. `x_{name}`")
    if wname in SPIKES:
        raise _err(rule, f"`{wname}` is the rule's {wname}synaptic spikes; the weight needs another name", wpos,
                   "e.g. `weight w`")
    outs = rule.of(A.Output)
    if len(outs) > 1:
        raise _err(rule, "a rule has at most one `output` line", outs[1].pos)
    output = None
    if outs:
        if len(outs[0].names) > 1:
            raise _err(rule, "a rule's output is one value: what the synapse carries instead of `pre`",
                       outs[0].names[1][1], "keep one name")
        output, opos = outs[0].names[0]
        if output in (wname, "spike"):
            raise _err(rule, f"a rule's output is the presynaptic value the synapse carries; `{output}` is not one",
                       opos, "output a value of the presynaptic side, e.g. `output r` with `r = u * x * pre`")
    states = {s.name for s in rule.of(A.State)} | {wname}
    for ev in rule.of(A.SynapseEvent):
        if ev.kind not in EVENTS:
            raise _err(rule, f"unknown synaptic event `on {ev.kind}`", ev.pos,
                       did_you_mean(ev.kind, list(EVENTS)) or "`on pre:` or `on post:`")
        for st in ev.statements:
            if not st.is_let and st.target not in states:
                raise _err(rule, f"`on {ev.kind}` updates `{st.target}`, which is not a state of the rule", st.pos,
                           did_you_mean(st.target, sorted(states)) or
                           f"declare it: `state {st.target} = 0`, or update the weight `{wname}`")
            if st.held:
                raise _err(rule, "`unless refractory` is a neuron's; a rule has no refractory period", st.pos)
    kinds = [ev.kind for ev in rule.of(A.SynapseEvent)]
    for k in EVENTS:
        if kinds.count(k) > 1:
            ev = [e for e in rule.of(A.SynapseEvent) if e.kind == k][1]
            raise _err(rule, f"a second `on {k}` block", ev.pos, f"merge the statements into one `on {k}:` block")
    for upd in rule.of(A.Update):
        for st in upd.statements:
            if st.held:
                raise _err(rule, "`unless refractory` is a neuron's; a rule has no refractory period", st.pos)
    neuron = neuron_of(rule, wname)
    for it in neuron.items:
        for e in A.item_exprs(it):
            for n in A.nodes(e):
                drawn = f"`{n.func}()`" if isinstance(n, A.Call) and n.func in DRAWS else \
                    f"white noise `{n.id}`" if isinstance(n, A.Name) and is_noise_name(n.id) else None
                if drawn is not None:
                    raise _err(rule, f"a rule cannot draw random numbers ({drawn}): its window and online runs "
                                     "must give the same change", n.pos,
                               "give the randomness as a modulator: `input noise`, passed at each call")
    check_identifiers(neuron)  # (no `_` names, keywords or reserved words: generated code's names)
    check_depth(neuron)
    model = check(neuron, definitions)
    if weights and weights[0].where is not None:
        _check_bounds(rule, weights[0], model)
    modulators = tuple(i.name for i in model.inputs if i.name not in SPIKES)
    return CheckedRule(rule, model, wname, weights[0].where if weights else None, modulators, output)


def _kind(it: object) -> str:
    return {A.Param: "a param", A.State: "a state", A.Input: "an input"}[type(it)]


def _check_bounds(rule: A.Rule, decl: A.WeightDecl, model: CheckedModel) -> None:
    """`weight w where LO <= w <= HI` (or one side, `w >= 0`): the weight between expressions of params."""
    cmp = decl.where
    assert cmp is not None
    params = {p.name for p in model.params}
    selves = [o for o in cmp.operands if isinstance(o, A.Name) and o.id == decl.name]
    if not selves:
        raise _err(rule, f"the weight's bounds must compare `{decl.name}` itself", cmp.pos,
                   f"e.g. `weight {decl.name} where 0 <= {decl.name} <= w_max`")
    if len(selves) > 1:
        raise _err(rule, f"a bound of the weight may use numbers and params only; `{decl.name}` is the weight itself",
                   selves[1].pos, f"e.g. `weight {decl.name} where 0 <= {decl.name} <= w_max`")
    for o in cmp.operands:
        if isinstance(o, A.Name) and o.id == decl.name:
            continue
        for n in A.nodes(o):
            if isinstance(n, A.Name) and n.id not in params:
                raise _err(rule, f"a bound of the weight may use numbers and params only; `{n.id}` is not a param",
                           n.pos, did_you_mean(n.id, sorted(params)) or "declare it: `param w_max = 1`")
    for op in cmp.ops:
        if op in ("==", "!="):
            raise _err(rule, f"`{op}` is not a bound: the weight's bounds are `<`, `<=`, `>`, `>=`", cmp.pos,
                       f"e.g. `weight {decl.name} where 0 <= {decl.name} <= w_max` (a fixed weight: no rule)")


def _gate(st: A.Assign, spike: str) -> A.Assign:
    """An `on pre`/`on post` statement as an update statement gated by the spike."""
    if st.is_let:
        return st
    p = st.pos
    s = A.Name(spike, p)
    target = A.Name(st.target, p)
    if st.op in ("+=", "-="):
        inc = A.BinOp("*", s, st.value, p)
        return A.Assign(st.target, "=", A.BinOp(st.op[0], target, inc, p), p)
    new = st.value if st.op == "=" else A.BinOp(st.op[0], target, st.value, p)
    cond = A.Compare((s, A.Num(0.0, "0", p)), (">",), p)
    return A.Assign(st.target, "=", A.Call("where", (cond, new, target), p), p)


def neuron_of(rule: A.Rule, wname: str) -> A.Neuron:
    """The rule as a neuron model the neuron checker and lowering take: inputs `pre`, `post` and the
    declared ones; the weight a state; statements in the step's order (update, on pre, on post)."""
    p = rule.pos
    items: list = [A.Input("pre", p, "presynaptic spikes"), A.Input("post", p, "postsynaptic spikes")]
    statements: list[A.Assign] = []
    events = {ev.kind: ev for ev in rule.of(A.SynapseEvent)}
    weight = next(iter(rule.of(A.WeightDecl)), None)
    for it in rule.items:
        if isinstance(it, (A.Input, A.Param, A.State, A.Equations)):
            items.append(it)
        elif isinstance(it, A.Update):
            statements += it.statements
    items.append(A.State(wname, A.Num(0.0, "0", weight.pos if weight else p), weight.pos if weight else p,
                         weight.doc if weight else "the synaptic weight"))
    for kind in EVENTS:
        if kind in events:
            statements += [_gate(st, kind) for st in events[kind].statements]
    if statements:
        items.append(A.Update(statements, statements[0].pos))
    out = next(iter(rule.of(A.Output)), None)
    items.append(out if out is not None else A.Output([(wname, p)], p))
    return A.Neuron(rule.name, items, rule.pos, rule.filename, rule.source, rule.doc)


__all__ = ["EVENTS", "POST", "SPIKES", "CheckedRule", "check_rule", "neuron_of"]
