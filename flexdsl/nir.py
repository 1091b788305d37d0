"""NIR (the Neuromorphic Intermediate Representation) export and import.

    graph = flexdsl.nir.export(net, sample_input, dt=1e-4)   # a nir.NIRGraph (nir.write saves it)
    net2 = flexdsl.nir.load("net.nir", dt=1e-4)                # a torch.nn.Module of flexdsl neurons

Export decides a neuron's NIR primitive from its lowered equations, never from its name. The
step is inlined into one map from the previous states and the input to the next states; every
statement must be linear in the states and the input (the first that is not is the located
error), the spike a threshold on one state, the reset a constant. The map's coefficients give
the primitive's params for a discretisation (`euler` or `exact`), and the map that `load` runs
for those params (flexdsl's own lowering of the generated `.neuron` text) must equal the
model's, coefficient by coefficient.

Import makes one flexdsl neuron per NIR neuron node from generated `.neuron` text (kept as
`module.neuron_text`) and runs the graph layer by layer over whole sequences, so the neurons
use their multi-step kernels; a graph with cycles runs step by step, a recurrent edge carrying
the previous step's value. torch.fx traces the network for export and forward hooks record
the layer shapes; nirtorch is not used (its tracer records no shapes, its executor runs one
step at a time).

`docs/nir.md` states the conventions (time step, discretisation, threshold, reset, initial states).
"""

from __future__ import annotations

import math
import operator
import re
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sympy as sp
import torch
from torch import nn

from .errors import FlexDSLError, did_you_mean

try:
    import numpy as np
except ImportError:  # numpy comes with the `nir` package
    raise FlexDSLError("flexdsl.nir needs numpy and the `nir` package, which are not installed", "<flexdsl.nir>",
                       hint="pip install 'flexdsl[nir]'") from None
from .frontend import ast as A
from .frontend.catalog import FUNCTIONS, SURROGATES
from .runtime.compiler import Compiled, compile_model
from .runtime.module import NeuronModule

if TYPE_CHECKING:
    import nir as nir_t

METHODS = ("euler", "exact")
DEFAULT_SURROGATE = "sigmoid(alpha=4.0)"
_NETWORK = "<network>"  # the "file" of errors about a torch network


def _nir():
    """The `nir` package, or an error that says how to install it."""
    try:
        import nir
    except ImportError:
        raise FlexDSLError("flexdsl.nir needs the `nir` package, which is not installed", "<flexdsl.nir>",
                           hint="pip install 'flexdsl[nir]'") from None
    return nir


# ============================================================================ the primitives
@dataclass(frozen=True)
class Primitive:
    """A NIR neuron primitive as flexdsl text: its params (NIR's field names), its states, and the
    body of one step under each discretisation (input `x`, step `dt`)."""

    name: str
    params: tuple[str, ...]
    states: tuple[str, ...]  # membrane `v`, synaptic current `i`
    spiking: bool
    euler: tuple[str, ...]  # `update:` statements
    exact: tuple[str, ...]  # `equations method exact:` lines (`update:` statements where exact_update)
    ode: str  # the NIR equations, for the docstring
    exact_update: bool = False

    @property
    def output(self) -> str:
        return "spike" if self.spiking else (self.states[-1] if self.states else "spike")


_LIF_EULER = ("v = v + dt / tau * ((v_leak - v) + r * x)",)
_LIF_EXACT = ("dv/dt = ((v_leak - v) + r * x) / tau",)
_CUBA_EULER = ("i = i + dt / tau_syn * (w_in * x - i)", "v = v + dt / tau_mem * ((v_leak - v) + r * i)")
# The closed form of both equations over a step, written out: v sees the current through
# kappa = a_mem*(dt/tau_mem)*(exp(z) - 1)/z, z = dt*(tau_syn - tau_mem)/(tau_syn*tau_mem), with a series
# where z is small, so that equal or nearly equal time constants lose no precision.
_CUBA_EXACT = (
    "let a_syn = exp(-dt / tau_syn)",
    "let a_mem = exp(-dt / tau_mem)",
    "let z = dt * (tau_syn - tau_mem) / (tau_syn * tau_mem)",
    "let z_safe = where(abs(z) > 0.0001, z, 1.0)",
    "let phi = where(abs(z) > 0.0001, (exp(z_safe) - 1) / z_safe, 1 + z / 2 + z * z / 6)",
    "let i_inf = w_in * x",
    "v = v_leak + r * i_inf + (v - v_leak - r * i_inf) * a_mem + r * (i - i_inf) * a_mem * dt / tau_mem * phi",
    "i = i_inf + (i - i_inf) * a_syn",
)
_INT_EULER = ("v = v + dt * r * x",)
_INT_EXACT = ("dv/dt = r * x",)
_LIF_ODE = "tau dv/dt = (v_leak - v) + r x"
_CUBA_ODE = "tau_syn di/dt = -i + w_in x;  tau_mem dv/dt = (v_leak - v) + r i"

PRIMITIVES: dict[str, Primitive] = {p.name: p for p in [
    Primitive("LIF", ("tau", "r", "v_leak", "v_threshold", "v_reset"), ("v",), True, _LIF_EULER, _LIF_EXACT,
              _LIF_ODE),
    Primitive("LI", ("tau", "r", "v_leak"), ("v",), False, _LIF_EULER, _LIF_EXACT, _LIF_ODE),
    Primitive("IF", ("r", "v_threshold", "v_reset"), ("v",), True, _INT_EULER, _INT_EXACT, "dv/dt = r x"),
    Primitive("I", ("r",), ("v",), False, _INT_EULER, _INT_EXACT, "dv/dt = r x"),
    Primitive("CubaLIF", ("tau_syn", "tau_mem", "r", "v_leak", "v_threshold", "v_reset", "w_in"), ("i", "v"),
              True, _CUBA_EULER, _CUBA_EXACT, _CUBA_ODE, exact_update=True),
    Primitive("CubaLI", ("tau_syn", "tau_mem", "r", "v_leak", "w_in"), ("i", "v"), False, _CUBA_EULER,
              _CUBA_EXACT, _CUBA_ODE, exact_update=True),
    Primitive("Threshold", ("threshold",), (), True, (), (), "z = x > threshold"),
]}

_PARAM_DOCS = {
    "tau": "membrane time constant (time unit of dt)", "tau_mem": "membrane time constant (time unit of dt)",
    "tau_syn": "synaptic time constant (time unit of dt)", "r": "input resistance", "w_in": "input weight of the current",
    "v_leak": "leak potential, also the initial potential", "v_threshold": "firing threshold (fires when v > v_threshold)",
    "v_reset": "potential after a spike", "threshold": "fires when x > threshold",
}
_POSITIVE = {"tau", "tau_mem", "tau_syn"}
_INITIAL = {"LIF": "v_leak", "LI": "v_leak", "CubaLIF": "v_leak", "CubaLI": "v_leak", "IF": "v_reset", "I": "0.0"}


def _num(v: float) -> str:
    return repr(float(v))


def neuron_text(kind: str, values: Mapping[str, float], dt: float, method: str = "euler", *,
                surrogate: str = DEFAULT_SURROGATE, learnable: Iterable[str] = (),
                shapes: Mapping[str, Sequence[int]] | None = None) -> str:
    """The `.neuron` text of a NIR primitive: its ODEs discretised with `method` over the step
    `dt`, `values` as the params' defaults (per-channel params, named in `shapes`, get their
    values at load)."""
    if kind not in PRIMITIVES:
        raise FlexDSLError(f"`{kind}` is not a NIR neuron primitive", "<flexdsl.nir>",
                           hint=did_you_mean(str(kind), PRIMITIVES) or "primitives: " + ", ".join(PRIMITIVES))
    if method not in METHODS:
        raise FlexDSLError(f"method must be 'euler' or 'exact', not {method!r}", "<flexdsl.nir>")
    p = PRIMITIVES[kind]
    learn = set(learnable)
    shapes = dict(shapes or {})
    how = {"euler": "forward Euler (the current first, then the membrane)" if len(p.states) == 2 else "forward Euler",
           "exact": "the exact solution, the input held constant over the step"}[method]
    lines = [
        f"# Generated by flexdsl.nir from a NIR {kind} node.",
        f"neuron Nir{kind}:",
        f'    """NIR {kind}: {p.ode}' + ("; spike when v > v_threshold, then v = v_reset." if kind not in
                                         ("Threshold",) and p.spiking else "."),
        f"    Discretised over a step dt: {how}." + '"""',
        '    input x                "input"',
        f'    param dt = {_num(dt)} where dt > 0    "time step"',
    ]
    for name in p.params:
        where = f" where {name} > 0" if name in _POSITIVE else ""
        doc = _PARAM_DOCS[name] + (f"; per neuron, shape {tuple(shapes[name])}" if name in shapes else "")
        lines.append(f"    param {name} = {_num(values[name])}{where}{' learnable' if name in learn else ''}"
                     f'    "{doc}"')
    if "v" in p.states:
        lines.append(f'    state v = {_INITIAL[kind]}    "membrane potential"')
    if "i" in p.states:
        lines.append('    state i = 0.0    "synaptic current"')
    lines.append("")
    if p.states:
        ode = method == "exact" and not p.exact_update
        lines.append("    equations method exact:" if ode else "    update:")
        lines += [f"        {s}" for s in (p.euler if method == "euler" else p.exact)]
        lines.append("")
    if kind == "Threshold":
        lines += [f"    spike when x > threshold surrogate {surrogate}", ""]
    elif p.spiking:
        lines += [f"    spike when v > v_threshold surrogate {surrogate}", "", "    on spike:", "        v = v_reset", ""]
    lines += [f"    output {p.output}", ""]
    return "\n".join(lines)


