"""`NIRNetwork`, the executor of an imported graph: layer by layer over whole sequences, so the
neurons use their multi-step kernels; a graph with cycles runs step by step, a recurrent edge
carrying the previous step's value."""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import reduce

import torch
from torch import nn

from ..errors import FlexDSLError
from ..runtime.delays import Delay
from ..runtime.module import NeuronModule
from ..runtime.recurrent import RecurrentModule

_ATTRIBUTES = frozenset(dir(nn.ModuleDict()))  # names a ModuleDict key cannot take ("forward", "_modules", ...)


def _key(name: str, taken: set[str]) -> str:
    """A ModuleDict key for a node name (no dots, not empty, no attribute's name, unique)."""
    base = re.sub(r"[^0-9A-Za-z_]", "_", name) or "node"
    if base in _ATTRIBUTES:
        base = "node_" + base
    key, k = base, 1
    while key in taken:
        key = f"{base}_{k}"
        k += 1
    taken.add(key)
    return key


class NIRNetwork(nn.Module):
    """A NIR graph run with flexdsl neurons. `net(x)`: x is `[T, batch, *shape]` (step_mode "m")
    or `[batch, *shape]` ("s"); returns the output node's value (a tuple for several outputs).

    A graph without cycles runs layer by layer over the whole sequence (the neurons' multi-step
    kernels). A neuron fed back through a weight node (Linear, Affine or Scale) that nothing else
    reads is one compiled recurrent layer (`flexdsl.recurrent`: the node's kind is "recurrent"),
    which also runs over the whole sequence; a graph with other cycles runs step by step, each
    recurrent edge carrying its source's value of the previous step (before the first: its value
    for zero input with silent neurons). `recurrent`: the graph has cycles (fused or not);
    `stepwise`: it runs step by step.
    Nodes are `net.nodes[key]` (`net.names` maps the NIR node names to keys); `net.neuron_texts`
    holds each neuron's generated `.neuron` text.
    """

    def __init__(self, modules: Mapping[str, nn.Module], kinds: Mapping[str, str], edges: Sequence[tuple[str, str]],
                 entry: str, exits: Sequence[str], dt: float, step_mode: str = "m",
                 types: Mapping[str, str] | None = None, shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        super().__init__()
        self._node_kinds = dict(types or kinds)
        taken: set[str] = set()
        self.names = {n: _key(n, taken) for n in kinds}
        self.nodes = nn.ModuleDict({self.names[n]: m for n, m in modules.items()})
        self.kinds = {self.names[n]: k for n, k in kinds.items()}
        # the per-sample shape each neuron node's params give it (NIR's params have the shape of the layer)
        self._param_shapes = {self.names[n]: tuple(s) for n, s in (shapes or {}).items() if n in self.names}
        self.dt = dt
        self.step_mode = step_mode
        e = [(self.names[a], self.names[b]) for a, b in edges]
        self.entry = self.names[entry]
        self.exits = [self.names[x] for x in exits]
        self.order, back = _order(self.entry, e)
        missing = [x for x in self.exits if x not in self.order]
        if missing:
            inv = {v: k for k, v in self.names.items()}
            raise FlexDSLError(f"the output node `{inv[missing[0]]}` is not connected to the input", "<nir graph>")
        reach = set(self.order)
        _refuse_malformed(e, self.entry, self.exits, reach, {v: k for k, v in self.names.items()})
        self.preds = {n: [a for a, b in e if b == n and (a, b) not in back and a in reach] for n in self.order}
        self.back_preds = {n: [a for a, b in e if b == n and (a, b) in back] for n in self.order}
        self.stepwise = bool(back)
        self.recurrent = self.stepwise or "recurrent" in self.kinds.values()
        self._prev: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None

    @property
    def node_kinds(self) -> dict[str, str]:
        """What each node is, by NIR node name: a NIR primitive, or the torch layer it runs as."""
        return dict(self._node_kinds)

    @property
    def neuron_texts(self) -> dict[str, str]:
        """The generated `.neuron` text of each neuron node, by NIR node name."""
        return {n: (self.nodes[k].neuron if self.kinds[k] == "recurrent" else self.nodes[k]).compiled.text
                for n, k in self.names.items() if self.kinds[k] in ("neuron", "recurrent")}

    def reset(self) -> None:
        """Every neuron back to its initial state; recurrent edges to 0."""
        for m in self.nodes.values():
            if isinstance(m, NeuronModule | RecurrentModule | Delay):
                m.reset()
        self._prev = {}

    def check(self, shape: tuple[int, ...]) -> None:
        """One step of a zero input of this per-sample shape (the Input node's), so that layers
        whose shapes do not fit are a located error at load; the states are reset after."""
        with torch.no_grad():
            x = torch.zeros(1, 1, *shape)
            if self.recurrent:
                self._step(x[0])
            else:
                self._one(x, 2, {})
        self.reset()

    def _run_node(self, key: str, x: torch.Tensor, lead: int) -> torch.Tensor:
        try:
            y = self._node_value(key, x, lead)
        except (RuntimeError, IndexError, ValueError, FlexDSLError) as e:  # (a layer or neuron that does not fit its input)
            inv = {v: k for k, v in self.names.items()}
            node = f"NIR node `{inv[key]}` ({self._node_kinds.get(inv[key], self.kinds[key])})"
            if isinstance(e, FlexDSLError) and ("reset()" in (e.hint or "") or isinstance(self.nodes[key] if key in self.nodes else None, Delay)):
                # (a batch change, a Delay's own values: the layer's own reason, not a shape misfit)
                raise FlexDSLError(f"{node}: {e.reason}", "<nir graph>", hint=e.hint) from None
            why = e.reason if isinstance(e, FlexDSLError) else str(e).splitlines()[0]
            raise FlexDSLError(f"NIR node `{inv[key]}` ({self._node_kinds.get(inv[key], self.kinds[key])}) does not "
                               f"fit its input of per-sample shape {tuple(x.shape[lead:])}: {why}", "<nir graph>",
                               hint="the graph's layers must agree on the shapes between them") from None
        if self._shapes is not None:  # export records each node's per-sample shapes
            self._shapes.setdefault(key, (tuple(x.shape[lead:]), tuple(y.shape[lead:])))
        return y

    def _node_value(self, key: str, x: torch.Tensor, lead: int) -> torch.Tensor:
        kind = self.kinds[key]
        if kind == "pass":
            return x
        m = self.nodes[key]
        if kind in ("neuron", "recurrent"):
            shape = self._param_shapes.get(key, ())
            if shape and not _fits(shape, tuple(x.shape[lead:])):
                raise FlexDSLError(f"its params have the shape {shape}", "<nir graph>")
            return m(x) if lead == 2 else m(x.unsqueeze(0))[0]
        if kind == "vector":
            return m(x)
        if kind == "delay":  # (over time: the whole sequence, or one step with the kept history)
            return m(x) if lead == 2 else m(x.unsqueeze(0))[0]
        if kind == "flatten":
            # (dims of a sample: from 0, or from the end where negative)
            start = m.start_dim + lead if m.start_dim >= 0 else m.start_dim
            end = m.end_dim + lead if m.end_dim >= 0 else m.end_dim
            return torch.flatten(x, start, end)
        front = x.shape[:lead]
        y = m(x.reshape(-1, *x.shape[lead:]))
        return y.reshape(*front, *y.shape[1:])

    def _one(self, x: torch.Tensor, lead: int, prev: Mapping[str, torch.Tensor],
             rest: bool = False) -> dict[str, torch.Tensor]:
        """Every node's value for input `x` (one step, or a whole sequence where the graph has no
        cycle); recurrent edges take `prev`. With `rest`, the neurons are silent (0) and keep
        their states: the graph's value before the first step."""
        values: dict[str, torch.Tensor] = {}
        for key in self.order:
            ins = [values[p] for p in self.preds[key] if p in values] if key != self.entry else [x]
            ins += [prev[p] for p in self.back_preds[key] if p in prev]
            if ins:
                total = reduce(operator.add, ins)
                # (at rest a delay is its empty history's 0 and keeps that history: it has seen no step yet)
                values[key] = torch.zeros_like(total) if rest and self.kinds[key] in ("neuron", "recurrent", "delay") else \
                    self._run_node(key, total, lead)
        return values

    def _step(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.stepwise and not self._prev:  # before the first step: zero input, silent neurons
            self._prev = self._carried(self._one(torch.zeros_like(x), 1, {}, rest=True))
        values = self._one(x, 1, self._prev)
        self._prev = self._carried(values)
        return values

    def _carried(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {p: values[p] for ps in self.back_preds.values() for p in ps if p in values}

    def _outputs(self, values: Mapping[str, torch.Tensor]):
        outs = [values.get(k) for k in self.exits]
        if any(o is None for o in outs):
            raise FlexDSLError("an output node received no value", "<nir graph>")
        return outs[0] if len(outs) == 1 else tuple(outs)

    def forward(self, x: torch.Tensor):
        if self.step_mode == "s":
            return self._outputs(self._step(x))
        if x.dim() < 2:
            raise FlexDSLError(f"inputs must be [T, batch, *shape], got shape {tuple(x.shape)}", "<nir graph>")
        if not self.stepwise:
            return self._outputs(self._one(x, 2, {}))
        steps = [self._step(x[t]) for t in range(x.shape[0])]
        for k in self.exits:
            if any(k not in v for v in steps):
                raise FlexDSLError("an output node received no value", "<nir graph>")
        outs = [torch.stack([v[k] for v in steps]) for k in self.exits]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def extra_repr(self) -> str:
        return (f"dt={self.dt:g}, step_mode={self.step_mode!r}" + (", recurrent" if self.recurrent else "")
                + (", stepwise" if self.stepwise else ""))


def _fits(params: tuple[int, ...], sample: tuple[int, ...]) -> bool:
    """Whether params of this shape broadcast to a sample's shape without changing it."""
    try:
        return tuple(torch.broadcast_shapes(params, sample)) == sample
    except RuntimeError:
        return False


def _refuse_malformed(edges: Sequence[tuple[str, str]], entry: str, exits: Sequence[str], reach: set[str],
                      inv: Mapping[str, str]) -> None:
    """Edges a graph cannot mean: into its Input node, out of an Output node, or from a node the
    input never reaches into one it does (that node's value, a bias perhaps, would be dropped)."""
    for a, b in edges:
        why = ("goes into the graph's Input node" if b == entry else
               "goes out of an Output node" if a in exits else
               f"comes from `{inv[a]}`, which no path from the Input reaches (its value would be dropped)"
               if a not in reach and b in reach else None)
        if why is not None:
            raise FlexDSLError(f"the NIR edge `{inv[a]}` -> `{inv[b]}` {why}", "<nir graph>",
                               hint="fix the graph's edges (nir.NIRGraph(nodes=..., edges=...))")


def _order(entry: str, edges: Sequence[tuple[str, str]]) -> tuple[list[str], set[tuple[str, str]]]:
    """Nodes reachable from `entry` in an order where every edge but the back edges (those
    closing a cycle, found by depth-first search) goes forward; and the back edges."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    state: dict[str, int] = {entry: 1}
    back: set[tuple[str, str]] = set()
    post: list[str] = []
    stack = [(entry, iter(succ[entry]))]
    while stack:
        node, it = stack[-1]
        for nxt in it:
            s = state.get(nxt)
            if s == 1:
                back.add((node, nxt))
            elif s is None:
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))
                break
        else:
            state[node] = 2
            post.append(node)
            stack.pop()
    return post[::-1], back
