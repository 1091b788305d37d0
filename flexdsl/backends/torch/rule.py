"""The torch backend's plasticity rule: the rule's step and its parts as one generated module, run
by `runtime/rule.py`:

    step(...)       one step of every state (any shapes that broadcast: per synapse where needed)
    side_pre(...)   the presynaptic states' next values (and the rule's output), per presynaptic neuron
    side_post(...)  the postsynaptic (and per-sample) states' next values
    terms_c/a/b     the factors of the weight's change, c(w) * a(post side) * b(pre side) per term
                    (`ir/rule.py`; absent where the change does not factor)

Each function takes the names `meta["args"][function]` lists (inputs, states before the step,
states after it as `_next_<name>`, params) and returns the values `meta["returns"][function]`
names. Everything a run needs is in `meta`: a process that finds the artefact in the disk cache
does not import sympy.
"""

from __future__ import annotations

from typing import Any

import sympy as sp

from ...frontend.parse import source_lines
from ...store import cache
from ...store.generated import load_module
from ..printer import comment_text, lhs_rhs_lines
from .emit import TorchPrinter, module_head


def _function(name: str, doc: str, exprs: list[tuple[str, sp.Expr]], order: list[str], pr: TorchPrinter
              ) -> tuple[list[str], list[str]]:
    """A generated function returning `exprs` (common subexpressions shared), with the free names
    it reads as arguments, in `order`."""
    used = set().union(*(e.free_symbols for _, e in exprs)) if exprs else set()
    names = {s.name for s in used}
    args = [n for n in order if n in names]
    missing = names - set(order)
    assert not missing, missing
    repl, reduced = sp.cse([e for _, e in exprs], symbols=sp.numbered_symbols("_t"), optimizations="basic")
    printed = {s.name: pr._print(s) for s in used}  # (a name the printer renames: `torch` -> `_u__torch`)
    lines = [f"def {name}({', '.join(printed[a] for a in args)}):", f"    # {doc}"]
    lines += lhs_rhs_lines(pr, repl)
    lines.append("    return (" + "".join(pr._print(e) + ", " for e in reduced) + ")")
    return [*lines, "", ""], args