# ============================================================================ equations -> linear step
@dataclass
class Affine:
    """sum(coef[name] * name) + const: a linear map's row (coefficients are param expressions)."""

    coef: dict[str, sp.Expr]
    const: sp.Expr


@dataclass
class LinearStep:
    """A model's step as a linear map between spikes: what export needs to name a primitive."""

    compiled: Compiled
    input: str
    states: list[str]
    next: dict[str, Affine]  # between spikes: next states from the previous states and the input
    reset: dict[str, Affine]  # the same, at a spike
    fire_on: str | None  # the state (or, without states, the input) the spike thresholds
    k: sp.Expr  # the spike fires on  k * fire_on + m  (after the update) compared with 0
    m: sp.Expr
    op: str | None  # ">=" or ">"
    output: str
    pos: dict[str, A.Pos]  # each state's first statement; "spike"; "output"; "reset:<state>"

    def error(self, msg: str, where: str, hint: str | None = None) -> FlexDSLError:
        ck = self.compiled.checked
        p = self.pos.get(where, ck.ast.pos)
        return FlexDSLError(msg, ck.filename, p.line, p.column, ck.source, hint)


_SYMPY_NAMES = {f.sympy: f.name for f in FUNCTIONS.values()}
_LINEAR_HINT = ("NIR's neurons (LIF, IF, LI, CubaLIF, CubaLI, I) are linear between spikes; "
                "a model with this equation can only run in flexdsl")


def _opaque(e: sp.Expr, variables: Sequence[sp.Symbol]) -> tuple[sp.Expr, dict[sp.Symbol, sp.Expr]]:
    """`e` with every function application free of `variables` (a param-only `where(...)`, an
    `exp(-dt/tau)`) replaced by a symbol, so that sympy's polynomials see its structure."""
    hide: dict[sp.Expr, sp.Symbol] = {}
    for f in e.atoms(sp.Function, sp.Piecewise):
        if not any(f.has(v) for v in variables):
            hide[f] = sp.Dummy("c")
    return e.xreplace(hide), {d: f for f, d in hide.items()}


def _nonlinearity(e: sp.Expr, variables: Sequence[sp.Symbol]) -> str | None:
    """Why `e` is not linear in `variables` (None when it is)."""
    e, _ = _opaque(sp.expand(e), variables)
    present = [v for v in variables if e.has(v)]
    if not present:
        return None
    try:
        poly = sp.Poly(e, *present)
    except sp.PolynomialError:
        for sub in sp.preorder_traversal(e):
            if isinstance(sub, sp.Pow) and any(sub.base.has(v) for v in present):
                v = next(v for v in present if sub.base.has(v))
                return f"divides by `{v}`" if sub.exp.is_negative else f"takes a power of `{v}`"
            if isinstance(sub, sp.Function | sp.Piecewise) and any(sub.has(v) for v in present):
                v = next(v for v in present if sub.has(v))
                fname = _SYMPY_NAMES.get(type(sub).__name__, type(sub).__name__.lower())
                return f"uses `{v}` inside `{fname}(...)`"
        return "is not linear in the states and the input"
    for monom in poly.monoms():
        if sum(monom) > 1:
            used = [(present[i], k) for i, k in enumerate(monom) if k]
            if len(used) == 1:
                v, k = used[0]
                return f"is quadratic in `{v}`" if k == 2 else f"is of degree {k} in `{v}`"
            return "multiplies " + " and ".join(f"`{v}`" for v, _ in used)
    return None


def _is_zero(e: sp.Expr) -> bool:
    e = sp.expand(e)
    return e == 0 or sp.simplify(e) == 0


def _affine(e: sp.Expr, variables: Sequence[sp.Symbol]) -> Affine | None:
    e, back = _opaque(sp.expand(e), variables)
    present = [v for v in variables if e.has(v)]
    if not present:
        return Affine({v.name: sp.Integer(0) for v in variables}, e.xreplace(back))
    try:
        poly = sp.Poly(e, *present)
    except sp.PolynomialError:
        return None
    if poly.total_degree() > 1:
        return None
    coef = {v.name: (poly.coeff_monomial(v).xreplace(back) if v in present else sp.Integer(0)) for v in variables}
    return Affine(coef, poly.coeff_monomial(1).xreplace(back))


_ANALYSES: dict[tuple[str, str, bool], LinearStep] = {}


def analyse(c: Compiled) -> LinearStep:
    """The model's step as a linear map, or a located FlexDSLError naming the first statement
    that no NIR primitive has."""
    key = (c.text, c.filename, c.detach_reset)
    hit = _ANALYSES.get(key)
    if hit is None:
        hit = _analyse(c)
        _ANALYSES[key] = hit
    return hit


def _analyse(c: Compiled) -> LinearStep:
    from .ir.functions import Detach
    from .ir.lower import sym, to_sympy

    ck = c.checked

    def err(msg: str, pos: A.Pos, hint: str | None = None) -> FlexDSLError:
        return FlexDSLError(msg, ck.filename, pos.line, pos.column, ck.source, hint)

    states = [s.name for s in ck.states]
    x = ck.inputs[0].name
    pos: dict[str, A.Pos] = {}

    # -- every statement linear in the states, the input, and the locals that depend on them
    defs = [(st.target, st.value) for st in ck.update if st.target not in states]
    if ck.equations is not None:
        defs += [(ln.name, ln.value) for ln in ck.equations.lines if isinstance(ln, A.Subexpr)]
    dynamic = {i.name for i in ck.inputs} | set(states)
    grown = True
    while grown:
        grown = False
        for name, e in defs:
            if name not in dynamic and any(n.id in dynamic for n in A.names(e)):
                dynamic.add(name)
                grown = True
    names = [i.name for i in ck.inputs] + states + list(ck.locals) + list(ck.subexprs)
    env: dict[str, sp.Expr] = {n: sym(n) for n in names} | {p.name: sym(p.name) for p in ck.params}
    variables = [sym(n) for n in names if n in dynamic]

    def linear(e: A.Expr, what: str, at: A.Pos) -> None:
        why = _nonlinearity(to_sympy(e, env), variables)
        if why is not None:
            raise err(f"{what} {why}: no NIR primitive has this form", at, _LINEAR_HINT)

    if ck.refractory is not None or (ck.spike is not None and ck.spike.op == "crosses"):
        at = ck.refractory.pos if ck.refractory is not None else ck.spike.pos  # type: ignore[union-attr]
        raise err("NIR's neurons have no refractoriness and no crossing rule", at, _LINEAR_HINT)
    for item in ck.ast.items:  # in source order, with the checked (in a model with units: converted) values
        if isinstance(item, A.Equations):
            item = ck.equations
        elif isinstance(item, A.Update):
            item = A.Update(ck.update, item.pos)
        elif isinstance(item, A.SpikeRule):
            item = ck.spike
        elif isinstance(item, A.OnSpike):
            item = A.OnSpike(ck.on_spike, item.pos)
        if isinstance(item, A.Equations):
            for ln in item.lines:
                if isinstance(ln, A.ODE):
                    pos.setdefault(ln.state, ln.pos)
                    linear(ln.value, f"d{ln.state}/dt", ln.pos)
                else:
                    linear(ln.value, f"`{ln.name}`", ln.pos)
        elif isinstance(item, A.Update):
            for st in item.statements:
                if st.target in states:
                    pos.setdefault(st.target, st.pos)
                what = f"the update of `{st.target}`" if st.target in states else f"`{st.target}`"
                if st.op in ("*=", "/=") and any(to_sympy(st.value, env).has(v) for v in variables):
                    raise err(f"{what} {'multiplies' if st.op == '*=' else 'divides'} it by a state or the "
                              "input: no NIR primitive has this form", st.pos, _LINEAR_HINT)
                linear(st.value, what, st.pos)
        elif isinstance(item, A.SpikeRule):
            pos["spike"] = item.pos
            linear(A.BinOp("-", item.left, item.right, item.pos), "the spike condition", item.pos)
        elif isinstance(item, A.OnSpike):
            for st in item.statements:
                pos.setdefault(f"reset:{st.target}", st.pos)
    pos["output"] = ck.outputs[0][1]
    for s in ck.states:
        pos.setdefault(s.name, s.pos)
    if len(ck.inputs) != 1:
        raise err(f"a NIR node has one input; `{ck.name}` declares {len(ck.inputs)}", ck.inputs[1].pos,
                  "NIR sums every edge into a node into its one input")
    if len(ck.outputs) != 1:
        raise err(f"a NIR node has one output; `{ck.name}` outputs {len(ck.outputs)}", ck.outputs[1][1],
                  "output `spike` for a spiking neuron, the membrane potential for a non-spiking one")
    if len(states) > 2:
        raise err(f"`{ck.name}` has {len(states)} states; NIR's neurons have at most two (CubaLIF: a synaptic "
                  "current and a membrane potential)", ck.states[2].pos)

    # -- the whole step as one map of the previous states and the input
    step = c.step
    subs: dict[sp.Symbol, sp.Expr] = {}
    u_full: sp.Expr | None = None
    for y, e in step.assignments:
        e = e.xreplace(subs)
        if step.spike is not None and y == step.spike:
            u_full = e.args[0]
            continue
        subs[y] = e.replace(Detach, lambda a: a)
    s = step.spike
    prev = [sym(n) for n in [*states, x]]
    nxt: dict[str, Affine] = {}
    rst: dict[str, Affine] = {}
    for name, e in zip(states, step.next_states):
        e = e.xreplace(subs)
        f0 = _affine(e.xreplace({s: 0}) if s is not None else e, prev)
        f1 = _affine(e.xreplace({s: 1}), prev) if s is not None else f0
        if f0 is None:
            raise err(f"the step of `{name}` is not linear in the states and the input: no NIR primitive has "
                      "this form", pos[name], _LINEAR_HINT)
        if f1 is None:
            raise err(f"the reset of `{name}` is not linear", pos.get(f"reset:{name}", pos["spike"]))
        nxt[name], rst[name] = f0, f1

    # -- the spike: a threshold on one state (on the input, without states)
    fire_on, k, m, op = None, sp.Integer(0), sp.Integer(0), None
    if ck.spike is not None:
        assert u_full is not None
        op = ck.spike.op
        u = _affine(u_full, prev)
        assert u is not None  # the condition was checked linear
        rows = {n: nxt[n] for n in states} if states else {x: Affine({v.name: sp.Integer(int(v.name == x))
                                                                     for v in prev}, sp.Integer(0))}
        for name, row in rows.items():
            lead = next((v for v in row.coef if not _is_zero(row.coef[v])), None)
            if lead is None:
                continue
            ratio = sp.simplify(u.coef[lead] / row.coef[lead])
            if all(_is_zero(u.coef[v] - ratio * row.coef[v]) for v in row.coef) and not _is_zero(ratio):
                fire_on, k, m = name, ratio, sp.expand(u.const - ratio * row.const)
                break
        if fire_on is None:
            raise err("the spike condition is not a threshold on one state: NIR's neurons fire when the "
                      "membrane potential crosses v_threshold", ck.spike.pos, "write `spike when v >= v_threshold`")
    output = ck.outputs[0][0]
    return LinearStep(c, x, states, nxt, rst, fire_on, k, m, op, output, pos)


