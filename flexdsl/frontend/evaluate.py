"""Numeric evaluation of param expressions (defaults, `where` constraints, state initial
values) on floats or tensors: a fold over the AST with the catalog's numeric forms.
Nothing is `eval`-ed."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

from . import ast as A
from .catalog import CONSTANTS, FUNCTIONS
from .numeric import is_tensor as _is_tensor

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
    r = evaluate(cond, env)
    if _is_tensor(r):
        return bool(r.all())
    return bool(r)
