"""The host's part of a step, backend-neutral: what is computed once per call from the params
before any backend runs, written as data so that every backend gets the same values and none
emits code for them.

- the derived params: entries of param-only matrix exponentials (`exact` on coupled linear
  states), passed to every program after the declared params, with autograd to the learnable
  params (a float per param when every param is a float);
- the param-only values of the step and its param-only denominators, which the runtime checks
  finite (and nonzero) whenever params change.

`host_program(step, hoisted)` writes them (sympy, once per model) as a `HostProgram` of host
expressions (`frontend.evaluate.Tree`), which the store keeps as JSON: a process that loads a
model from the disk cache evaluates it without sympy. `run(program, params)` evaluates it with
the one numeric evaluator; `evaluate_expr(expr, env)` does the same for any sympy expression of a
step (the docs' simulation, NIR's coefficients). Importing this module imports neither sympy nor
torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..frontend.catalog import ALL_FUNCTIONS
from ..frontend.evaluate import Tree, evaluate_tree

if TYPE_CHECKING:
    from .lower import StepModel
    from .schedule import Hoisted

FORMAT = 2


@dataclass
class HostProgram:
    """Named host expressions in order (each may use the declared params and the names before
    it): the matrix exponentials and their entries, then the param-only values. `derived`: the
    derived params' names, in the order programs take them; `checks`: (label, name) of the values
    the runtime checks finite; a label `statement|denominator i` must also be nonzero."""

    params: list[str]
    derived: list[str] = field(default_factory=list)
    assignments: list[tuple[str, Tree]] = field(default_factory=list)
    checks: list[tuple[str, str]] = field(default_factory=list)
    # (state or output name, value, the SSA name of the statement that sets it) of each next state
    # and output that is a constant: it must fit the dtype it is stored in (checked before a call)
    constant_results: list[tuple[str, float, str]] = field(default_factory=list)
    # (statement, its largest and its smallest nonzero constant) of the per-step statements with a
    # constant beyond float16's range: each must hold in the precision a call computes in (1e308
    # is inf in float32, so 0 * 1e308 is NaN; 1e-308 is 0, so `v >= 1e-308` fires at v = 0)
    constants: list[tuple[str, float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HostProgram:
        if d.get("format") != FORMAT:
            raise ValueError("a host program of another format")
        return cls(list(d["params"]), list(d["derived"]), [(str(n), t) for n, t in d["assignments"]],
                   [(str(a), str(b)) for a, b in d["checks"]],
                   [(str(a), float(b), str(c)) for a, b, c in d["constant_results"]],
                   [(str(a), float(b), float(c)) for a, b, c in d["constants"]])


# ---------------------------------------------------------------------------------- sympy -> trees
def tree(expr: Any) -> Tree:
    """A sympy expression of a step as a host expression (iterative; products with negative
    powers are divisions, `x**(1/2)` is `sqrt(x)`, as the code printers write them)."""
    memo: dict[Any, Tree] = {}
    stack: list[tuple[Any, bool]] = [(expr, False)]
    while stack:
        node, ready = stack.pop()
        if node in memo:
            continue
        leaf = _leaf(node)
        if leaf is not None:
            memo[node] = leaf[0]
            continue
        kids = _parts(node)
        if not ready:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if k not in memo)
            continue
        memo[node] = _node(node, [memo[k] for k in kids])
    return memo[expr]


def _leaf(node: Any) -> tuple[Tree] | None:
    import sympy as sp

    if isinstance(node, sp.Symbol):
        return (node.name,)
    if node is sp.true or node is sp.false:
        return (bool(node),)
    if isinstance(node, sp.Integer) and abs(int(node)) <= 2**53:  # (beyond: a float64, as `constants.py` says)
        return (int(node),)
    if node.is_Number or isinstance(node, sp.NumberSymbol) or (isinstance(node, sp.Expr) and node.is_number
                                                              and not node.free_symbols and not node.is_Atom):
        try:
            return (float(node),)
        except TypeError:
            return None
    return None


def _split_mul(node: Any) -> tuple[list[Any], list[Any]]:
    """A product's factors above and below the line (negative integer powers go below)."""
    import sympy as sp

    num, den = [], []
    for f in node.args:
        if isinstance(f, sp.Pow) and f.exp.is_Integer and f.exp < 0:
            den.append(f.base if f.exp == -1 else sp.Pow(f.base, -f.exp, evaluate=False))
        else:
            num.append(f)
    return num, den


def _parts(node: Any) -> list[Any]:
    """The sub-expressions a node's tree is made of, in order."""
    import sympy as sp

    if isinstance(node, sp.Mul):
        num, den = _split_mul(node)
        return num + den
    if isinstance(node, sp.Pow):
        if node.exp in (sp.Rational(1, 2), -sp.Rational(1, 2)) or (node.exp.is_Integer and node.exp < 0):
            return [node.base]
        return list(node.args)
    if isinstance(node, sp.Piecewise):
        return [a for pair in node.args for a in pair]
    return list(node.args)