def classify(ls: LinearStep) -> tuple[str, dict[str, str]]:
    """The NIR primitive a linear step has the structure of, and its states' roles
    (`{"v": membrane, "i": current}`), or a located FlexDSLError."""
    x, states = ls.input, ls.states
    spiking = ls.op is not None
    if not states:
        if spiking and ls.fire_on == x:
            return "Threshold", {}
        raise ls.error("a model without states has no NIR neuron equivalent", "output")
    if spiking:
        v = ls.fire_on
        assert v is not None
        if ls.output != "spike":
            raise ls.error(f"a spiking NIR neuron outputs its spikes, not `{ls.output}`", "output",
                           "write `output spike`")
        r = ls.reset[v]
        if all(_is_zero(r.coef[n] - ls.next[v].coef[n]) for n in r.coef) and _is_zero(r.const - ls.next[v].const):
            raise ls.error(f"the spike does not reset `{v}`: NIR's spiking neurons set v to v_reset at a spike",
                           "spike", f"add `on spike:` with `{v} = v_reset`")
        if any(not _is_zero(c) for c in r.coef.values()):
            raise ls.error(f"the reset of `{v}` depends on its value (e.g. a subtraction): NIR's spiking neurons "
                           "set v to a constant v_reset", f"reset:{v}", f"write `{v} = v_reset`")
        for n in states:
            if n != v and not (all(_is_zero(ls.reset[n].coef[q] - ls.next[n].coef[q]) for q in ls.reset[n].coef)
                               and _is_zero(ls.reset[n].const - ls.next[n].const)):
                raise ls.error(f"a spike changes `{n}`: NIR's spiking neurons reset only the membrane potential",
                               f"reset:{n}")
    else:
        if ls.output not in states:
            raise ls.error(f"a non-spiking NIR neuron outputs its membrane potential (a state), not `{ls.output}`",
                           "output")
        v = ls.output
    row = ls.next[v]
    if len(states) == 1:
        if _is_zero(row.coef[x]):
            raise ls.error(f"the input does not reach `{v}`", v)
        if _is_zero(row.coef[v] - 1):
            if not _is_zero(row.const):
                raise ls.error(f"`{v}` changes by a constant every step: NIR's IF and I have no bias", v)
            return ("IF" if spiking else "I"), {"v": v}
        return ("LIF" if spiking else "LI"), {"v": v}
    i = next(n for n in states if n != v)
    cur = ls.next[i]
    if not _is_zero(cur.coef[v]):
        raise ls.error(f"`{i}` depends on `{v}`: NIR's CubaLIF current is driven by the input only", i)
    if _is_zero(cur.coef[x]):
        raise ls.error(f"the input does not reach `{i}`: NIR's CubaLIF feeds the input into its current", i)
    if _is_zero(row.coef[i]):
        raise ls.error(f"`{v}` does not depend on `{i}`: NIR's CubaLIF membrane integrates its current", v)
    if not _is_zero(cur.const):
        raise ls.error(f"`{i}` relaxes to a nonzero value: NIR's CubaLIF current decays to 0", i)
    return ("CubaLIF" if spiking else "CubaLI"), {"v": v, "i": i}


def _coefficients(ls: LinearStep, kind: str, roles: Mapping[str, str]) -> dict[str, sp.Expr]:
    """The named coefficients of a step (the same names for a model and for a NIR primitive)."""
    x = ls.input
    out: dict[str, sp.Expr] = {}
    if "v" in roles:
        v = roles["v"]
        row = ls.next[v]
        out.update({"a": row.coef[v], "b": row.coef[x], "c": row.const})
        if "i" in roles:
            i = roles["i"]
            cur = ls.next[i]
            out.update({"alpha": cur.coef[i], "beta": cur.coef[x], "gamma": row.coef[i]})
    if ls.op is not None:
        out.update({"k": ls.k, "m": ls.m})
        if "v" in roles:
            out["reset"] = ls.reset[roles["v"]].const
    return out


_DESCRIBE = {"a": "the decay of `{v}`", "b": "the weight of the input on `{v}`", "c": "the drift of `{v}`",
             "alpha": "the decay of `{i}`", "beta": "the weight of the input on `{i}`",
             "gamma": "the weight of `{i}` on `{v}`"}
_FIT = ("a", "b", "c", "alpha", "beta", "gamma")


# ============================================================================ numbers
def _evaluator(exprs: Mapping[str, sp.Expr], symbols: Sequence[sp.Symbol]):
    """A generated torch function of `symbols` returning the values of `exprs` (printed by the
    torch backend's printer from sympy; run through the one loader of generated code)."""
    from .backends.torch.emit import TorchPrinter
    from .store import cache
    from .store.generated import load_module

    pr = TorchPrinter()
    args = ", ".join(pr._print(s) for s in symbols)
    body = ", ".join(pr.doprint(e) for e in exprs.values())
    source = ("# Generated by flexdsl.nir: step coefficients from params. Do not edit.\n"
              "import torch\n\nfrom flexdsl.backends.torch import ops\n\n\n"
              f"def coefficients({args}):\n    return ({body},)\n")
    return load_module("nircoef", cache.key("nir-coefficients", source), source).coefficients


def _values(exprs: Mapping[str, sp.Expr], symbols: Sequence[sp.Symbol], args: Sequence[Any]) -> dict[str, np.ndarray]:
    fn = _evaluator(exprs, symbols)
    ts = [torch.as_tensor(a.detach().cpu() if isinstance(a, torch.Tensor) else a, dtype=torch.float64) for a in args]
    with torch.no_grad():
        res = fn(*ts)
    return {name: np.asarray(torch.as_tensor(r, dtype=torch.float64).numpy(), dtype=np.float64)
            for name, r in zip(exprs, res)}


def _decay_to_tau(a: np.ndarray, dt: float, method: str) -> np.ndarray | None:
    """The time constant whose step has decay factor `a` (None where there is none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if method == "euler":
            ok = a < 1
            tau = dt / (1 - a)
        else:
            ok = (a > 0) & (a < 1)
            tau = -dt / np.log(a)
    return tau if bool(np.all(ok & np.isfinite(tau))) else None


def _kappa(a: np.ndarray, tau_syn: np.ndarray, tau_mem: np.ndarray, dt: float) -> np.ndarray:
    """Exact CubaLIF: the weight of the current on the membrane over one step, per unit r,
    a*(dt/tau_mem)*expm1(z)/z with z = dt*(tau_syn - tau_mem)/(tau_syn*tau_mem) (no cancellation)."""
    z = dt * (tau_syn - tau_mem) / (tau_syn * tau_mem)
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = np.where(np.abs(z) > 1e-12, np.expm1(z) / np.where(z == 0, 1.0, z), 1.0 + z / 2)
    return a * (dt / tau_mem) * phi


_DT = sp.Symbol("_dt", positive=True)  # the export's step, an argument of the evaluated fit


def _invalid(kind: str, co: Mapping[str, np.ndarray], method: str) -> str | None:
    """Why the model's coefficients have no NIR params under `method` (None if they have)."""
    def bad_decay(a: np.ndarray) -> bool:
        return not bool(np.all((a < 1) & ((a > 0) if method == "exact" else True)))

    for key, state in (("a", "{v}"), ("alpha", "{i}")):
        if key in co and kind not in ("IF", "I") and bad_decay(co[key]):
            need = "0 < factor < 1" if method == "exact" else "factor < 1"
            return (f"the decay factor of `{state}` per step is {_show(co[key])}; a time constant under {method} "
                    f"needs {need}")
    if "k" in co and not bool(np.all(co["k"] > 0)):
        return "the spike fires when the potential falls below a threshold"
    return None


