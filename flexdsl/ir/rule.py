"""A plasticity rule's plan: where each of its states lives and how a window's weight change
factors into products over time and batch.

Input: the rule's `StepModel` (the rule lowered as a neuron model: `frontend/rule.py`). Output: a
`RulePlan`:

- *sides*: a state lives per presynaptic neuron (`pre`: it depends on `pre` and other such states
  only: a presynaptic trace), per postsynaptic neuron (`post`), per sample (`global`: modulators and
  params only: a reward trace) or per synapse (`synapse`: it mixes both sides, or reads the weight:
  an eligibility). The weight is a synapse state.
- *terms*: where the weight's change in one step is a sum of products
  `c(w) * a(post side) * b(pre side)` (pair STDP: `w * post * x_pre - w * x_post * pre`) and no other
  state lives per synapse, a window with the weights held (SpikingJelly's multi-step learners) sums
  to `dW = sum_k c_k(W) * (A_k^T B_k)`: two matrices of the window's samples `[T*B, n]` per term, one
  matrix product each. `terms` is None where the change does not factor so (the step runs per
  synapse instead).

Every expression is in the step's free symbols: the inputs at this step, the states before it, the
params.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .lower import StepModel

SIDES = ("pre", "post", "global", "synapse")
NEXT = "_next_"  # the terms' name of a state's value after the step (no model name starts with `_`)


@dataclass
class RulePlan:
    step: StepModel
    weight: str
    sides: dict[str, str]  # state name -> one of SIDES (the weight: "synapse")
    next: dict[str, sp.Expr]  # state name -> its value after the step
    output: sp.Expr | None  # the value the synapse carries instead of `pre` (None: `pre` itself)
    terms: list[tuple[sp.Expr, sp.Expr, sp.Expr]] | None  # (c, a, b) of the weight's change, or None
    # the terms read the side states before the step (their names) and after it (`NEXT + name`)

    def of_side(self, side: str) -> list[str]:
        return [s.name for s in self.step.states if self.sides[s.name] == side]


def expanded(step: StepModel) -> tuple[dict[str, sp.Expr], list[tuple[str, sp.Expr]]]:
    """Every next state and output with the step's temporaries substituted."""
    env: dict[sp.Symbol, sp.Expr] = {}
    for y, e in step.assignments:
        env[y] = e.xreplace(env)
    nxt = {s.name: e.xreplace(env) for s, e in zip(step.states, step.next_states)}
    outs = [(n, e.xreplace(env)) for n, e in step.outputs]
    return nxt, outs


def change(step: StepModel, weight: str, keep: list[str]) -> sp.Expr:
    """The weight's change in one step, reading the states of `keep` after the step as `NEXT + name`
    (a trace updated before the weight reads it: one value per time, not its recursion)."""
    finals = {e: sp.Symbol(NEXT + s.name, real=True) for s, e in zip(step.states, step.next_states)
              if s.name in keep and isinstance(e, sp.Symbol)}
    env: dict[sp.Symbol, sp.Expr] = {}
    for y, e in step.assignments:
        env[y] = finals.get(y, e.xreplace(env))
    i = [s.name for s in step.states].index(weight)
    return step.next_states[i].xreplace(env) - step.states[i]


def plan_rule(step: StepModel, weight: str, output: str | None) -> RulePlan:
    nxt, outs = expanded(step)
    tags: dict[str, set[str]] = {"pre": {"pre"}, "post": {"post"}, weight: {"synapse"}}
    for x in step.inputs:  # modulators: the same for every neuron of a sample; post_<x>: per postsynaptic neuron
        tags.setdefault(x.name, {"post"} if x.name.startswith("post_") else set())
    names = [s.name for s in step.states]
    for s in names:
        tags.setdefault(s, set())
    changed = True
    while changed:  # a state takes the sides of everything its next value reads (a fixpoint)
        changed = False
        for s in names:
            t = set(tags[s])
            for f in nxt[s].free_symbols:
                t |= tags.get(f.name, set())
            if t != tags[s]:
                tags[s], changed = t, True
    sides = {s: _side(tags[s]) for s in names}
    out_expr = dict(outs).get(output) if output is not None else None
    syn = [s for s in names if sides[s] == "synapse" and s != weight]
    side_states = [s for s in names if sides[s] != "synapse"]
    terms = None if syn else factor_change(change(step, weight, side_states), weight, sides, step)
    return RulePlan(step, weight, sides, nxt, out_expr, terms)


def _side(t: set[str]) -> str:
    if "synapse" in t or {"pre", "post"} <= t:
        return "synapse"
    if "pre" in t:
        return "pre"
    if "post" in t:
        return "post"
    return "global"


def factor_change(d: sp.Expr, weight: str, sides: dict[str, str], step: StepModel
                  ) -> list[tuple[sp.Expr, sp.Expr, sp.Expr]] | None:
    """`d` (the weight's change in one step) as a sum of `c(w, params) * a(post side) * b(pre side)`,
    terms with the same `a` and `b` merged; None where a factor mixes the sides."""
    side_of = {x.name: ("post" if x.name.startswith("post_") else "global") for x in step.inputs}
    side_of.update({"pre": "pre", "post": "post", weight: "weight"})
    side_of.update({s: v for s, v in sides.items() if s != weight})
    side_of.update({NEXT + s: v for s, v in sides.items() if s != weight})
    merged: dict[tuple[sp.Expr, sp.Expr], sp.Expr] = {}
    for term in sp.Add.make_args(sp.expand(d)):
        c, a, b = sp.Integer(1), sp.Integer(1), sp.Integer(1)
        for f in sp.Mul.make_args(term):
            kinds = {side_of[s.name] for s in f.free_symbols if s.name in side_of}
            if not kinds or kinds == {"weight"}:
                c *= f
            elif kinds <= {"post", "global"}:
                a *= f
            elif kinds == {"pre"}:
                b *= f
            else:
                return None
        merged[(a, b)] = merged.get((a, b), sp.Integer(0)) + c
    return [(sp.factor_terms(c), a, b) for (a, b), c in merged.items() if c != 0]


__all__ = ["NEXT", "SIDES", "RulePlan", "expanded", "factor_change", "plan_rule"]
