"""Typed AST of a `.neuron` file. Every node carries its source position.

Nodes are plain dataclasses; `meta` dicts leave room for later metadata (units, tags)
without changing the node types.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pos:
    line: int
    column: int


# ---------------------------------------------------------------- expressions
@dataclass(frozen=True)
class Num:
    value: float
    text: str
    pos: Pos


@dataclass(frozen=True)
class Name:
    id: str
    pos: Pos


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / **
    left: Expr
    right: Expr
    pos: Pos


@dataclass(frozen=True)
class Neg:
    operand: Expr
    pos: Pos


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    pos: Pos


@dataclass(frozen=True)
class Compare:
    """A comparison or a chain: operands[0] ops[0] operands[1] ops[1] ..."""

    operands: tuple[Expr, ...]
    ops: tuple[str, ...]
    pos: Pos


Expr = Num | Name | BinOp | Neg | Call | Compare


# ---------------------------------------------------------------- declarations
@dataclass
class Input:
    name: str
    pos: Pos
    doc: str = ""
    meta: dict = field(default_factory=dict)


@dataclass
class Param:
    name: str
    default: Expr
    pos: Pos
    where: Compare | None = None
    learnable: bool = False
    doc: str = ""
    meta: dict = field(default_factory=dict)


@dataclass
class State:
    name: str
    init: Expr
    pos: Pos
    doc: str = ""
    meta: dict = field(default_factory=dict)


@dataclass
class Kwarg:
    name: str
    value: Expr
    pos: Pos


@dataclass
class SurrogateDef:
    """`surrogate name(x, k=v, ...) = expr`: expr is the derivative S'(x)."""

    name: str
    arg: str
    kwargs: list[Kwarg]
    body: Expr
    pos: Pos
    meta: dict = field(default_factory=dict)


@dataclass
class Output:
    names: list[tuple[str, Pos]]
    pos: Pos


# ---------------------------------------------------------------- blocks
@dataclass
class Assign:
    target: str
    op: str  # = += -= *= /=
    value: Expr
    pos: Pos
    is_let: bool = False


@dataclass
class Update:
    statements: list[Assign]
    pos: Pos


@dataclass
class ODE:
    """`dX/dt = value`: `state` is X (empty when the numerator does not start with `d`)."""

    state: str
    value: Expr
    pos: Pos  # of X
    written: str = ""  # the numerator as written, e.g. "dv"
    denom: str = "dt"
    denom_pos: Pos | None = None


@dataclass
class Subexpr:
    name: str
    value: Expr
    pos: Pos


@dataclass
class Equations:
    lines: list[ODE | Subexpr]
    pos: Pos
    method: str | None = None
    method_pos: Pos | None = None


@dataclass
class SurrogateUse:
    name: str
    kwargs: list[Kwarg]
    pos: Pos


@dataclass
class SpikeRule:
    left: Expr
    op: str  # ">=" or ">"
    right: Expr
    pos: Pos
    surrogate: SurrogateUse | None = None


@dataclass
class OnSpike:
    statements: list[Assign]
    pos: Pos


Item = Input | Param | State | SurrogateDef | Output | Update | Equations | SpikeRule | OnSpike


@dataclass
class Neuron:
    name: str
    items: list[Item]
    pos: Pos
    filename: str
    source: str
    doc: str = ""
    meta: dict = field(default_factory=dict)

    def of(self, kind: type) -> list:
        return [it for it in self.items if isinstance(it, kind)]