def _fit_exprs(kind: str, e: Mapping[str, sp.Expr], method: str) -> dict[str, sp.Expr]:
    """NIR params as expressions of the model's params and the step `_DT` (r of the exact
    CubaLIF is numeric: see `_kappa`)."""
    def tau(a: sp.Expr) -> sp.Expr:
        # exact: a > 0 (checked), so log(a) may be expanded (log(exp(-dt/tau)) is -dt/tau)
        return _DT / (1 - a) if method == "euler" else -_DT / sp.expand_log(sp.log(a), force=True)

    out: dict[str, sp.Expr] = {}
    if kind in ("IF", "I"):
        out["r"] = e["b"] / _DT
    elif kind in ("LIF", "LI"):
        out.update(tau=tau(e["a"]), r=e["b"] / (1 - e["a"]), v_leak=e["c"] / (1 - e["a"]))
    elif kind in ("CubaLIF", "CubaLI"):
        out.update(tau_mem=tau(e["a"]), v_leak=e["c"] / (1 - e["a"]), tau_syn=tau(e["alpha"]),
                   w_in=e["beta"] / (1 - e["alpha"]))
        if method == "euler":  # v' = a v + (1 - a) r (alpha i + beta x) + c
            out["r"] = e["b"] / ((1 - e["a"]) * e["beta"])
    if "k" in e:
        out["threshold" if kind == "Threshold" else "v_threshold"] = -e["m"] / e["k"]
        if "reset" in e:
            out["v_reset"] = e["reset"]
    return {k: _simplify(v) for k, v in out.items()}


def _simplify(e: sp.Expr) -> sp.Expr:
    """A fit expression simplified where that is cheap (dt/(1 - (1 - 1/tau)) is dt*tau, and
    log(exp(-dt/tau)) is -dt/tau: the params come out as the model wrote them)."""
    if sp.count_ops(e) > 40:
        return e
    return sp.simplify(e)


def _fit(kind: str, e: Mapping[str, sp.Expr], co: Mapping[str, np.ndarray], method: str, c: Compiled,
         vals: Mapping[str, Any], dt: float) -> tuple[dict[str, np.ndarray], str | None]:
    reason = _invalid(kind, co, method)
    if reason is not None:
        return {}, reason
    exprs = _fit_exprs(kind, e, method)
    symbols = [p.symbol for p in c.step.params] + [_DT]
    out = _values(exprs, symbols, [vals[p.name] for p in c.step.params] + [dt])
    if kind in ("CubaLIF", "CubaLI") and method == "exact":
        out["r"] = co["gamma"] / _kappa(co["a"], out["tau_syn"], out["tau_mem"], dt)
    bad = [n for n, v in out.items() if not bool(np.all(np.isfinite(v)))]
    if bad:
        return out, f"with these param values NIR's `{bad[0]}` is not finite"
    return out, None


def _show(a: np.ndarray) -> str:
    a = np.asarray(a)
    return f"{float(a.flat[0]):.6g}" if a.size == 1 or bool(np.all(a == a.flat[0])) else f"{a.flatten()[:4]}"


_CANONICAL: dict[tuple[str, str], tuple[LinearStep, dict[str, sp.Expr]]] = {}


def _primitive_coefficients(kind: str, method: str) -> tuple[LinearStep, dict[str, sp.Expr]]:
    """The coefficients of the step that `load` runs for a primitive (flexdsl's own lowering of
    the generated text), as expressions of the NIR params and dt."""
    hit = _CANONICAL.get((kind, method))
    if hit is None:
        p = PRIMITIVES[kind]
        text = neuron_text(kind, dict.fromkeys(p.params, 1.0), 1.0, method)
        ls = analyse(compile_model(text))
        found, roles = classify(ls)
        assert found == kind, (found, kind)
        hit = (ls, _coefficients(ls, kind, roles))
        _CANONICAL[(kind, method)] = hit
    return hit


@dataclass
class Exported:
    """A neuron matched to a NIR primitive: its kind, params (arrays) and how."""

    kind: str
    params: dict[str, np.ndarray]
    method: str
    op: str | None
    surrogate: str | None


def match(module: NeuronModule | Compiled | str, dt: float, method: str = "auto",
          values: Mapping[str, Any] | None = None) -> Exported:
    """The NIR primitive a model is, with its params at step `dt` (from the module's current
    params, or `values`, or the model's defaults); a located FlexDSLError where there is none."""
    dt = _check_dt(dt)
    if method not in ("auto", *METHODS):
        raise FlexDSLError(f"method must be 'auto', 'euler' or 'exact', not {method!r}", "<flexdsl.nir>",
                           hint=did_you_mean(str(method), ["auto", *METHODS]))
    if isinstance(module, NeuronModule):
        c = module.compiled
        vals = dict(module.param_values())
    else:
        c = module if isinstance(module, Compiled) else compile_model(module)
        from .runtime.module import resolve_params

        vals = resolve_params(c, dict(values or {}))
    ls = analyse(c)
    kind, roles = classify(ls)
    model_co = _coefficients(ls, kind, roles)
    exprs = dict(model_co)
    sur = c.step.surrogate
    builtin = sur is not None and c.checked.surrogate is not None and c.checked.surrogate.user is None
    if builtin:
        exprs.update({f"sur:{kw}": e for kw, e in sur.kwargs.items()})
    co = _values(exprs, [p.symbol for p in c.step.params], [vals[p.name] for p in c.step.params])
    surrogate = None
    if builtin and all(co[f"sur:{kw}"].size == 1 for kw in sur.kwargs):
        surrogate = _surrogate(f"{sur.name}(" + ", ".join(f"{kw}={float(co[f'sur:{kw}'].flat[0])!r}"
                                                          for kw in sur.kwargs) + ")")
    preferred = _preferred(c, method)
    failures: list[tuple[str, str]] = []
    for meth in preferred:
        fitted, reason = _fit(kind, model_co, co, meth, c, vals, dt)
        if reason is None:
            reason = _verify(kind, meth, fitted, co, dt)
        if reason is None:
            if ls.op == ">=":
                key = "threshold" if kind == "Threshold" else "v_threshold"
                fitted[key] = _below_float32(fitted[key])
            return Exported(kind, fitted, meth, ls.op, surrogate)
        failures.append((meth, reason))
    meth, reason = failures[0]
    v = roles.get("v", ls.fire_on or ls.input)
    where = roles["i"] if "{i}" in reason else v
    raise ls.error(f"NIR {kind} discretised with {meth}: " + reason.format(v=v, i=roles.get("i", "")), where,
                   _method_hint(kind, preferred))


def _preferred(c: Compiled, method: str) -> list[str]:
    if method != "auto":
        return [method]
    m = c.step.method
    first = "exact" if m is not None and m != "euler" else "euler"
    return [first, "exact" if first == "euler" else "euler"]


def _method_hint(kind: str, tried: Sequence[str]) -> str:
    if kind in ("CubaLIF", "CubaLI"):
        return ("under euler the current is updated first and the membrane sees the new current (snnTorch's "
                "Synaptic, Norse, SpikingJelly's CUBALIFNode); under exact the step is the closed-form solution "
                "with the input held over the step" + ("" if len(tried) > 1 else "; try the other method"))
    return "try the other method" if len(tried) == 1 else "check the params"


def _verify(kind: str, method: str, fitted: Mapping[str, np.ndarray], co: Mapping[str, np.ndarray],
            dt: float) -> str | None:
    """None where the step that `load` runs for `fitted` equals the model's, else which
    coefficient differs."""
    ls, exprs = _primitive_coefficients(kind, method)
    need = {k: e for k, e in exprs.items() if k in _FIT}
    if not need:
        return None
    symbols = [p.symbol for p in ls.compiled.step.params]
    args = [dt if s.name == "dt" else fitted[s.name] for s in symbols]
    got = _values(need, symbols, args)
    for key in need:
        want = co[key]
        scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-300)
        if not np.allclose(got[key], want, rtol=1e-7, atol=1e-9 * scale):
            return f"{_DESCRIBE[key]} would be {_show(got[key])}, but the model's is {_show(want)}"
    return None


def _below_float32(thr: np.ndarray) -> np.ndarray:
    """The largest float32 below each threshold: in float32, `v > t'` is exactly `v >= t`."""
    t32 = np.asarray(thr, dtype=np.float64).astype(np.float32)
    return np.nextafter(t32, np.float32(-np.inf)).astype(np.float64)


def _check_dt(dt: Any) -> float:
    try:
        d = float(dt)
    except (TypeError, ValueError):
        d = float("nan")
    if not (math.isfinite(d) and d > 0):
        raise FlexDSLError(f"dt must be a positive finite number, not {dt!r}", "<flexdsl.nir>",
                           hint="NIR is continuous time: dt is the length of one flexdsl step in NIR's time unit")
    return d


# ============================================================================ export
_SKIP = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Flatten, nn.AvgPool2d)
_EXPORTABLE = ("flexdsl neurons, torch.nn.Linear, Conv1d, Conv2d, Flatten, AvgPool2d, Identity and Dropout, "
               "and `+` of two branches")


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (NeuronModule, *_LAYERS, *_SKIP)) or super().is_leaf_module(m, qualname)


def _net_error(msg: str, hint: str | None = None) -> FlexDSLError:
    return FlexDSLError(msg, _NETWORK, hint=hint)


