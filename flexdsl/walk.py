"""Small helpers to traverse the AST (shared by the checker and the lowering)."""

from __future__ import annotations

from collections.abc import Iterator

from . import ast as A


def expr_nodes(e: A.Expr) -> Iterator[A.Expr]:
    """Every node of an expression, pre-order."""
    yield e
    if isinstance(e, A.BinOp):
        yield from expr_nodes(e.left)
        yield from expr_nodes(e.right)
    elif isinstance(e, A.Neg):
        yield from expr_nodes(e.operand)
    elif isinstance(e, A.Call):
        for a in e.args:
            yield from expr_nodes(a)
    elif isinstance(e, A.Compare):
        for a in e.operands:
            yield from expr_nodes(a)


def expr_names(e: A.Expr) -> Iterator[A.Name]:
    """Every Name used in an expression, in source order (function names excluded)."""
    return (n for n in expr_nodes(e) if isinstance(n, A.Name))


def item_exprs(it: A.Item) -> Iterator[A.Expr]:
    """The expressions of a declaration or block."""
    if isinstance(it, A.Param):
        yield it.default
        if it.where is not None:
            yield it.where
    elif isinstance(it, A.State):
        yield it.init
    elif isinstance(it, A.SurrogateDef):
        for k in it.kwargs:
            yield k.value
        yield it.body
    elif isinstance(it, A.Update | A.OnSpike):
        for s in it.statements:
            yield s.value
    elif isinstance(it, A.Equations):
        for ln in it.lines:
            yield ln.value
    elif isinstance(it, A.SpikeRule):
        yield it.left
        yield it.right
        if it.surrogate is not None:
            for k in it.surrogate.kwargs:
                yield k.value


def iter_names(neuron: A.Neuron) -> Iterator[tuple[str, A.Pos]]:
    """Every identifier written in the model: declared names, targets and uses."""
    yield neuron.name, neuron.pos
    for it in neuron.items:
        if isinstance(it, A.Input | A.Param | A.State):
            yield it.name, it.pos
        elif isinstance(it, A.SurrogateDef):
            yield it.name, it.pos
            for k in it.kwargs:
                yield k.name, k.pos
        elif isinstance(it, A.Output):
            yield from ((nm, p) for nm, p in it.names if nm != "spike")
        elif isinstance(it, A.Update | A.OnSpike):
            for s in it.statements:
                yield s.target, s.pos
        elif isinstance(it, A.Equations):
            for ln in it.lines:
                yield (ln.state if isinstance(ln, A.ODE) else ln.name), ln.pos
        for e in item_exprs(it):
            for n in expr_nodes(e):
                if isinstance(n, A.Name):
                    yield n.id, n.pos
                elif isinstance(n, A.Call) and n.func != "where":
                    yield n.func, n.pos
