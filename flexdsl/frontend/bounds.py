"""The bounds that learnable params train within: every `where` constraint that names a
learnable param is kept through training by a parametrization of one learnable param, its
*carrier* (the last-declared learnable param the constraint names), built from the bound:

    p > a, p >= a          p = a + softplus(raw_p)
    p < b, p <= b          p = b - softplus(raw_p)
    a < p < b (any mix)    p = a + (b - a) * sigmoid(raw_p)

`raw_p` is the unconstrained `nn.Parameter` the optimizer changes; `a` and `b` are expressions of
other params (several bounds on one side: their max, or min). The runtime computes `p` from
`raw_p` once per call (`runtime/bounds.py`), in float64, rounded to the Parameter's dtype and kept
strictly inside a strict bound. A constraint that cannot be written as such a bound of its
carrier (the carrier inside an expression, `==`, `!=`) is a located error here, at load.

`find_bounds(ck)` gives `{name: Bound}`; no torch, no sympy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import FlexDSLError
from . import ast as A

if TYPE_CHECKING:
    from .model import CheckedModel

RAW_PREFIX = "raw_"
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


@dataclass(frozen=True)
class Limit:
    """One side of a bound: `expr` (an expression of other params), strict or not, from the
    `where` of param `source`."""

    expr: A.Expr
    strict: bool
    source: str


@dataclass(frozen=True)
class Bound:
    """The bounds of learnable param `param`, trained as its Parameter `raw` (see the module
    docstring for the parametrization)."""

    param: str
    lower: tuple[Limit, ...]
    upper: tuple[Limit, ...]

    @property
    def raw(self) -> str:
        return RAW_PREFIX + self.param

    @property
    def kind(self) -> str:
        """"lower" (softplus up from a), "upper" (softplus down from b) or "interval" (sigmoid)."""
        return "interval" if self.lower and self.upper else "lower" if self.lower else "upper"

    def formula(self) -> str:
        """The parametrization as text, e.g. `tau = 1 + softplus(raw_tau)`."""
        lo, hi = _side(self.lower, "max"), _side(self.upper, "min")
        if self.kind == "lower":
            rhs = f"softplus({self.raw})" if lo == "0" else f"{_paren(lo)} + softplus({self.raw})"
        elif self.kind == "upper":
            rhs = f"-softplus({self.raw})" if hi == "0" else f"{_paren(hi)} - softplus({self.raw})"
        elif lo == "0" and hi == "1":
            rhs = f"sigmoid({self.raw})"
        else:
            width = hi if lo == "0" else f"{_paren(hi)} - {_paren(lo)}"
            rhs = f"{_paren(lo)} + ({width})*sigmoid({self.raw})"
        return f"{self.param} = {rhs}"

    def names(self) -> set[str]:
        """The params the bounds are computed from."""
        return {n.id for lim in (*self.lower, *self.upper) for n in A.names(lim.expr)}


def _side(limits: tuple[Limit, ...], agg: str) -> str:
    texts = list(dict.fromkeys(A.to_text(lim.expr) for lim in limits))
    return texts[0] if len(texts) == 1 else f"{agg}({', '.join(texts)})" if texts else ""


def _paren(text: str) -> str:
    return text if text.replace("_", "").replace(".", "").isalnum() or text.startswith(("max(", "min(")) \
        else f"({text})"


def _bare(e: A.Expr, name: str) -> A.Expr | None:
    """The factor `f` when `e` is `name` (1) or `f*name` with `f` a positive number (the factor
    to base units that the unit conversion writes); None otherwise."""
    if isinstance(e, A.Name) and e.id == name:
        return A.Num(1.0, "1", e.pos)
    if isinstance(e, A.BinOp) and e.op == "*" and isinstance(e.right, A.Name) and e.right.id == name:
        f = e.left
        nums = [n for n in A.nodes(f)]
        if all(isinstance(n, A.Num) or (isinstance(n, A.BinOp) and n.op == "/") for n in nums):
            return f
    return None


def _error(ck: CheckedModel, msg: str, pos: A.Pos, hint: str) -> FlexDSLError:
    return FlexDSLError(msg, ck.filename, pos.line, pos.column, ck.source, hint)


def find_bounds(ck: CheckedModel) -> dict[str, Bound]:
    """The bound of every learnable param that a `where` constraint names (see the module
    docstring); a constraint that cannot be kept this way is a located error."""
    order = {p.name: i for i, p in enumerate(ck.params)}
    learnable = {p.name for p in ck.params if p.learnable}
    lower: dict[str, list[Limit]] = {}
    upper: dict[str, list[Limit]] = {}
    for q in ck.params:
        if q.where is None:
            continue
        named = {n.id for n in A.names(q.where)} & learnable
        if not named:
            continue
        carrier = max(named, key=order.__getitem__)
        for side, lim in _limits(ck, q, carrier, learnable):
            (lower if side == "lower" else upper).setdefault(carrier, []).append(lim)
    out = {}
    declared = {p.name for p in ck.params} | {s.name for s in ck.states} | {i.name for i in ck.inputs}
    for name in sorted(set(lower) | set(upper), key=order.__getitem__):
        b = Bound(name, tuple(lower.get(name, ())), tuple(upper.get(name, ())))
        if b.raw in declared:
            p = ck.param(name)
            raise _error(ck, f"learnable `{name}` is bounded, so it trains as the Parameter `{b.raw}`, a name this "
                         "model declares", p.pos, f"rename `{b.raw}` (the bound: {b.formula()})")
        out[name] = b
    return out


def _limits(ck: CheckedModel, q: A.Param, carrier: str, learnable: set[str]) -> list[tuple[str, Limit]]:
    """The bounds that `q`'s constraint puts on `carrier`: ("lower" | "upper", Limit) pairs."""
    where = q.where
    assert where is not None
    ops, operands = where.ops, where.operands
    text = A.constraint_text(ck.source, where)
    whose = "its constraint" if q.name == carrier else f"the constraint of `{q.name}`"
    form = (f"`{carrier} > a`, `{carrier} < b` or `a < {carrier} < b` (a, b expressions of other params)")
    hint_alone = (f"write {whose} with `{carrier}` alone on one side: {form}" +
                  ("" if q.name == carrier else f"; or make `{carrier}` not learnable"))
    at = [i for i, o in enumerate(operands) if carrier in {n.id for n in A.names(o)}]
    factor = _bare(operands[at[0]], carrier) if len(at) == 1 else None
    if factor is None:
        raise _error(ck, f"`{carrier}` is learnable, and {whose}, `{text}`, cannot be kept through training: "
                     f"it does not bound `{carrier}` alone", where.pos, hint_alone)
    i = at[0]
    out: list[tuple[str, Limit]] = []
    for j, op in ((i - 1, _FLIP[ops[i - 1]]) if i > 0 else (None, None), (i + 1, ops[i]) if i < len(ops) else
                  (None, None)):
        if j is None:
            continue
        if op in ("==", "!="):
            raise _error(ck, f"`{carrier}` is learnable, and {whose}, `{text}`, cannot be kept through training: "
                         f"`{op}` is not a bound", where.pos,
                         f"a learnable param trains within bounds written with <, <=, > or >= ({form}); "
                         f"or make `{carrier}` not learnable")
        other = operands[j]
        expr = other if isinstance(factor, A.Num) and factor.value == 1.0 else \
            A.Num(0.0, "0", other.pos) if isinstance(other, A.Num) and other.value == 0 else \
            A.BinOp("/", other, factor, other.pos)
        side = "lower" if op in (">", ">=") else "upper"
        out.append((side, Limit(expr, op in ("<", ">"), q.name)))
    # the rest of a chain (`a < b` in `a < b < carrier`) must not need training to hold
    for k in range(len(ops)):
        if k in (i - 1, i):
            continue
        both = {n.id for o in (operands[k], operands[k + 1]) for n in A.names(o)} & learnable
        if both:
            raise _error(ck, f"`{text}` relates learnable params other than `{carrier}`, which training cannot keep",
                         where.pos, f"write it as separate constraints, each bounding one learnable param ({form})")
    return out


__all__ = ["Bound", "Limit", "find_bounds", "RAW_PREFIX"]