def export(net: nn.Module, sample_input: torch.Tensor, dt: float | None = None, *, method: str = "auto",
           path: str | Path | None = None) -> nir_t.NIRGraph:
    """A `nir.NIRGraph` of a network of torch layers and flexdsl neurons (or of one neuron).

    `sample_input` is one input of the network (`[T, batch, *shape]`, or `[batch, *shape]`
    when the neurons use step_mode "s"); it gives the layers' shapes, and the network's states
    are left as they were. `dt` is the length of one step in NIR's (continuous) time unit.
    `method` is the discretisation the neurons' steps are read as: "euler", "exact", or "auto"
    (a neuron's own ODE method where it has one, else euler; the other where that does not
    fit). With `path`, the graph is also written there (`nir.write`).
    """
    nir = _nir()
    if dt is None:
        raise FlexDSLError("dt is needed: NIR is continuous time", "<flexdsl.nir>",
                           hint="pass dt=..., the length of one flexdsl step in NIR's time unit (e.g. dt=1e-3 for "
                           "1 ms steps in seconds)")
    dt = _check_dt(dt)
    if method not in ("auto", *METHODS):
        raise FlexDSLError(f"method must be 'auto', 'euler' or 'exact', not {method!r}", "<flexdsl.nir>",
                           hint=did_you_mean(str(method), ["auto", *METHODS]))
    if not isinstance(net, nn.Module):
        raise _net_error(f"export takes a torch.nn.Module, not {type(net).__name__}")
    if not isinstance(sample_input, torch.Tensor):
        raise _net_error(f"sample_input must be a tensor, not {type(sample_input).__name__}")
    if isinstance(net, NIRNetwork):
        return _export_network(nir, net, sample_input, dt, method, path)
    root = net
    if isinstance(net, (NeuronModule, *_LAYERS)):
        name = net.compiled.name.lower() if isinstance(net, NeuronModule) else type(net).__name__.lower()
        root = nn.Sequential(OrderedDict([(name, net)]))
    modes = {m.step_mode for m in root.modules() if isinstance(m, NeuronModule)}
    if len(modes) > 1:
        raise _net_error("the network mixes step modes 's' and 'm'", "give every flexdsl neuron the same step_mode")
    lead = (1 if modes == {"s"} else 2) if modes else min(2, sample_input.dim() - 1)
    if sample_input.dim() <= lead:
        raise _net_error(f"sample_input has shape {tuple(sample_input.shape)}, but the network takes "
                         + ("[T, batch, *shape]" if lead == 2 else "[batch, *shape]"),
                         "add the batch dimension (and the time dimension in step_mode 'm')")
    for qual, m in root.named_modules():  # a model without NIR equivalent: its located error first
        if isinstance(m, NeuronModule):
            try:
                classify(analyse(m.compiled))
            except FlexDSLError as e:
                raise _in_layer(e, qual, m) from None
    try:
        graph = _Tracer().trace(root)
    except Exception as e:  # fx cannot follow data-dependent Python in forward
        raise _net_error(f"cannot trace the network's forward with torch.fx: {e}",
                         "export a torch.nn.Sequential, or a module whose forward only calls layers and adds "
                         "branches") from None
    records, out_shape = _shapes(root, sample_input, lead)
    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str]] = []
    values: dict[torch.fx.Node, list[str]] = {}
    used: set[str] = set()

    def unique(base: str) -> str:
        name, k = base, 1
        while name in used or name in ("input", "output"):
            name = f"{base}_{k}"
            k += 1
        used.add(name)
        return name

    def sources(arg: Any, where: str) -> list[str]:
        if isinstance(arg, torch.fx.Node) and arg in values and values[arg] is not None:
            return values[arg]
        raise _net_error(f"{where} takes something other than the output of a layer ({arg!r})", _EXPORTABLE)

    placeholders = 0
    for n in graph.nodes:
        if n.op == "placeholder":
            placeholders += 1
            values[n] = ["input"] if placeholders == 1 else None  # type: ignore[assignment]
            if placeholders == 1:
                nodes["input"] = nir.Input(input_type=np.array(sample_input.shape[lead:]))
        elif n.op == "call_module":
            mod = root.get_submodule(n.target)
            if len(n.args) != 1 or n.kwargs:
                raise _net_error(f"`{n.target}` is called with {len(n.args)} arguments; NIR layers take one")
            src = sources(n.args[0], f"`{n.target}`")
            if isinstance(mod, _SKIP):
                values[n] = src
                continue
            if not isinstance(mod, (NeuronModule, *_LAYERS)):
                raise _net_error(f"cannot export `{n.target}` ({type(mod).__module__}.{type(mod).__qualname__}): "
                                 "NIR has no such layer", "exportable: " + _EXPORTABLE)
            if not records[mod]:
                raise _net_error(f"`{n.target}` was not called when the network ran on sample_input")
            shape_in, shape_out = records[mod].pop(0)
            name = unique(str(n.target))
            nodes[name] = _node(nir, mod, name, tuple(shape_in[lead:]), tuple(shape_out[lead:]), lead, dt, method)
            edges += [(s, name) for s in src]
            values[n] = [name]
        elif (n.op == "call_function" and n.target in (operator.add, torch.add)) or \
                (n.op == "call_method" and n.target == "add"):
            if len(n.args) != 2 or n.kwargs:
                raise _net_error("only `a + b` of two layer outputs can be exported")
            a, b = (sources(arg, "`+`") for arg in n.args)
            if set(a) & set(b):
                raise _net_error("a branch is added to itself; NIR sums distinct edges only")
            values[n] = a + b
        elif n.op == "output":
            src = sources(n.args[0], "the network's output")
            nodes["output"] = nir.Output(output_type=np.array(out_shape))
            edges += [(s, "output") for s in src]
        else:
            what = getattr(n.target, "__name__", str(n.target))
            raise _net_error(f"the network's forward calls `{what}` ({n.op}); NIR has no such operation",
                             "use layers (e.g. torch.nn.Flatten instead of x.flatten()); exportable: " + _EXPORTABLE)
    g = nir.NIRGraph(nodes=nodes, edges=edges, metadata={"flexdsl_dt": dt, "source": "flexdsl"})
    if path is not None:
        _write(nir, path, g)
    return g


def _write(nir, path: str | Path, g) -> None:
    try:
        nir.write(str(path), g)
    except OSError as e:
        raise FlexDSLError(f"cannot write the NIR graph: {e}", str(path)) from None


def _export_network(nir, net: NIRNetwork, x: torch.Tensor, dt: float, method: str, path) -> nir_t.NIRGraph:
    """A graph of a network that `load` made (trained, perhaps): its nodes and edges, with the
    neurons matched again from their equations."""
    lead = 1 if net.step_mode == "s" else 2
    if x.dim() <= lead:
        raise _net_error(f"sample_input has shape {tuple(x.shape)}, but the network takes "
                         + ("[T, batch, *shape]" if lead == 2 else "[batch, *shape]"))
    neurons = [m for m in net.nodes.values() if isinstance(m, NeuronModule)]
    saved = [(m, dict(m._states), dict(m.state_seqs)) for m in neurons]
    prev = net._prev
    net._shapes, net._prev = {}, {}
    try:
        with torch.no_grad():
            net(x)
    except FlexDSLError:
        raise
    except Exception as e:
        raise _net_error(f"the network fails on sample_input of shape {tuple(x.shape)}: {e}") from None
    finally:
        shapes, net._shapes, net._prev = net._shapes, None, prev
        for m, st, seqs in saved:
            m._states.update(st)
            m.__dict__["state_seqs"] = seqs
    inv = {k: n for n, k in net.names.items()}
    nodes: dict[str, Any] = {}
    for key in net.order:
        name, kind, m = inv[key], net.kinds[key], net.nodes[key] if key in net.nodes else None
        per_in, per_out = shapes.get(key, ((), ()))
        if key == net.entry:
            nodes[name] = nir.Input(input_type=np.array(x.shape[lead:]))
        elif key in net.exits:
            nodes[name] = nir.Output(output_type=np.array(per_out))
        elif kind == "neuron":
            nodes[name] = _neuron_node(nir, m, name, per_in, per_out, lead, dt, method)
        elif kind == "flatten":
            nodes[name] = nir.Flatten(input_type={"input": np.array(per_in)}, start_dim=m.start_dim, end_dim=m.end_dim)
        elif isinstance(m, _Scale):
            nodes[name] = nir.Scale(scale=m.scale.detach().cpu().numpy())
        elif isinstance(m, nn.AvgPool2d) and m.divisor_override == 1:
            nodes[name] = nir.SumPool2d(kernel_size=np.array(m.kernel_size), stride=np.array(m.stride),
                                        padding=np.array(m.padding))
        elif m is not None:
            nodes[name] = _node(nir, m, name, per_in, per_out, lead, dt, method)

    def sources(key: str) -> list[str]:  # through the pass-through nodes of flattened subgraphs
        if key in nodes or inv[key] in nodes:
            return [key]
        return [s for p in net.preds[key] + net.back_preds[key] for s in sources(p)]

    edges = [(inv[s], inv[key]) for key in net.order if inv[key] in nodes
             for p in net.preds[key] + net.back_preds[key] for s in sources(p)]
    g = nir.NIRGraph(nodes=nodes, edges=edges, metadata={"flexdsl_dt": dt, "source": "flexdsl"})
    if path is not None:
        _write(nir, path, g)
    return g


