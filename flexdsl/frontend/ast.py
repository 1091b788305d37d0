"""Typed AST of a `.neuron` file. Every node carries its source position.

Nodes are plain dataclasses; `meta` dicts leave room for later metadata (units, tags)
without changing the node types.

`ExprFold` is the one expression visitor: the checker, the numeric evaluator and the
lowering to sympy are folds over an expression (a `visit_<Node>` method per node type,
called with the node and its children's results). It walks iteratively, so the depth of
an expression never reaches Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..errors import source_lines


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
class Quantity:
    """A number with a unit, `10 ms` or `2 cm**2`: `value * unit**power` (the unit is a
    unit name, never a model name; compound units are built with operators on bare unit
    names, `120 mS/cm**2`). The units stage replaces it with a `Num` in the base units."""

    value: float
    text: str
    unit: str
    power: float
    pos: Pos
    unit_pos: Pos
    power_text: str = ""


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


Expr = Num | Quantity | Name | BinOp | Neg | Call | Compare


# ---------------------------------------------------------------- declarations
@dataclass
class Input:
    """`input name [: unit] ["doc"]`; `unit` is the unit expression as parsed (its text is
    `meta["unit"]`)."""

    name: str
    pos: Pos
    doc: str = ""
    meta: dict = field(default_factory=dict)
    unit: Expr | None = None


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
    held: bool = False  # `unless refractory`: not applied while the neuron is refractory


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
    held: bool = False  # `unless refractory`: the state is held while the neuron is refractory


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
class Refractory:
    """`refractory PERIOD` (a time, or a number of steps in a model without `dt`) or
    `refractory while CONDITION` (Brian2's boolean refractoriness)."""

    period: Expr | None
    condition: Compare | None
    pos: Pos


@dataclass
class SpikeRule:
    left: Expr
    op: str  # ">=", ">" or "crosses" (an upward crossing: above now, not above at the previous step)
    right: Expr
    pos: Pos
    surrogate: SurrogateUse | None = None
    written: str = ""  # "<" or "<=" where the rule was written `A < B` (stored as `B > A`)


@dataclass
class OnSpike:
    statements: list[Assign]
    pos: Pos


Item = Input | Param | State | SurrogateDef | Output | Update | Equations | SpikeRule | OnSpike | Refractory


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


# ---------------------------------------------------------------- layers
@dataclass
class LayerNeuron:
    """`neuron lif` (a library model) or `neuron "path/to/model.neuron"` (relative to the layer file)."""

    ref: str
    is_path: bool
    pos: Pos


@dataclass
class LayerSize:
    value: int
    pos: Pos


@dataclass
class LayerInput:
    name: str
    size: int | None
    pos: Pos
    doc: str = ""
    size_pos: Pos | None = None


@dataclass
class SynapseEvent:
    """`on pre:` / `on post:` statements of a synapse (plasticity)."""

    kind: str
    statements: list[Assign]
    pos: Pos


@dataclass
class Synapses:
    """`synapses W from PRE to PORT`: the weights `W` carry PRE (a layer input, or an output of the
    neuron: one step late) into the neuron's input PORT."""

    name: str
    pre: str
    port: str
    pos: Pos
    pre_pos: Pos
    port_pos: Pos
    doc: str = ""
    connect: str | None = None
    connect_pos: Pos | None = None
    bias: str | None = None
    bias_pos: Pos | None = None
    delay: Expr | None = None  # `delay EXPR`: every connection; with `delay_kind`, the maximum
    delay_pos: Pos | None = None
    delay_kind: str | None = None  # "axonal", "synaptic", "dendritic": delays given at load, up to `delay`
    delay_learnable: bool = False  # `... learnable [gauss|linear]`: real delays trained through a relaxation
    delay_interp: str | None = None  # the relaxation as written (None: gauss)
    delay_interp_pos: Pos | None = None
    states: list[State] = field(default_factory=list)
    events: list[SynapseEvent] = field(default_factory=list)
    rule: str | None = None  # `rule stdp` / `rule "my.rule"`: the plasticity rule of these weights
    rule_is_path: bool = False
    rule_pos: Pos | None = None
    rule_mode: str | None = None  # `online` or `window` as written (None: window)
    rule_mode_pos: Pos | None = None


LayerItem = LayerNeuron | LayerSize | LayerInput | Synapses


class _Items:
    """A file's top block: its items by kind."""

    items: list

    def of(self, kind: type) -> list:
        return [it for it in self.items if isinstance(it, kind)]


@dataclass
class Layer(_Items):
    name: str
    items: list[LayerItem]
    pos: Pos
    filename: str
    source: str
    doc: str = ""


# ---------------------------------------------------------------- plasticity rules
@dataclass
class WeightDecl:
    """`weight w where 0 <= w <= w_max`: the name the rule's statements give the weight, and its bounds."""

    name: str
    where: Compare | None
    pos: Pos
    doc: str = ""


RuleItem = Input | Param | State | Output | Update | Equations | SynapseEvent | WeightDecl


@dataclass
class Rule(_Items):
    """A plasticity rule (a `.rule` file): states and updates of one synapse group's weights."""

    name: str
    items: list[RuleItem]
    pos: Pos
    filename: str
    source: str
    doc: str = ""


# ---------------------------------------------------------------- traversal
def children(e: Expr) -> tuple[Expr, ...]:
    """The sub-expressions of a node, in source order."""
    if isinstance(e, BinOp):
        return (e.left, e.right)
    if isinstance(e, Neg):
        return (e.operand,)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Compare):
        return e.operands
    return ()


