"""The one numeric evaluator: values of expressions on Python floats or tensors, with the
catalog's numeric forms (`numeric.py`). Nothing is `eval`-ed.

- `evaluate(e, env)`, `holds(cond, env)`: an AST expression (param defaults, `where`
  constraints, state initial values), a fold over the AST. On floats, an overflow or a division
  by zero raises (the checker turns it into a located error); on tensors, IEEE semantics.
- `evaluate_tree(t, env)`: a host expression, the JSON-able form of a sympy expression that
  the IR writes for what the host computes (`ir/host.py`: derived params, param-only values;
  the docs' simulation and NIR's coefficients): a number, a name, or `[op, *args]`. Iterative,
  so no depth reaches the recursion limit.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from . import ast as A
from .catalog import ALL_FUNCTIONS, CONSTANTS, FUNCTIONS
from .numeric import is_tensor as _is_tensor
from .numeric import matrix_exp

Value = Any  # float, or a torch.Tensor for per-channel params

_BIN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "**": operator.pow}
_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
        "!=": operator.ne}


class _Evaluate(A.ExprFold[Value]):
    def __init__(self, env: Mapping[str, Value]) -> None:
        self.env = env

    def visit_Num(self, e: A.Num) -> Value:
        return e.value

    def visit_Name(self, e: A.Name) -> Value:
        if e.id in self.env:
            return self.env[e.id]
        return CONSTANTS[e.id]

    def visit_Neg(self, e: A.Neg, a: Value) -> Value:
        return -a

    def visit_BinOp(self, e: A.BinOp, a: Value, b: Value) -> Value:
        if e.op == "**" and not (_is_tensor(a) or _is_tensor(b)):
            r = math.pow(a, b)  # floats: overflow raises instead of building a huge integer
            return r
        return _BIN[e.op](a, b)

    def visit_Call(self, e: A.Call, *args: Value) -> Value:
        return FUNCTIONS[e.func].numeric(*args)

    def visit_Compare(self, e: A.Compare, *vals: Value) -> Value:
        result: Value = True
        for op, a, b in zip(e.ops, vals[:-1], vals[1:]):
            r = _CMP[op](a, b)
            result = (result & r) if _is_tensor(r) else (result and r)
        return result


def evaluate(e: A.Expr, env: Mapping[str, Value]) -> Value:
    return _Evaluate(env).fold(e)


def holds(cond: A.Compare, env: Mapping[str, Value]) -> bool:
    """Whether a `where` constraint holds; raises ArithmeticError or ValueError where it cannot
    be evaluated (every caller reports that as a located error: `reason` words it)."""
    r = evaluate(cond, env)
    if _is_tensor(r):
        return bool(r.all())
    return bool(r)


def reason(e: BaseException) -> str:
    """Why a numeric evaluation failed, in words."""
    if isinstance(e, ZeroDivisionError):
        return "a division by zero"
    if isinstance(e, OverflowError):
        return "a value too large for a float"
    if str(e) == "math domain error":
        return "a function outside its domain (e.g. the log or square root of a negative number)"
    return str(e) or type(e).__name__


# ---------------------------------------------------------------------------------- host expressions
Tree = Any  # a number (int, float, bool), a name (str), or a list [op, *args]


def _chain(f: Callable[[Value, Value], Value]) -> Callable[..., Value]:
    def g(*args: Value) -> Value:
        out = args[0]
        for a in args[1:]:
            out = f(out, a)
        return out

    return g


def _piecewise(*args: Value) -> Value:
    """(value, condition) pairs: the first whose condition holds (NaN where none does)."""
    import torch

    out = torch.as_tensor(float("nan"), dtype=torch.float64)
    for value, cond in reversed(list(zip(args[0::2], args[1::2]))):
        out = torch.where(torch.as_tensor(cond), torch.as_tensor(value, dtype=torch.float64), out)
    return out


def _extreme(which: str) -> Callable[..., Value]:
    def f(*args: Value) -> Value:
        import torch

        g = torch.maximum if which == "max" else torch.minimum
        out = torch.as_tensor(args[0], dtype=torch.float64)
        for a in args[1:]:
            out = g(out, torch.as_tensor(a, dtype=torch.float64))
        return out

    return f


_TREE_OPS: dict[str, Callable[..., Value]] = {
    "+": _chain(operator.add), "*": _chain(operator.mul), "/": operator.truediv, "**": operator.pow,
    "neg": operator.neg, "and": _chain(operator.and_), "or": _chain(operator.or_), "max": _extreme("max"),
    "min": _extreme("min"), "piecewise": _piecewise, **_CMP,
    **{f"call:{name}": f.numeric for name, f in ALL_FUNCTIONS.items()},
}


def evaluate_tree(t: Tree, env: Mapping[str, Value]) -> Value:
    """A host expression's value: names from `env`; operators on floats or tensors (give tensors
    for IEEE semantics: float64 tensors keep an overflow as inf). `["expm", rows]` is a matrix
    exponential (float64, with autograd); `["entry", name, i, j]` one of its entries."""
    if not isinstance(t, list):
        return env[t] if isinstance(t, str) else t
    results: list[Value] = []
    stack: list[tuple[Tree, bool]] = [(t, False)]
    while stack:
        node, ready = stack.pop()
        if not isinstance(node, list):
            results.append(env[node] if isinstance(node, str) else node)
            continue
        op = node[0]
        if op == "entry":
            results.append(env[node[1]][..., node[2], node[3]])
            continue
        kids = [a for row in node[1] for a in row] if op == "expm" else node[1:]
        if not ready:
            stack.append((node, True))
            stack.extend((k, False) for k in reversed(kids))
            continue
        args = results[len(results) - len(kids):]
        del results[len(results) - len(kids):]
        if op == "expm":
            n = len(node[1])
            results.append(matrix_exp([args[i * n:(i + 1) * n] for i in range(n)]))
        else:
            results.append(_TREE_OPS[op](*args))
    return results[0]


__all__ = ["evaluate", "holds", "evaluate_tree", "Tree"]