def _shapes(root: nn.Module, x: torch.Tensor, lead: int):
    """Run the network once on `x` (no grad, states restored): each layer's input and output
    shapes per call, and the network's per-sample output shape."""
    records: dict[nn.Module, list[tuple[tuple[int, ...], tuple[int, ...]]]] = defaultdict(list)
    handles = []
    for m in root.modules():
        if isinstance(m, (NeuronModule, *_LAYERS)):
            def hook(mod, args, out):
                o = out[0] if isinstance(out, tuple) else out
                records[mod].append((tuple(args[0].shape), tuple(o.shape)))

            handles.append(m.register_forward_hook(hook))
    saved = [(m, dict(m._states), dict(m.state_seqs)) for m in root.modules() if isinstance(m, NeuronModule)]
    training = [(m, m.training) for m in root.modules()]
    try:
        root.eval()
        with torch.no_grad():
            out = root(x)
    except FlexDSLError:
        raise
    except Exception as e:
        raise _net_error(f"the network fails on sample_input of shape {tuple(x.shape)}: {e}") from None
    finally:
        for h in handles:
            h.remove()
        for m, st, seqs in saved:
            m._states.update(st)
            m.__dict__["state_seqs"] = seqs
        for m, t in training:
            m.training = t
    if not isinstance(out, torch.Tensor):
        raise _net_error(f"the network returns {type(out).__name__}; NIR graphs here have one output tensor")
    return records, tuple(out.shape[lead:])


def _node(nir, mod: nn.Module, name: str, per_in: tuple[int, ...], per_out: tuple[int, ...], lead: int,
          dt: float, method: str):
    make = next(f for t, f in _NODE_MAKERS.items() if isinstance(mod, t))
    return make(nir, mod, name, per_in, per_out, lead, dt, method)


def _in_layer(e: FlexDSLError, name: str, mod: NeuronModule) -> FlexDSLError:
    """A located error of a model, saying which layer of the network has it."""
    if not e.line:
        return e
    return FlexDSLError(f"layer `{name}`: {e.reason}", e.filename, e.line, e.column, mod.compiled.text, e.hint)


def _neuron_node(nir, mod: NeuronModule, name, per_in, per_out, lead, dt, method):
    shape = per_out
    try:
        ex = match(mod, dt, method)
    except FlexDSLError as e:
        raise _in_layer(e, name, mod) from None
    arrays = {}
    for k, v in ex.params.items():
        try:
            arrays[k] = np.broadcast_to(np.asarray(v, dtype=np.float64), shape).copy()
        except ValueError:
            raise _net_error(f"layer `{name}`: NIR param `{k}` has shape {np.shape(v)}, which does not broadcast "
                             f"to the layer's shape {shape}", "per-channel params must broadcast over one sample, "
                             "e.g. (C, 1, 1) for [C, H, W]") from None
    _warn_initial(mod, name, ex, arrays)
    meta = {"flexdsl_model": mod.compiled.name, "flexdsl_method": ex.method, "flexdsl_dt": dt}
    if ex.op is not None:
        meta["flexdsl_threshold"] = ex.op
    if ex.surrogate is not None:
        meta["flexdsl_surrogate"] = ex.surrogate
    cls = getattr(nir, ex.kind)
    if ex.kind == "Threshold":
        return cls(threshold=arrays["threshold"], metadata=meta)
    p = PRIMITIVES[ex.kind]
    return cls(**{k: arrays[k] for k in p.params}, metadata=meta)


def _warn_initial(mod: NeuronModule, name: str, ex: Exported, arrays: Mapping[str, np.ndarray]) -> None:
    """NIR records no initial state; `load` starts v at v_leak (v_reset for IF, 0 for I) and
    the current at 0: warn where the model starts elsewhere."""
    if ex.kind == "Threshold":
        return
    ls = analyse(mod.compiled)
    _, roles = classify(ls)
    want = {"v": arrays[_INITIAL[ex.kind]] if _INITIAL[ex.kind] in arrays else np.zeros(1)}
    if "i" in roles:
        want["i"] = np.zeros(1)
    for role, w in want.items():
        state = roles[role]
        init = mod._initial_value(state)
        init = np.asarray(init.detach().cpu() if isinstance(init, torch.Tensor) else init, dtype=np.float64)
        if not np.allclose(np.broadcast_to(init, np.broadcast_shapes(init.shape, w.shape)), w, rtol=1e-9, atol=1e-12):
            warnings.warn(f"layer `{name}`: `{state}` starts at {_show(init)}, but NIR records no initial state and "
                          f"flexdsl.nir.load starts it at {_show(w)}", stacklevel=4)


def _linear_node(nir, mod: nn.Linear, name, per, per_out, lead, dt, method):
    if len(per) != 1:
        raise _net_error(f"`{name}` (Linear) gets inputs of shape {per} per sample; NIR's Affine takes vectors",
                         "flatten first (torch.nn.Flatten)")
    w = mod.weight.detach().cpu().numpy()
    if mod.bias is None:
        return nir.Linear(weight=w)
    return nir.Affine(weight=w, bias=mod.bias.detach().cpu().numpy())


def _conv_node(nir, mod, name, per, per_out, lead, dt, method):
    two = isinstance(mod, nn.Conv2d)
    if len(per) != (3 if two else 2):
        raise _net_error(f"`{name}` gets inputs of shape {per} per sample")
    if mod.padding_mode != "zeros":
        raise _net_error(f"`{name}` pads with `{mod.padding_mode}`; NIR convolutions pad with zeros")
    bias = mod.bias.detach().cpu().numpy() if mod.bias is not None else np.zeros(mod.out_channels, np.float32)
    pad = mod.padding if isinstance(mod.padding, str) else (tuple(mod.padding) if two else mod.padding[0])
    cls = nir.Conv2d if two else nir.Conv1d
    return cls(input_shape=tuple(per[1:]) if two else per[1], weight=mod.weight.detach().cpu().numpy(),
               stride=tuple(mod.stride) if two else mod.stride[0], padding=pad,
               dilation=tuple(mod.dilation) if two else mod.dilation[0], groups=mod.groups, bias=bias)


def _flatten_node(nir, mod: nn.Flatten, name, per, per_out, lead, dt, method):
    # SpikingJelly's multi-step layers (step_mode "m") apply their torch layer to [T*batch, ...]
    front = 1 if lead == 2 and getattr(mod, "step_mode", None) == "m" else lead
    nd = len(per) + front
    start = mod.start_dim % nd
    end = mod.end_dim % nd
    if start < front:
        raise _net_error(f"`{name}` (Flatten(start_dim={mod.start_dim})) merges the time or batch dimension",
                         f"use start_dim={front} for inputs [T, batch, ...]" if front == 2 else "use start_dim=1")
    return nir.Flatten(input_type={"input": np.array(per)}, start_dim=start - front,
                       end_dim=-1 if end == nd - 1 else end - front)


def _pool_node(nir, mod: nn.AvgPool2d, name, per, per_out, lead, dt, method):
    if mod.ceil_mode or mod.divisor_override is not None or not mod.count_include_pad:
        raise _net_error(f"`{name}`: only AvgPool2d with ceil_mode=False, count_include_pad=True and no "
                         "divisor_override has a NIR equivalent")

    def pair(v):
        return np.array(v if isinstance(v, tuple | list) else (v, v))

    return nir.AvgPool2d(kernel_size=pair(mod.kernel_size), stride=pair(mod.stride), padding=pair(mod.padding))


_NODE_MAKERS = {NeuronModule: _neuron_node, nn.Linear: _linear_node, nn.Conv1d: _conv_node, nn.Conv2d: _conv_node,
                nn.Flatten: _flatten_node, nn.AvgPool2d: _pool_node}


# ============================================================================ import
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_SURROGATE = re.compile(rf"^\s*([a-z_][a-z0-9_]*)\s*\(\s*((?:[a-z_][a-z0-9_]*\s*=\s*{_NUMBER}\s*,?\s*)*)\)\s*$")
_KWARG = re.compile(rf"([a-z_][a-z0-9_]*)\s*=\s*({_NUMBER})")


def _surrogate(text: Any) -> str | None:
    """A built-in surrogate clause `name(k=number, ...)`, rebuilt from its parts (None if `text`
    is not one): nothing of the text reaches the generated model unchecked."""
    if not isinstance(text, str):
        return None
    m = _SURROGATE.match(text)
    if m is None or m.group(1) not in SURROGATES:
        return None
    known = SURROGATES[m.group(1)].defaults
    kwargs = _KWARG.findall(m.group(2))
    if any(k not in known for k, _ in kwargs) or len({k for k, _ in kwargs}) != len(kwargs):
        return None
    vals = [(k, float(v)) for k, v in kwargs]
    if not all(math.isfinite(v) for _, v in vals):
        return None
    return f"{m.group(1)}(" + ", ".join(f"{k}={v!r}" for k, v in vals) + ")"


def _read(graph_or_path: Any):
    nir = _nir()
    if isinstance(graph_or_path, str | Path):
        path = str(graph_or_path)
        if not Path(path).is_file():
            raise FlexDSLError(f"no such NIR file: `{path}`", path)
        try:
            return nir.read(path), path
        except Exception as e:  # h5py/nir raise many kinds of errors on a damaged file
            raise FlexDSLError(f"cannot read `{path}` as a NIR graph: {e}", path) from None
    if isinstance(graph_or_path, nir.NIRGraph):
        return graph_or_path, "<nir graph>"
    if isinstance(graph_or_path, nir.NIRNode) and not isinstance(graph_or_path, nir.Input | nir.Output):
        node = graph_or_path
        try:
            return nir.NIRGraph.from_list(node), "<nir graph>"
        except Exception as e:
            raise FlexDSLError(f"cannot make a graph of this {type(node).__name__} node: {e}", "<nir graph>") from None
    raise FlexDSLError(f"load takes a nir.NIRGraph, a NIR node or a path, not {type(graph_or_path).__name__}",
                       "<flexdsl.nir>")