def emit_rule(ir: Any) -> tuple[str, dict[str, Any]]:
    from ...ir.rule import NEXT, plan_rule  # (sympy: only when emitted)

    rule = ir.rule
    step = ir.step
    plan = plan_rule(step, rule.weight, rule.output)
    states = [s.name for s in step.states]
    inputs = [x.name for x in step.inputs]
    params = [p.name for p in step.params]
    order = [*inputs, *states, *[NEXT + s for s in states], *params]
    pr = TorchPrinter(like="pre")
    lines = [*module_head(step, "the plasticity rule's step and its parts", "rule")]
    lines[0] = lines[0].replace("of neuron", "of rule")
    args: dict[str, list[str]] = {}
    returns: dict[str, list[str]] = {}
    # -- the whole step, as written (every state; the synapse states per synapse)
    src = source_lines(step.checked.source)
    call = [pr._print(s) for s in [*step.inputs, *step.states]] + [pr._print(p.symbol) for p in step.params]
    rets = [pr._print(v) for v in step.next_states]
    out = dict(step.outputs).get(rule.output) if rule.output else None
    lines += [f"def step({', '.join(call)}):",
              f"    # one step of rule {comment_text(rule.name)}: equations, update, on pre, on post",
              *lhs_rhs_lines(pr, step.assignments, step.origins, src),
              "    return (" + "".join(r + ", " for r in rets) + (pr._print(out) + ", " if out is not None else "")
              + ")", "", ""]
    args["step"] = [*inputs, *states, *params]
    returns["step"] = [*states, *(["output"] if out is not None else [])]
    # -- the sides' states on their own
    for side, doc in (("pre", "the presynaptic states after the step"),
                      ("post", "the postsynaptic and per-sample states after the step")):
        names = plan.of_side(side) + (plan.of_side("global") if side == "post" else [])
        exprs = [(n, plan.next[n]) for n in names]
        if side == "pre" and plan.output is not None:
            exprs.append(("output", plan.output))
        body, a = _function(f"side_{side}", doc, exprs, order, pr)
        lines += body
        args[f"side_{side}"], returns[f"side_{side}"] = a, [n for n, _ in exprs]
    # -- the sides' linear traces (next = a * state + u, `a` of params only, `u` of no state): one
    #    product over the window each instead of a loop over its steps
    linear: dict[str, list[str]] = {}
    for side in ("pre", "post"):
        names = plan.of_side(side) + (plan.of_side("global") if side == "post" else [])
        lin = linear_traces(plan, names, [p.symbol for p in step.params])
        if lin is not None and names:
            exprs = [e for n in names for e in ((f"a_{n}", lin[n][0]), (f"u_{n}", lin[n][1]))]
            body, a = _function(f"linear_{side}", f"each {side} state as a * state + u", exprs, order, pr)
            lines += body
            args[f"linear_{side}"], returns[f"linear_{side}"] = a, [n for n, _ in exprs]
            linear[side] = names
    # -- the weight's change as products
    if plan.terms is not None:
        for part, k, doc in (("c", 0, "c(w) of each term of the weight's change"),
                             ("a", 1, "a(post side) of each term"), ("b", 2, "b(pre side) of each term")):
            exprs = [(f"{part}{i}", t[k]) for i, t in enumerate(plan.terms)]
            body, a = _function(f"terms_{part}", doc, exprs, order, pr)
            lines += body
            args[f"terms_{part}"], returns[f"terms_{part}"] = a, [n for n, _ in exprs]
    meta = {"inputs": inputs, "states": states, "params": params, "sides": plan.sides,
            "separable": plan.terms is not None, "terms": len(plan.terms or []), "args": args, "returns": returns,
            "output": out is not None,
            "changes_weight": plan.next[rule.weight] != step.states[states.index(rule.weight)],
            "terms_text": [[str(x) for x in t] for t in (plan.terms or [])],
            "gradientless": gradientless(step), "linear": linear,
            "used": sorted(p.name for p in step.params if any(p.symbol in e.free_symbols for _, e in step.assignments)),
            "input_reads": sorted(x.name for x in step.inputs if any(x in e.free_symbols for _, e in step.assignments)),
            "output_reads": sorted({x.name for x in plan.output.free_symbols} - {p.name for p in step.params})
            if plan.output is not None else []}
    return "\n".join(lines).rstrip() + "\n", meta


def linear_traces(plan: Any, names: list[str], params: list[sp.Symbol]
                  ) -> dict[str, tuple[sp.Expr, sp.Expr]] | None:
    """(a, u) with next = a * state + u for every state of `names` (`a` of params only, `u` free of
    every state), or None where one of them is not such a trace."""
    states = {s.symbol if hasattr(s, "symbol") else s for s in plan.step.states}
    out = {}
    for n in names:
        s = next(x for x in plan.step.states if x.name == n)
        e = sp.expand(plan.next[n])
        a = sp.diff(e, s)
        u = sp.simplify(e - a * s)
        if not a.free_symbols <= set(params) or u.free_symbols & states:
            return None
        out[n] = (a, u)
    return out


def gradientless(step: Any) -> list[str]:
    """The params whose every use has no derivative (a `where`'s condition, a comparison's side, a
    step function's argument): a gradient could not reach them."""
    out = []
    exprs = [e for _, e in step.assignments]
    for p in step.params:
        s = p.symbol
        if not any(s in e.free_symbols for e in exprs):
            continue
        if all(sp.diff(e, s) == 0 for e in exprs if s in e.free_symbols):
            out.append(p.name)
    return out


def rule_artefact(ir: Any, key: str) -> tuple[str, cache.Artefact]:
    """(cache key, the artefact) of rule `ir` (cached on disk like every artefact)."""
    k = cache.key("rule", key)

    def make() -> cache.Artefact:
        src, meta = emit_rule(ir)
        return cache.Artefact("torch-rule", src, meta)

    return k, cache.get_or_make(k, make)


def load_rule(ir: Any, key: str) -> tuple[Any, dict[str, Any]]:
    """The generated module of rule `ir` and its meta."""
    k, art = rule_artefact(ir, key)
    return load_module("rule", k, art.source), art.meta


__all__ = ["emit_rule", "load_rule", "rule_artefact"]