def _node(node: Any, args: list[Tree]) -> Tree:
    import sympy as sp

    if isinstance(node, sp.Add):
        return ["+", *args]
    if isinstance(node, sp.Mul):
        num, den = _split_mul(node)
        top = args[: len(num)]
        bottom = args[len(num):]
        upper = top[0] if len(top) == 1 else ["*", *top] if top else 1
        if not bottom:
            return upper
        return ["/", upper, bottom[0] if len(bottom) == 1 else ["*", *bottom]]
    if isinstance(node, sp.Pow):
        e = node.exp
        if e == sp.Rational(1, 2):
            return ["call:sqrt", args[0]]
        if e == -sp.Rational(1, 2):
            return ["/", 1, ["call:sqrt", args[0]]]
        if e.is_Integer and e < 0:
            return ["/", 1, args[0] if e == -1 else ["**", args[0], int(-e)]]
        return ["**", *args]
    if isinstance(node, sp.Piecewise):
        return ["piecewise", *args]
    for cls, op in _OPS(sp):
        if isinstance(node, cls):
            return [op, *args]
    name = _FUNCTION_NAMES.get(type(node).__name__)
    if name is None:
        raise TypeError(f"cannot evaluate {type(node).__name__} on the host")
    return [f"call:{name}", *args]


def _OPS(sp: Any) -> list[tuple[type, str]]:
    return [(sp.StrictGreaterThan, ">"), (sp.GreaterThan, ">="), (sp.StrictLessThan, "<"), (sp.LessThan, "<="),
            (sp.Equality, "=="), (sp.Unequality, "!="), (sp.And, "and"), (sp.Or, "or"), (sp.Max, "max"),
            (sp.Min, "min")]


# the catalog name of each function's sympy form (`Function.sympy` is the sympy class's name)
_FUNCTION_NAMES: dict[str, str] = {f.sympy: name for name, f in ALL_FUNCTIONS.items()}


def evaluate_expr(expr: Any, env: Mapping[Any, Any]) -> Any:
    """A sympy expression of a step evaluated on the host: `env` maps symbols (or names) to
    floats or tensors; floats are taken as float64 tensors (IEEE semantics: an overflow is inf,
    a division by zero inf or NaN, not an exception)."""
    import torch

    values = {getattr(k, "name", k): (v if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64))
              for k, v in env.items()}
    out = evaluate_tree(tree(expr), values)
    return out if isinstance(out, torch.Tensor) else torch.tensor(float(out), dtype=torch.float64)


# ---------------------------------------------------------------------------------- the program
def host_program(step: StepModel, hoisted: Hoisted) -> HostProgram:
    """The derived params and the checked param-only values of a step, as host expressions."""
    import sympy as sp

    prog = HostProgram([p.name for p in step.declared_params])
    for k, d in enumerate(step.matrix_exps):
        block = f"_expm{k}"
        prog.assignments.append((block, ["expm", [[tree(e) for e in d.matrix.row(i)] for i in range(d.matrix.rows)]]))
        for y, i, j in d.entries:
            prog.assignments.append((y.name, ["entry", block, i, j]))
    prog.derived = [p.name for p in step.params if p.derived]
    prog.assignments += [(y.name, tree(e)) for y, e in hoisted.invariants]
    prog.checks = [(n, n) for n in prog.derived] + [(y.name, y.name) for y in hoisted.used]
    for i, (y, d) in enumerate(hoisted.denominators):
        name = f"_den{i}"
        prog.assignments.append((name, tree(d)))
        prog.checks.append((f"{y.name}|denominator {i}", name))
    for i, (y, part) in enumerate(hoisted.parts):
        try:
            t = tree(part)
        except TypeError:  # (a function the host does not evaluate: that part is not checked)
            continue
        name = f"_part{i}"
        prog.assignments.append((name, t))
        prog.checks.append((f"{y.name}|part {i}", name))
    for label, e in [*((y.name, e) for y, e in hoisted.body),
                     *zip((s.name for s in step.states), step.next_states), *step.outputs]:
        mags = [abs(float(c)) for c in e.atoms(sp.Number) if not c.is_zero]
        if mags and (max(mags) > 65504.0 or min(mags) < 6e-8):
            prog.constants.append((label, max(mags), min(mags)))
    values = dict(step.assignments)
    for name, v in [*zip((s.name for s in step.states), step.next_states), *step.outputs]:
        origin = ""
        while v in values:
            origin, v = str(v), values[v]
        if v.is_Number:
            prog.constant_results.append((name, float(v), origin))
    return prog


def run(program: HostProgram, params: Sequence[Any], wanted: Sequence[str]) -> dict[str, Any]:
    """The values of the names in `wanted` for these declared params (floats or tensors; floats
    are evaluated as float64 tensors), evaluating only the assignments they need."""
    import torch

    env: dict[str, Any] = {name: (v if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64))
                           for name, v in zip(program.params, params)}
    need = set(wanted)
    for name, t in reversed(program.assignments):
        if name in need:
            need |= _names(t)
    for name, t in program.assignments:
        if name in need:
            env[name] = evaluate_tree(t, env)
    return {name: env[name] for name in wanted}


def _names(t: Tree) -> set[str]:
    out: set[str] = set()
    stack = [t]
    while stack:
        n = stack.pop()
        if isinstance(n, str):
            out.add(n)
        elif isinstance(n, list):
            if n[0] == "entry":
                out.add(n[1])
            elif n[0] == "expm":
                stack.extend(a for row in n[1] for a in row)
            else:
                stack.extend(n[1:])
    return out


def derived_values(program: HostProgram, params: Sequence[Any]) -> list[Any]:
    """The derived params' values for these declared params."""
    if not program.derived:
        return []
    vals = run(program, params, program.derived)
    return [vals[n] for n in program.derived]


def check_values(program: HostProgram, params: Sequence[Any]) -> dict[str, Any]:
    """label -> value of every checked param-only value (see `HostProgram.checks`)."""
    vals = run(program, params, [name for _, name in program.checks])
    return {label: vals[name] for label, name in program.checks}


__all__ = ["HostProgram", "host_program", "tree", "evaluate_expr", "run", "derived_values", "check_values"]