@dataclass
class _Flat:
    nodes: dict[str, Any]  # path -> NIR node ("pass" for the Input/Output nodes of subgraphs)
    edges: list[tuple[str, str]]
    inputs: list[str]
    outputs: list[str]


def _flatten(graph, prefix: str = "") -> _Flat:
    """One flat graph: a subgraph's nodes are named `sub/node`; its Input and Output nodes pass
    their value through."""
    nir = _nir()
    flat = _Flat({}, [], [], [])
    entry: dict[str, list[str]] = {}
    exit_: dict[str, list[str]] = {}
    for name, node in graph.nodes.items():
        full = prefix + str(name)
        if isinstance(node, nir.NIRGraph):
            sub = _flatten(node, full + "/")
            flat.nodes.update(sub.nodes)
            flat.edges += sub.edges
            entry[str(name)], exit_[str(name)] = sub.inputs, sub.outputs
        else:
            if isinstance(node, nir.Input):
                flat.inputs.append(full)
            elif isinstance(node, nir.Output):
                flat.outputs.append(full)
            flat.nodes[full] = "pass" if prefix and isinstance(node, nir.Input | nir.Output) else node
            entry[str(name)] = exit_[str(name)] = [full]
    for a, b in graph.edges:
        a, b = str(a), str(b)
        for n in (a, b):
            if n not in entry:
                raise FlexDSLError(f"the edge ({a!r}, {b!r}) names `{n}`, which is not a node of the graph",
                                   "<nir graph>")
        flat.edges += [(s, d) for s in exit_[a] for d in entry[b]]
    return flat


