"""Numeric evaluation of param expressions (defaults, `where` constraints, state initial
values) on floats or tensors. A small interpreter over the AST: nothing is `eval`-ed."""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Mapping
from typing import Any

from . import ast as A

Value = Any  # float, or a torch.Tensor for per-channel params


def _is_tensor(a: Any) -> bool:
    torch = sys.modules.get("torch")  # no tensor can exist unless torch was imported
    return torch is not None and isinstance(a, torch.Tensor)

_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
        "!=": operator.ne}


def _fn(name: str, *args: Value) -> Value:
    if any(_is_tensor(a) for a in args):
        import torch

        t = [a if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=torch.float64) for a in args]
        table = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs, "sin": torch.sin,
                 "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
                 "min": torch.minimum, "max": torch.maximum, "heaviside": lambda u: (u >= 0).to(u.dtype),
                 "clip": torch.clamp, "where": torch.where}
        return table[name](*t)
    table_f = {"exp": math.exp, "log": math.log, "sqrt": math.sqrt, "abs": abs, "sin": math.sin, "cos": math.cos,
               "tanh": math.tanh, "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)), "relu": lambda x: max(x, 0.0),
               "min": min, "max": max, "heaviside": lambda u: 1.0 if u >= 0 else 0.0,
               "clip": lambda x, lo, hi: min(max(x, lo), hi), "where": lambda c, a, b: a if c else b}
    return table_f[name](*args)


def evaluate(e: A.Expr, env: Mapping[str, Value]) -> Value:
    if isinstance(e, A.Num):
        return e.value
    if isinstance(e, A.Name):
        return math.pi if e.id == "pi" and "pi" not in env else env[e.id]
    if isinstance(e, A.Neg):
        return -evaluate(e.operand, env)
    if isinstance(e, A.BinOp):
        a, b = evaluate(e.left, env), evaluate(e.right, env)
        return {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
                "**": operator.pow}[e.op](a, b)
    if isinstance(e, A.Call):
        return _fn(e.func, *(evaluate(a, env) for a in e.args))
    if isinstance(e, A.Compare):
        vals = [evaluate(o, env) for o in e.operands]
        result: Value = True
        for op, a, b in zip(e.ops, vals[:-1], vals[1:]):
            r = _CMP[op](a, b)
            result = (result & r) if _is_tensor(r) else (result and r)
        return result
    raise TypeError(e)


def holds(cond: A.Compare, env: Mapping[str, Value]) -> bool:
    r = evaluate(cond, env)
    if _is_tensor(r):
        return bool(r.all())
    return bool(r)