def nodes(e: Expr) -> Iterator[Expr]:
    """Every node of an expression, pre-order (iterative)."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


def names(e: Expr) -> Iterator[Name]:
    """Every Name used in an expression, in source order (function names excluded)."""
    return (n for n in nodes(e) if isinstance(n, Name))


R = TypeVar("R")


class ExprFold(Generic[R]):
    """Bottom-up evaluation of an expression: `visit_Num(node)`, `visit_Name(node)`,
    `visit_BinOp(node, left, right)`, `visit_Neg(node, operand)`, `visit_Call(node, *args)`,
    `visit_Compare(node, *operands)`; each gets its children's results. `enter(node, parent)`
    runs top-down first (for context such as "inside `where`"); the default does nothing."""

    def enter(self, node: Expr, parent: Expr | None) -> None:  # noqa: B027 - optional hook
        pass

    def fold(self, e: Expr) -> R:
        results: list[Any] = []
        stack: list[tuple[Expr, Expr | None, bool]] = [(e, None, False)]
        while stack:
            node, parent, done = stack.pop()
            kids = children(node)
            if not done:
                self.enter(node, parent)
                stack.append((node, parent, True))
                stack.extend((k, node, False) for k in reversed(kids))
                continue
            args = results[len(results) - len(kids):] if kids else []
            if kids:
                del results[len(results) - len(kids):]
            results.append(getattr(self, f"visit_{type(node).__name__}")(node, *args))
        return results[0]


def item_exprs(it: Item) -> Iterator[Expr]:
    """The expressions of a declaration or block."""
    if isinstance(it, Input):
        if it.unit is not None:
            yield it.unit
    elif isinstance(it, Param):
        yield it.default
        if it.where is not None:
            yield it.where
    elif isinstance(it, State):
        yield it.init
    elif isinstance(it, SurrogateDef):
        for k in it.kwargs:
            yield k.value
        yield it.body
    elif isinstance(it, Update | OnSpike):
        for s in it.statements:
            yield s.value
    elif isinstance(it, Equations):
        for ln in it.lines:
            yield ln.value
    elif isinstance(it, SpikeRule):
        yield it.left
        yield it.right
        if it.surrogate is not None:
            for k in it.surrogate.kwargs:
                yield k.value
    elif isinstance(it, Refractory):
        if it.period is not None:
            yield it.period
        if it.condition is not None:
            yield it.condition


def declared_names(neuron: Neuron) -> Iterator[tuple[str, Pos]]:
    """Every identifier written in the model: declared names, targets and uses."""
    yield neuron.name, neuron.pos
    for it in neuron.items:
        if isinstance(it, Input | Param | State):
            yield it.name, it.pos
        elif isinstance(it, SurrogateDef):
            yield it.name, it.pos
            for k in it.kwargs:
                yield k.name, k.pos
        elif isinstance(it, Output):
            yield from ((nm, p) for nm, p in it.names if nm != "spike")
        elif isinstance(it, Update | OnSpike):
            for s in it.statements:
                yield s.target, s.pos
        elif isinstance(it, Equations):
            for ln in it.lines:
                yield (ln.state if isinstance(ln, ODE) else ln.name), ln.pos
        for e in item_exprs(it):
            for n in nodes(e):
                if isinstance(n, Name):
                    yield n.id, n.pos
                elif isinstance(n, Quantity):
                    yield n.unit, n.unit_pos
                elif isinstance(n, Call) and n.func != "where":
                    yield n.func, n.pos


# ---------------------------------------------------------------- printing
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3, "**": 4, "atom": 5}


class _ToText(ExprFold[tuple[str, int]]):
    """An expression as text with the parentheses its structure needs (for messages)."""

    def visit_Num(self, e: Num) -> tuple[str, int]:
        return e.text, _PREC["atom"]

    def visit_Quantity(self, e: Quantity) -> tuple[str, int]:
        return f"{e.text} {quantity_unit(e)}", _PREC["*"]

    def visit_Name(self, e: Name) -> tuple[str, int]:
        return e.id, _PREC["atom"]

    def visit_Neg(self, e: Neg, a: tuple[str, int]) -> tuple[str, int]:
        return "-" + (a[0] if a[1] >= _PREC["neg"] else f"({a[0]})"), _PREC["neg"]

    def visit_BinOp(self, e: BinOp, a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
        p = _PREC[e.op]
        left = a[0] if a[1] > p or (a[1] == p and e.op != "**") else f"({a[0]})"
        right = b[0] if b[1] > p or (b[1] == p and e.op in "+*" and e.op != "**") else f"({b[0]})"
        sep = "**" if e.op == "**" else ("*" if e.op == "*" else f" {e.op} " if p == 1 else e.op)
        return f"{left}{sep}{right}", p

    def visit_Call(self, e: Call, *args: tuple[str, int]) -> tuple[str, int]:
        return f"{e.func}({', '.join(a[0] for a in args)})", _PREC["atom"]

    def visit_Compare(self, e: Compare, *vals: tuple[str, int]) -> tuple[str, int]:
        out = vals[0][0]
        for op, v in zip(e.ops, vals[1:]):
            out += f" {op} {v[0]}"
        return out, 0


def quantity_unit(e: Quantity) -> str:
    """The unit of a number with a unit, as written: `ms`, `cm**2`, `1/ms`."""
    p = e.power_text
    if p.startswith("-"):
        return f"1/{e.unit}" + (f"**{p[1:]}" if p[1:] != "1" else "")
    return e.unit + (f"**{p}" if p else "")


def to_text(e: Expr) -> str:
    """An expression as text, e.g. for an error message (`(v - E_L)/tau`)."""
    return _ToText().fold(e)[0]


def constraint_text(text: str, e: Compare) -> str:
    """A `where` constraint's text as written in the model `text` (for messages and the docs)."""
    line = source_lines(text)[e.pos.line - 1]
    frag = line[e.pos.column - 1:]
    for stop in (' "', " learnable"):
        i = frag.find(stop)
        if i >= 0:
            frag = frag[:i]
    return frag.strip()