def _np(a: Any, dtype: Any = np.float64) -> np.ndarray:
    """A NIR field as a numpy array (other tools store torch tensors in their graphs too)."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.array(a, dtype=dtype)


def _array(node: Any, field: str, where: str, kind: str) -> np.ndarray:
    try:
        a = _np(getattr(node, field))
    except (TypeError, ValueError):
        raise FlexDSLError(f"NIR node `{where}` ({kind}): `{field}` is not numeric", "<nir graph>") from None
    bad = ~np.isfinite(a) | ((a <= 0) if field in _POSITIVE else False)
    if bool(np.any(bad)):
        i = int(np.flatnonzero(bad)[0])
        want = "positive and finite" if field in _POSITIVE else "finite"
        raise FlexDSLError(f"NIR node `{where}` ({kind}): `{field}` must be {want}, got {float(a.flat[i])!r} at "
                           f"flat index {i}",
                           "<nir graph>")
    return a


def _neuron_module(kind: str, node: Any, where: str, dt: float, method: str, learnable: set[str],
                   surrogate: str, backend: str, detach_reset: bool) -> NeuronModule:
    from .api import loads

    p = PRIMITIVES[kind]
    arrays = {f: _array(node, f, where, kind) for f in p.params}
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
    except ValueError:
        raise FlexDSLError(f"NIR node `{where}` ({kind}): its params have shapes that do not broadcast: "
                           + ", ".join(f"{f} {a.shape}" for f, a in arrays.items()), "<nir graph>") from None
    scalars: dict[str, float] = {}
    channels: dict[str, np.ndarray] = {}
    for f, a in arrays.items():
        uniform = a.size > 0 and bool(np.all(a == a.flat[0]))
        if uniform and f not in learnable:
            scalars[f] = float(a.flat[0])
        else:
            channels[f] = np.broadcast_to(a, shape).copy() if f in learnable else a
            scalars[f] = float(a.flat[0]) if a.size else 0.0
    if method == "euler" and kind not in ("IF", "I", "Threshold"):
        taus = [arrays[f] for f in ("tau", "tau_mem", "tau_syn") if f in arrays]
        if any(bool(np.any(t < dt)) for t in taus):
            warnings.warn(f"NIR node `{where}` ({kind}): a time constant is shorter than dt={dt:g}; forward Euler "
                          "overshoots there (method='exact' does not)", stacklevel=3)
    text = neuron_text(kind, scalars, dt, method, surrogate=surrogate, learnable=learnable & set(p.params),
                       shapes={f: a.shape for f, a in channels.items()})
    return loads(text, backend=backend, detach_reset=detach_reset,
                 **{f: torch.from_numpy(a) for f, a in channels.items()})


class _Scale(nn.Module):
    def __init__(self, scale: np.ndarray) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.from_numpy(_np(scale, np.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def _layer_module(node: Any, where: str) -> tuple[nn.Module, str]:
    """A NIR layer as a torch module and how it is applied: "vector" (on the last dimension or
    elementwise), "spatial" (on [N, C, ...]), "flatten"."""
    try:
        return _make_layer(node, where)
    except (RuntimeError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise FlexDSLError(f"NIR node `{where}` ({type(node).__name__}) is malformed: {e}", "<nir graph>") from None


def _make_layer(node: Any, where: str) -> tuple[nn.Module, str]:
    nir = _nir()
    kind = type(node).__name__

    def tensor(a: Any) -> torch.Tensor:
        return torch.from_numpy(_np(a, np.float32))

    if isinstance(node, nir.Affine | nir.Linear):
        w = tensor(node.weight)
        if w.dim() != 2:
            raise FlexDSLError(f"NIR node `{where}` ({kind}): weights of shape {tuple(w.shape)} are not a matrix",
                               "<nir graph>")
        has_bias = isinstance(node, nir.Affine)
        lin = nn.Linear(w.shape[1], w.shape[0], bias=has_bias)
        with torch.no_grad():
            lin.weight.copy_(w)
            if has_bias:
                lin.bias.copy_(tensor(node.bias).reshape(-1))
        return lin, "vector"
    if isinstance(node, nir.Scale):
        return _Scale(node.scale), "vector"
    if isinstance(node, nir.Conv1d | nir.Conv2d):
        w = tensor(node.weight)
        two = isinstance(node, nir.Conv2d)
        cls = nn.Conv2d if two else nn.Conv1d

        def arg(v):
            if isinstance(v, str):
                return v
            a = np.asarray(v).astype(int).reshape(-1)
            return tuple(int(t) for t in a) if two and a.size == 2 else int(a[0])

        conv = cls(w.shape[1] * int(node.groups), w.shape[0], tuple(w.shape[2:]), stride=arg(node.stride),
                   padding=arg(node.padding), dilation=arg(node.dilation), groups=int(node.groups), bias=True)
        with torch.no_grad():
            conv.weight.copy_(w)
            conv.bias.copy_(tensor(node.bias).reshape(-1))
        return conv, "spatial"
    if isinstance(node, nir.AvgPool2d | nir.SumPool2d):
        def pair(v):
            a = np.asarray(v).astype(int).reshape(-1)
            return (int(a[0]), int(a[-1]))

        pool = nn.AvgPool2d(pair(node.kernel_size), pair(node.stride), pair(node.padding),
                            divisor_override=1 if isinstance(node, nir.SumPool2d) else None)
        return pool, "spatial"
    if isinstance(node, nir.Flatten):
        return nn.Flatten(int(node.start_dim), int(node.end_dim)), "flatten"
    raise FlexDSLError(f"NIR node `{where}` is a {kind}, which flexdsl cannot run", "<nir graph>",
                       hint="supported: " + ", ".join([*PRIMITIVES, "Affine", "Linear", "Scale", "Conv1d", "Conv2d",
                                                       "Flatten", "AvgPool2d", "SumPool2d"]))


def load(graph_or_path: Any, dt: float | None = None, *, method: str = "auto", learnable: Iterable[str] = (),
         surrogate: str | None = None, backend: str = "auto", detach_reset: bool = False,
         step_mode: str = "m") -> NIRNetwork:
    """A `torch.nn.Module` (NIRNetwork) running a NIR graph (a `nir.NIRGraph`, a node, or a file
    path) with flexdsl neurons.

    `dt` is the length of one step in the graph's time unit (default: the dt that
    `flexdsl.nir.export` recorded in the graph). `method`: how NIR's ODEs are discretised,
    "euler", "exact" or "auto" (what export recorded for a node, else euler). `learnable`:
    NIR param names (e.g. "tau", "v_threshold") that become trainable per-neuron Parameters.
    `surrogate`: the spikes' surrogate, e.g. "atan(alpha=2.0)" (default: what export recorded,
    else sigmoid(alpha=4.0)). Inputs are `[T, batch, *shape]` (step_mode "m") or
    `[batch, *shape]` ("s", one step per call, states kept until `reset()`).
    """
    nir = _nir()
    graph, source = _read(graph_or_path)
    meta = graph.metadata if isinstance(graph.metadata, dict) else {}
    if dt is None:
        if "flexdsl_dt" not in meta:
            raise FlexDSLError("dt is needed: NIR is continuous time and this graph does not record a step",
                               source, hint="pass dt=..., the length of one step in the graph's time unit "
                               "(snnTorch exports with dt=1e-4, Norse with dt=1e-3)")
        dt = meta["flexdsl_dt"]
    dt = _check_dt(np.asarray(dt).reshape(-1)[0] if not isinstance(dt, int | float) else dt)
    if method not in ("auto", *METHODS):
        raise FlexDSLError(f"method must be 'auto', 'euler' or 'exact', not {method!r}", "<flexdsl.nir>",
                           hint=did_you_mean(str(method), ["auto", *METHODS]))
    if step_mode not in ("s", "m"):
        raise FlexDSLError(f"step_mode must be 's' or 'm', not {step_mode!r}", "<flexdsl.nir>")
    learn = {str(n) for n in ([learnable] if isinstance(learnable, str) else learnable)}
    known = sorted({f for p in PRIMITIVES.values() for f in p.params})
    for n in learn:
        if n not in known:
            raise FlexDSLError(f"`{n}` is not a param of a NIR neuron", "<flexdsl.nir>",
                               hint=did_you_mean(n, known) or "NIR neuron params: " + ", ".join(known))
    if surrogate is not None and _surrogate(surrogate) is None:
        raise FlexDSLError(f"surrogate {surrogate!r} is not a built-in surrogate with numeric keywords", "<flexdsl.nir>",
                           hint="e.g. 'atan(alpha=2.0)'; built-in: " + ", ".join(SURROGATES))
    flat = _flatten(graph)
    if len(flat.inputs) != 1:
        raise FlexDSLError(f"the graph has {len(flat.inputs)} Input nodes; flexdsl runs graphs with one", source)
    if not flat.outputs:
        raise FlexDSLError("the graph has no Output node", source)
    modules: dict[str, nn.Module] = {}
    kinds: dict[str, str] = {}
    types: dict[str, str] = {}
    for name, node in flat.nodes.items():
        types[name] = "subgraph Input/Output" if isinstance(node, str) else type(node).__name__
        if node == "pass" or isinstance(node, nir.Input | nir.Output):
            kinds[name] = "pass"
            continue
        kind = type(node).__name__
        if kind in PRIMITIVES:
            md = node.metadata if isinstance(node.metadata, dict) else {}
            meth = method if method != "auto" else (md.get("flexdsl_method") if md.get("flexdsl_method") in METHODS
                                                    else "euler")
            sur = surrogate or _surrogate(md.get("flexdsl_surrogate")) or DEFAULT_SURROGATE
            modules[name] = _neuron_module(kind, node, name, dt, meth, learn, _surrogate(sur) or DEFAULT_SURROGATE,
                                           backend, detach_reset)
            kinds[name] = "neuron"
        else:
            modules[name], kinds[name] = _layer_module(node, name)
    return NIRNetwork(modules, kinds, flat.edges, flat.inputs[0], flat.outputs, dt, step_mode, types)


_ATTRIBUTES = frozenset(dir(nn.ModuleDict()))  # names a ModuleDict key cannot take ("forward", "_modules", ...)


def _key(name: str, taken: set[str]) -> str:
    """A ModuleDict key for a node name (no dots, not empty, no attribute's name, unique)."""
    base = re.sub(r"[^0-9A-Za-z_]", "_", name) or "node"
    if base in _ATTRIBUTES:
        base = "node_" + base
    key, k = base, 1
    while key in taken:
        key = f"{base}_{k}"
        k += 1
    taken.add(key)
    return key


class NIRNetwork(nn.Module):
    """A NIR graph run with flexdsl neurons. `net(x)`: x is `[T, batch, *shape]` (step_mode "m")
    or `[batch, *shape]` ("s"); returns the output node's value (a tuple for several outputs).

    A graph without cycles runs layer by layer over the whole sequence (the neurons' multi-step
    kernels); a graph with cycles runs step by step, each recurrent edge carrying its source's
    value of the previous step (before the first: its value for zero input with silent neurons).
    Nodes are `net.nodes[key]` (`net.names` maps the NIR node names to keys); `net.neuron_texts`
    holds each neuron's generated `.neuron` text.
    """

    def __init__(self, modules: Mapping[str, nn.Module], kinds: Mapping[str, str], edges: Sequence[tuple[str, str]],
                 entry: str, exits: Sequence[str], dt: float, step_mode: str = "m",
                 types: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._node_kinds = dict(types or kinds)
        taken: set[str] = set()
        self.names = {n: _key(n, taken) for n in kinds}
        self.nodes = nn.ModuleDict({self.names[n]: m for n, m in modules.items()})
        self.kinds = {self.names[n]: k for n, k in kinds.items()}
        self.dt = dt
        self.step_mode = step_mode
        e = [(self.names[a], self.names[b]) for a, b in edges]
        self.entry = self.names[entry]
        self.exits = [self.names[x] for x in exits]
        self.order, back = _order(self.entry, e)
        missing = [x for x in self.exits if x not in self.order]
        if missing:
            inv = {v: k for k, v in self.names.items()}
            raise FlexDSLError(f"the output node `{inv[missing[0]]}` is not connected to the input", "<nir graph>")
        reach = set(self.order)
        self.preds = {n: [a for a, b in e if b == n and (a, b) not in back and a in reach] for n in self.order}
        self.back_preds = {n: [a for a, b in e if b == n and (a, b) in back] for n in self.order}
        self.recurrent = bool(back)
        self._prev: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None

    @property
    def node_kinds(self) -> dict[str, str]:
        """What each node is, by NIR node name: a NIR primitive, or the torch layer it runs as."""
        return dict(self._node_kinds)

    @property
    def neuron_texts(self) -> dict[str, str]:
        """The generated `.neuron` text of each neuron node, by NIR node name."""
        return {n: self.nodes[k].compiled.text for n, k in self.names.items() if self.kinds[k] == "neuron"}

    def reset(self) -> None:
        """Every neuron back to its initial state; recurrent edges to 0."""
        for m in self.nodes.values():
            if isinstance(m, NeuronModule):
                m.reset()
        self._prev = {}

    def _run_node(self, key: str, x: torch.Tensor, lead: int) -> torch.Tensor:
        y = self._node_value(key, x, lead)
        if self._shapes is not None:  # export records each node's per-sample shapes
            self._shapes.setdefault(key, (tuple(x.shape[lead:]), tuple(y.shape[lead:])))
        return y

    def _node_value(self, key: str, x: torch.Tensor, lead: int) -> torch.Tensor:
        kind = self.kinds[key]
        if kind == "pass":
            return x
        m = self.nodes[key]
        if kind == "neuron":
            return m(x) if lead == 2 else m(x.unsqueeze(0))[0]
        if kind == "vector":
            return m(x)
        if kind == "flatten":
            end = m.end_dim + lead if m.end_dim >= 0 else m.end_dim
            return torch.flatten(x, m.start_dim + lead, end)
        front = x.shape[:lead]
        y = m(x.reshape(-1, *x.shape[lead:]))
        return y.reshape(*front, *y.shape[1:])

    def _one(self, x: torch.Tensor, lead: int, prev: Mapping[str, torch.Tensor],
             rest: bool = False) -> dict[str, torch.Tensor]:
        """Every node's value for input `x` (one step, or a whole sequence where the graph has no
        cycle); recurrent edges take `prev`. With `rest`, the neurons are silent (0) and keep
        their states: the graph's value before the first step."""
        values: dict[str, torch.Tensor] = {}
        for key in self.order:
            ins = [values[p] for p in self.preds[key] if p in values] if key != self.entry else [x]
            ins += [prev[p] for p in self.back_preds[key] if p in prev]
            if ins:
                total = reduce(operator.add, ins)
                values[key] = torch.zeros_like(total) if rest and self.kinds[key] == "neuron" else \
                    self._run_node(key, total, lead)
        return values

    def _step(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.recurrent and not self._prev:  # before the first step: zero input, silent neurons
            self._prev = self._carried(self._one(torch.zeros_like(x), 1, {}, rest=True))
        values = self._one(x, 1, self._prev)
        self._prev = self._carried(values)
        return values

    def _carried(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {p: values[p] for ps in self.back_preds.values() for p in ps if p in values}

    def _outputs(self, values: Mapping[str, torch.Tensor]):
        outs = [values.get(k) for k in self.exits]
        if any(o is None for o in outs):
            raise FlexDSLError("an output node received no value", "<nir graph>")
        return outs[0] if len(outs) == 1 else tuple(outs)

    def forward(self, x: torch.Tensor):
        if self.step_mode == "s":
            return self._outputs(self._step(x))
        if x.dim() < 2:
            raise FlexDSLError(f"inputs must be [T, batch, *shape], got shape {tuple(x.shape)}", "<nir graph>")
        if not self.recurrent:
            return self._outputs(self._one(x, 2, {}))
        steps = [self._step(x[t]) for t in range(x.shape[0])]
        for k in self.exits:
            if any(k not in v for v in steps):
                raise FlexDSLError("an output node received no value", "<nir graph>")
        outs = [torch.stack([v[k] for v in steps]) for k in self.exits]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def extra_repr(self) -> str:
        return f"dt={self.dt:g}, step_mode={self.step_mode!r}" + (", recurrent" if self.recurrent else "")


def _order(entry: str, edges: Sequence[tuple[str, str]]) -> tuple[list[str], set[tuple[str, str]]]:
    """Nodes reachable from `entry` in an order where every edge but the back edges (those
    closing a cycle, found by depth-first search) goes forward; and the back edges."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    state: dict[str, int] = {entry: 1}
    back: set[tuple[str, str]] = set()
    post: list[str] = []
    stack = [(entry, iter(succ[entry]))]
    while stack:
        node, it = stack[-1]
        for nxt in it:
            s = state.get(nxt)
            if s == 1:
                back.add((node, nxt))
            elif s is None:
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))
                break
        else:
            state[node] = 2
            post.append(node)
            stack.pop()
    return post[::-1], back


__all__ = ["export", "load", "match", "analyse", "classify", "neuron_text", "NIRNetwork", "PRIMITIVES", "Primitive"]
