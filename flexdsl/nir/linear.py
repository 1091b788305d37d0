"""A model's step as a linear map between spikes (`analyse`) and the NIR primitive whose structure
it has (`classify`): the step is inlined into one map from the previous states and the input to
the next states; every statement must be linear in the states and the input (the first that is
not is the located error), the spike a threshold on one state, the reset a constant."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy as sp

from ..errors import FlexDSLError
from ..frontend import ast as A
from ..frontend.catalog import FUNCTIONS
from ..runtime.compiler import Compiled


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
    """Whether a coefficient is 0: by expansion, else by its value at a few points of its (positive:
    params, dt) symbols, else by `simplify` (the closed forms of `exact` steps, with their `where`s,
    send simplify into a recursion without end)."""
    e = sp.expand(e)
    if e == 0:
        return True
    numeric = _numerically_zero(e)
    if numeric is not None:
        return numeric
    try:
        return sp.simplify(e) == 0
    except RecursionError:
        return False


def _numerically_zero(e: sp.Expr) -> bool | None:
    """0 at three points (symbols in (0.5, 2.5), fixed): all within 1e-10 of the terms' size; None
    where a value cannot be had (a symbol of no number, a division by 0 there)."""
    syms = sorted(e.free_symbols, key=lambda q: q.name)
    terms = sp.Add.make_args(e)
    for k in range(3):
        at = {q: sp.Float(0.5 + ((7 * j + 3 * k + 1) % 11) / 5.5) for j, q in enumerate(syms)}
        try:
            v = complex(e.xreplace(at).evalf(30))
            size = sum(abs(complex(t.xreplace(at).evalf(30))) for t in terms)
        except (TypeError, ValueError, ZeroDivisionError, RecursionError):
            return None
        if not (size == size and abs(v) == abs(v)) or size == float("inf"):
            return None
        if abs(v) > 1e-10 * max(size, 1e-300):
            return False
    return True


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
    ck = c.checked
    states = [s.name for s in ck.states]
    x = ck.inputs[0].name
    pos = _statements_linear(c)
    nxt, rst, u_full = _step_map(c, pos)
    fire_on, k, m, op = None, sp.Integer(0), sp.Integer(0), None
    if ck.spike is not None:
        assert u_full is not None
        op = ck.spike.op
        fire_on, k, m = _threshold(c, nxt, u_full)
    return LinearStep(c, x, states, nxt, rst, fire_on, k, m, op, ck.outputs[0][0], pos)


def _err(c: Compiled, msg: str, pos: A.Pos, hint: str | None = None) -> FlexDSLError:
    ck = c.checked
    return FlexDSLError(msg, ck.filename, pos.line, pos.column, ck.source, hint)


def _statements_linear(c: Compiled) -> dict[str, A.Pos]:
    """Every statement linear in the states, the input, and the locals that depend on them (in
    source order, the first that is not is the located error); one input, one output, at most
    two states. The positions of the statements that errors name (see `LinearStep.pos`)."""
    from ..ir.lower import sym, to_sympy

    ck = c.checked
    states = [s.name for s in ck.states]
    pos: dict[str, A.Pos] = {}
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
            raise _err(c, f"{what} {why}: no NIR primitive has this form", at, _LINEAR_HINT)

    if ck.refractory is not None or (ck.spike is not None and ck.spike.op == "crosses"):
        at = ck.refractory.pos if ck.refractory is not None else ck.spike.pos  # type: ignore[union-attr]
        raise _err(c, "NIR's neurons have no refractoriness and no crossing rule", at, _LINEAR_HINT)
    for item in ck.ast.items:  # in source order, with the checked (in a model with units: converted) values
        if isinstance(item, A.Equations) and ck.equations is not None:
            for ln in ck.equations.lines:
                if isinstance(ln, A.ODE):
                    pos.setdefault(ln.state, ln.pos)
                    linear(ln.value, f"d{ln.state}/dt", ln.pos)
                else:
                    linear(ln.value, f"`{ln.name}`", ln.pos)
        elif isinstance(item, A.Update):
            for st in ck.update:
                if st.target in states:
                    pos.setdefault(st.target, st.pos)
                what = f"the update of `{st.target}`" if st.target in states else f"`{st.target}`"
                if st.op in ("*=", "/=") and any(to_sympy(st.value, env).has(v) for v in variables):
                    raise _err(c, f"{what} {'multiplies' if st.op == '*=' else 'divides'} it by a state or the "
                                  "input: no NIR primitive has this form", st.pos, _LINEAR_HINT)
                linear(st.value, what, st.pos)
        elif isinstance(item, A.SpikeRule) and ck.spike is not None:
            pos["spike"] = ck.spike.pos
            linear(A.BinOp("-", ck.spike.left, ck.spike.right, ck.spike.pos), "the spike condition", ck.spike.pos)
        elif isinstance(item, A.OnSpike):
            for st in ck.on_spike:
                pos.setdefault(f"reset:{st.target}", st.pos)
    pos["output"] = ck.outputs[0][1]
    for s in ck.states:
        pos.setdefault(s.name, s.pos)
    _check_shape(c)
    return pos


def _check_shape(c: Compiled) -> None:
    ck = c.checked
    if len(ck.inputs) != 1:
        raise _err(c, f"a NIR node has one input; `{ck.name}` declares {len(ck.inputs)}", ck.inputs[1].pos,
                   "NIR sums every edge into a node into its one input")
    if len(ck.outputs) != 1:
        raise _err(c, f"a NIR node has one output; `{ck.name}` outputs {len(ck.outputs)}", ck.outputs[1][1],
                   "output `spike` for a spiking neuron, the membrane potential for a non-spiking one")
    if len(ck.states) > 2:
        raise _err(c, f"`{ck.name}` has {len(ck.states)} states; NIR's neurons have at most two (CubaLIF: a "
                      "synaptic current and a membrane potential)", ck.states[2].pos)


def _step_map(c: Compiled, pos: dict[str, A.Pos]) -> tuple[dict[str, Affine], dict[str, Affine], sp.Expr | None]:
    """The whole step as one map of the previous states and the input: between spikes, at a
    spike, and the spike's `u` in the same terms."""
    from ..ir.functions import Detach
    from ..ir.lower import sym

    step = c.step
    states = [s.name for s in c.checked.states]
    subs: dict[sp.Symbol, sp.Expr] = {}
    u_full: sp.Expr | None = None
    for y, e in step.assignments:
        e = e.xreplace(subs)
        if step.spike is not None and y == step.spike:
            u_full = e.args[0]
            continue
        subs[y] = e.replace(Detach, lambda a: a)
    s = step.spike
    prev = [sym(n) for n in [*states, c.checked.inputs[0].name]]
    nxt: dict[str, Affine] = {}
    rst: dict[str, Affine] = {}
    for name, e in zip(states, step.next_states):
        e = e.xreplace(subs)
        f0 = _affine(e.xreplace({s: 0}) if s is not None else e, prev)
        f1 = _affine(e.xreplace({s: 1}), prev) if s is not None else f0
        if f0 is None:
            raise _err(c, f"the step of `{name}` is not linear in the states and the input: no NIR primitive has "
                          "this form", pos[name], _LINEAR_HINT)
        if f1 is None:
            raise _err(c, f"the reset of `{name}` is not linear", pos.get(f"reset:{name}", pos["spike"]))
        nxt[name], rst[name] = f0, f1
    return nxt, rst, u_full


def _threshold(c: Compiled, nxt: dict[str, Affine], u_full: sp.Expr) -> tuple[str, sp.Expr, sp.Expr]:
    """The spike as a threshold on one state (on the input, without states): (the state, k, m)
    with the spike firing on `k * state + m` compared with 0."""
    from ..ir.lower import sym

    ck = c.checked
    states = [s.name for s in ck.states]
    x = ck.inputs[0].name
    prev = [sym(n) for n in [*states, x]]
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
            return name, ratio, sp.expand(u.const - ratio * row.const)
    assert ck.spike is not None
    raise _err(c, "the spike condition is not a threshold on one state: NIR's neurons fire when the "
                  "membrane potential crosses v_threshold", ck.spike.pos, "write `spike when v >= v_threshold`")


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
