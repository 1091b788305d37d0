"""Stage 4: the symbolic backward (vector-Jacobian product of one step), with sympy.

Reverse mode over the SSA assignments of the StepModel: one local derivative per
(assignment, argument), adjoints accumulated as new SSA assignments, so the size grows
linearly with the step. The spike's derivative is the surrogate S'(u); Detach gives 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .functions import Detach, SurrogateGrad
from .lower import NameGen, StepModel, share_subexpressions


@dataclass
class BackwardModel:
    """Given the step's free variables and the gradients of its outputs (`grad_outputs`) and
    of its new states (`grad_next_states`), `assignments` compute `grad_inputs`,
    `grad_states` (of the previous states) and `grad_params` (learnable params only).
    The right-hand sides may use the forward SSA symbols (recompute or save them)."""

    grad_outputs: list[sp.Symbol]
    grad_next_states: list[sp.Symbol]
    assignments: list[tuple[sp.Symbol, sp.Expr]]
    grad_inputs: list[sp.Expr]
    grad_states: list[sp.Expr]
    grad_params: list[sp.Expr]

    def equations(self) -> list[sp.Eq]:
        eqs = [sp.Eq(y, e, evaluate=False) for y, e in self.assignments]
        return eqs


def derive(step: StepModel) -> BackwardModel:
    names = NameGen(step.taken)
    g_out = [names.new(f"grad_{name}") for name, _ in step.outputs]
    g_next = [names.new(f"grad_{s.name}_next") for s in step.states]
    leaves = [*step.inputs, *step.states, *(p.symbol for p in step.learnable)]
    # only symbols that depend on a differentiable leaf carry gradients (Detach cuts)
    differentiable = set(leaves)
    for y, f in step.assignments:
        if not isinstance(f, Detach) and f.free_symbols & differentiable:
            differentiable.add(y)
    contrib: dict[sp.Symbol, list[sp.Expr]] = {}

    def seed(target: sp.Expr, g: sp.Symbol) -> None:
        if isinstance(target, sp.Symbol) and target in differentiable:
            contrib.setdefault(target, []).append(g)
        elif not target.is_number:  # an expression of leaves (rare: an un-emitted output)
            for a in target.free_symbols & differentiable:
                contrib.setdefault(a, []).append(g * target.diff(a))

    for (_, value), g in zip(step.outputs, g_out):
        seed(value, g)
    for value, g in zip(step.next_states, g_next):
        seed(value, g)

    out: list[tuple[sp.Symbol, sp.Expr]] = []
    surrogate = step.surrogate

    def local_derivative(expr: sp.Expr, a: sp.Symbol) -> sp.Expr:
        d = expr.diff(a)
        if surrogate is not None and d.has(SurrogateGrad):
            d = d.replace(SurrogateGrad, lambda u: surrogate.derivative.xreplace({surrogate.u: u}))
        return d

    for y, f in reversed(step.assignments):
        terms = contrib.pop(y, None)
        if not terms:
            continue
        g = sp.Add(*terms)
        if not (isinstance(g, sp.Symbol)):
            gy = names.new(f"grad_{y.name}")
            out.append((gy, g))
            g = gy
        for a in sorted(f.free_symbols & differentiable, key=lambda z: z.name):
            d = local_derivative(f, a)
            if d != 0:
                contrib.setdefault(a, []).append(g * d)

    def result(leaf: sp.Symbol, base: str) -> sp.Expr:
        terms = contrib.get(leaf)
        if not terms:
            return sp.Integer(0)
        g = sp.Add(*terms)
        y = names.new(base)
        out.append((y, g))
        return y

    grad_inputs = [result(x, f"grad_{x.name}") for x in step.inputs]
    grad_states = [result(s, f"grad_{s.name}") for s in step.states]
    grad_params = [result(p.symbol, f"grad_{p.name}") for p in step.learnable]
    out = share_subexpressions(out, names)
    return BackwardModel(g_out, g_next, out, grad_inputs, grad_states, grad_params)


__all__ = ["derive", "BackwardModel"]
