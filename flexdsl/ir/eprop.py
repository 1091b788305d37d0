"""e-prop's eligibility, derived from the step (Bellec et al., Nat. Commun. 11:3625, 2020).

A recurrent layer's neuron `i` steps as `(out_t, h_t) = step(h_{t-1}, I_t)`, its port receiving
`I_t = sum_p W_ip pre_p(t)` (the layer's input, the fed-back source of the step before, 1 for the
bias). e-prop keeps, per synapse, the derivative of the neuron's own state along its own history
(the eligibility vector, one entry per state) and cuts every path through other neurons:

    eps_t  = J_t eps_{t-1} + b_t pre_p(t)          J = dh_t/dh_{t-1},  b = dh_t/dI_t
    e_t    = c_t . eps_{t-1} + g_t pre_p(t)        c = d out_t/dh_{t-1},  g = d out_t/dI_t
    dE/dW_ip = sum_t L_i(t) e_t                    L = dE/d out_t, the learning signal

(`e_t` is Bellec's eligibility trace; a learnable param theta has the same recursion with
`dh_t/dtheta` and `d out_t/dtheta` in place of `b pre` and `g pre`). Everything here is one
forward-mode pass of sympy over the step's SSA assignments: the spike's derivative is the
model's surrogate, a detached value has none. `EProp.constant`: `J` and `b` depend on params only,
so the eligibility vector of a synapse is the same for every postsynaptic neuron (a trace per
presynaptic neuron, Bellec's `x-bar`); otherwise it is kept per synapse.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .functions import Rand, Randn, SurrogateGrad
from .lower import NameGen, StepModel, share_subexpressions


@dataclass
class EProp:
    """The derived factors of one step, in terms of the step's SSA symbols (`assignments`: the
    step's own, then the derivatives, shared by `sympy.cse`). `J[k][l]`: d next_state_k / d state_l;
    `b[k]`: d next_state_k / d port; `c[o][l]`, `g[o]`: the same of output o; `dF[p][k]`, `dG[o][p]`:
    of the learnable params (in `step.learnable` order)."""

    step: StepModel
    port: int
    assignments: list[tuple[sp.Symbol, sp.Expr]]
    J: list[list[sp.Expr]]
    b: list[sp.Expr]
    c: list[list[sp.Expr]]
    g: list[sp.Expr]
    dF: list[list[sp.Expr]]
    dG: list[list[sp.Expr]]
    constant: bool

    def factors(self) -> list[tuple[str, sp.Expr]]:
        """(name, expression) of every factor, in the order the generated step returns them."""
        st = [s.name for s in self.step.states]
        outs = [n for n, _ in self.step.outputs]
        learn = [p.name for p in self.step.learnable]
        f = [(f"J[{st[k]},{st[l]}]", self.J[k][l]) for k in range(len(st)) for l in range(len(st))]
        f += [(f"b[{st[k]}]", self.b[k]) for k in range(len(st))]
        f += [(f"c[{outs[o]},{st[l]}]", self.c[o][l]) for o in range(len(outs)) for l in range(len(st))]
        f += [(f"g[{outs[o]}]", self.g[o]) for o in range(len(outs))]
        f += [(f"dF[{learn[p]},{st[k]}]", self.dF[p][k]) for p in range(len(learn)) for k in range(len(st))]
        f += [(f"dG[{outs[o]},{learn[p]}]", self.dG[o][p]) for o in range(len(outs)) for p in range(len(learn))]
        return f


def derive_eprop(step: StepModel, port: int) -> EProp:
    """The e-prop factors of `step` for its input `port` (an index into `step.inputs`)."""
    names = NameGen(step.taken)
    sur = step.surrogate
    x = step.inputs[port]
    leaves = [*step.states, x, *(p.symbol for p in step.learnable)]
    tangent: dict[sp.Symbol, dict[sp.Symbol, sp.Expr]] = {leaf: {leaf: sp.Integer(1)} for leaf in leaves}
    depends: dict[sp.Symbol, set[sp.Symbol]] = {}  # SSA symbol -> the states and inputs its value reads
    free = {*step.states, *step.inputs}
    out: list[tuple[sp.Symbol, sp.Expr]] = []

    def local(expr: sp.Expr, a: sp.Symbol) -> sp.Expr:
        d = expr.diff(a)
        if sur is not None and d.has(SurrogateGrad):
            d = d.replace(SurrogateGrad, lambda u: sur.derivative.xreplace({sur.u: u}))
        return d

    for y, f in step.assignments:
        depends[y] = set().union(*(depends.get(a, {a} & free) for a in f.free_symbols)) if f.free_symbols else set()
        out.append((y, f))
        acc: dict[sp.Symbol, sp.Expr] = {}
        for a in sorted(f.free_symbols & tangent.keys(), key=lambda z: z.name):
            d = local(f, a)
            if d == 0:
                continue
            for leaf, t in tangent[a].items():
                acc[leaf] = acc.get(leaf, sp.Integer(0)) + d * t
        named: dict[sp.Symbol, sp.Expr] = {}
        for leaf, e in acc.items():
            if e == 0:
                continue
            if e.is_Symbol or e.is_number:
                named[leaf] = e
            else:
                t = names.new(f"_d_{y.name}__{leaf.name}")  # (the docs print it as dy/dleaf)
                out.append((t, e))
                named[leaf] = t
        if named:
            tangent[y] = named

    def d(value: sp.Expr, leaf: sp.Symbol) -> sp.Expr:
        if isinstance(value, sp.Symbol):
            return tangent.get(value, {}).get(leaf, sp.Integer(0))
        return sp.Add(*(local(value, a) * tangent[a].get(leaf, 0) for a in value.free_symbols & tangent.keys()))

    learn = [p.symbol for p in step.learnable]
    nxt, outs = step.next_states, [v for _, v in step.outputs]
    J = [[d(v, s) for s in step.states] for v in nxt]
    b = [d(v, x) for v in nxt]
    c = [[d(v, s) for s in step.states] for v in outs]
    g = [d(v, x) for v in outs]
    dF = [[d(v, p) for v in nxt] for p in learn]
    dG = [[d(v, p) for p in learn] for v in outs]
    out = share_subexpressions(out, names)

    def reads(e: sp.Expr) -> set[sp.Symbol]:
        return set().union(*(depends.get(a, {a} & free) for a in e.free_symbols)) if e.free_symbols else set()

    defs = dict(out)

    def reads_closure(e: sp.Expr) -> set[sp.Symbol]:
        seen: set[sp.Symbol] = set()
        todo = list(e.free_symbols)
        found: set[sp.Symbol] = set()
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            if s in free:
                found.add(s)
            elif s in defs:
                todo.extend(defs[s].free_symbols)
        return found | reads(e)

    constant = all(not reads_closure(e) for row in J for e in row) and all(not reads_closure(e) for e in b)
    return EProp(step, port, out, J, b, c, g, dF, dG, constant)


def has_draws(e: EProp) -> bool:
    """Whether a factor reads a random draw (a noisy model's eligibility would need the draws again)."""
    return any(f.has(Randn, Rand) for _, f in e.assignments)


def describe(step: StepModel, name: str, filename: str) -> str:
    """The derived eligibility of the step's first input as text (`flexdsl show --eprop`)."""
    if not step.inputs:
        return f"# neuron {name} has no input: e-prop has no weights to train"
    e = derive_eprop(step, 0)
    st = [s.name for s in step.states]
    x = step.inputs[0].name
    lines = [f"# neuron {name} ({filename}): e-prop's eligibility (Bellec et al. 2020), derived from the step",
             f"# a synapse W_ip into `{x}` (I = sum_p W_ip pre_p) keeps eps = ({', '.join('eps_' + s for s in st)}),",
             "# the derivative of the neuron's states along its own history:",
             "#   eps(t) = J eps(t-1) + b pre_p(t)      e(t) = c . eps(t-1) + g pre_p(t)      "
             "dE/dW_ip = sum_t L_i(t) e(t)",
             "# (L = dE/d output, the learning signal; a learnable param has dF, dG in place of b pre, g pre)",
             "# the step and its derivatives, in order:"]
    lines += [f"{y} = {sp.sstr(v)}" for y, v in e.assignments]
    lines += [f"{n} = {sp.sstr(v)}" for n, v in e.factors() if v != 0]
    lines.append("# (factors not listed are 0)")
    lines.append("# J and b depend on params only: one trace per presynaptic neuron" if e.constant else
                 "# J or b depends on the state: the eligibility is kept per synapse")
    return "\n".join(lines)


__all__ = ["EProp", "derive_eprop", "describe", "has_draws"]
