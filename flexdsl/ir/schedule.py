"""Stage 5: the schedule, shared by every backend. From the step (`StepModel`) and its
backward (`BackwardModel`) it decides what runs where:

- the loop invariants: assignments that depend on params only, computed once per call
  instead of once per step (`hoist`);
- the save/recompute plan of training: which per-step forward values the forward writes
  for the backward, which inputs the backward reads again, and what it recomputes from
  them — a minimum vertex cut of the step's SSA graph, where saving a value costs a write
  and a read per step and re-reading an input costs one read (`make_schedule`);
- the bodies that remain per step (forward and backward), which gradients can be nonzero,
  and the number of passes over `[T, N]` memory this implies;
- the alternative to saving, recompute: the training forward writes only its outputs and,
  every few steps (a chunk), a checkpoint of the states; the backward re-runs the forward of
  each chunk from its checkpoint (the values it needs stay in registers) and walks back through
  it. Which of the two trains faster, and how long a chunk is, depends on the target: its cost
  model decides (`backends/triton/cost.py`);
- the host's part (`hoist`, which needs no backward): the param-only values (checked finite
  when params change) and the param-only denominators of the per-step body (checked nonzero).

Backends print these lists; none of them repeats the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from .derive import BackwardModel
from .functions import SpikeGE, SpikeGT, Where
from .lower import StepModel

Assignments = list[tuple[sp.Symbol, sp.Expr]]


def _free(e: sp.Expr) -> set[sp.Symbol]:
    return set(e.free_symbols) if isinstance(e, sp.Basic) else set()


def _is_zero(e: sp.Expr) -> bool:
    return isinstance(e, sp.Basic) and e == 0


def param_only(assignments: Assignments, known: set[sp.Symbol]) -> set[sp.Symbol]:
    """SSA symbols whose value depends only on `known` symbols (params), transitively. A spike
    is never hoisted."""
    out: set[sp.Symbol] = set()
    for y, e in assignments:
        if _free(e) <= known | out and not isinstance(e, SpikeGE | SpikeGT):
            out.add(y)
    return out


def live(assignments: Assignments, roots: set[sp.Symbol]) -> set[sp.Symbol]:
    """The symbols that `roots` depend on through `assignments` (dead-code elimination)."""
    need = set(roots)
    for y, e in reversed(assignments):
        if y in need:
            need |= _free(e)
    return need


@dataclass
class Hoisted:
    """The forward step split into param-only invariants and the per-step body (what the host
    computes and checks once per call: it needs no backward)."""

    invariants: Assignments  # in order
    used: list[sp.Symbol]  # the invariants the body, the outputs or the next states read
    body: Assignments
    # the param-only denominators of the body, (statement, denominator): params that make one 0
    # make the step divide by zero
    denominators: list[tuple[sp.Symbol, sp.Expr]] = field(default_factory=list)
    # the param-only parts of the body's statements, (statement, part): each is computed from the
    # params alone (e.g. euler's `dt*where(tau > 0, -8, 1)**(1/3)`), so params that make one NaN or
    # inf make the step undefined, as for the invariants
    parts: list[tuple[sp.Symbol, sp.Expr]] = field(default_factory=list)


def hoist(step: StepModel) -> Hoisted:
    inv = param_only(step.assignments, {p.symbol for p in step.params})
    invariants = [(y, e) for y, e in step.assignments if y in inv]
    body = [(y, e) for y, e in step.assignments if y not in inv]
    used: set[sp.Symbol] = set()
    for _, e in body:
        used |= _free(e) & inv
    for v in [*step.next_states, *(v for _, v in step.outputs)]:
        used |= _free(v) & inv
    h = Hoisted(invariants, [y for y, _ in invariants if y in used], body)
    h.denominators = param_denominators(step, h)
    h.parts = param_only_parts(step, h)
    return h


@dataclass
class Schedule:
    """What the multi-step kernels compute, save and recompute (see the module docstring)."""

    fwd_hoisted: Assignments  # invariants the forward needs
    fwd_body: Assignments  # per step, live for outputs, next states and saved values
    saved: list[sp.Symbol]  # SSA values / previous states written per step by the training forward
    reread: list[sp.Symbol]  # inputs the backward reads again
    bwd_fwd_hoisted: Assignments  # forward invariants the backward needs
    recompute: Assignments  # forward values the backward recomputes per step from the saved ones
    bwd_hoisted: Assignments  # param-only backward values
    bwd_body: Assignments  # the backward, per step
    grad_outputs_used: list[bool]
    grad_next_used: list[bool]
    grad_inputs_nonzero: list[bool]
    grad_states_nonzero: list[bool]
    grad_params_nonzero: list[bool]
    # recompute
    rc_body: Assignments = field(default_factory=list)  # the forward values a backward step recomputes
    rc_inputs: list[sp.Symbol] = field(default_factory=list)  # inputs the recompute reads
    rc_hoisted: Assignments = field(default_factory=list)  # invariants the recompute kernel needs
    host: Hoisted | None = None  # the forward step split into param-only values and the per-step body

    @property
    def hoisted(self) -> Assignments:
        """Every invariant of either direction, once, in order."""
        out: Assignments = []
        seen: set[sp.Symbol] = set()
        for y, e in [*self.fwd_hoisted, *self.bwd_fwd_hoisted, *self.bwd_hoisted, *self.rc_hoisted]:
            if y not in seen:
                seen.add(y)
                out.append((y, e))
        return out

    def passes(self, n_inputs: int, n_outputs: int) -> tuple[int, int]:
        """Passes over [T, N] per step: (inference, training forward + backward when saving)."""
        k, r = len(self.saved), len(self.reread)
        return n_inputs + n_outputs, n_inputs + n_outputs + k + n_outputs + k + r + n_inputs

    def recompute_passes(self, n_inputs: int, n_outputs: int, n_states: int, chunk: int) -> float:
        """Passes over [T, N] per step of training when recomputing (a checkpoint of every state
        every `chunk` steps, written once and read once)."""
        return n_inputs + n_outputs + n_outputs + len(self.rc_inputs) + n_inputs + 2 * n_states / chunk


def _maxflow_cut(nodes, cost, edges, sources, sinks):
    """Minimum vertex cut separating `sources` from `sinks` in a DAG (Edmonds-Karp on the
    split graph: v_in -> v_out with capacity cost[v]). Returns the cut vertices."""
    INF = float("inf")
    cap: dict = {}

    def add(a, b, c):
        cap.setdefault(a, {})
        cap.setdefault(b, {})
        cap[a][b] = cap[a].get(b, 0) + c
        cap[b].setdefault(a, 0)

    S, Z = ("S",), ("Z",)
    for v in nodes:
        add((v, 0), (v, 1), cost[v])
    for a, b in edges:
        add((a, 1), (b, 0), INF)
    for v in sources:
        add(S, (v, 0), INF)
    for v in sinks:
        add((v, 1), Z, INF)
    if S not in cap or Z not in cap:
        return set()
    while True:
        prev = {S: None}
        queue = [S]
        for u in queue:
            if Z in prev:
                break
            for w, c in cap[u].items():
                if c > 0 and w not in prev:
                    prev[w] = u
                    queue.append(w)
        if Z not in prev:
            break
        path, w = [], Z
        while prev[w] is not None:
            path.append((prev[w], w))
            w = prev[w]
        f = min(cap[a][b] for a, b in path)
        if f == INF:
            raise RuntimeError("no finite cut")
        for a, b in path:
            cap[a][b] -= f
            cap[b][a] += f
    seen = {S}
    queue = [S]
    for u in queue:
        for w, c in cap[u].items():
            if c > 0 and w not in seen:
                seen.add(w)
                queue.append(w)
    return {v for v in nodes if (v, 0) in seen and (v, 1) not in seen}


def make_schedule(step: StepModel, bw: BackwardModel, hoisted: Hoisted | None = None) -> Schedule:
    """The schedule of a step and its backward (`hoisted`: the forward's split, `hoist(step)`,
    when it was made already)."""
    params = {p.symbol for p in step.params}
    inputs, states = list(step.inputs), list(step.states)
    fhoist = param_only(step.assignments, params)
    free = params | fhoist
    fwd_syms = {y for y, _ in step.assignments} | set(inputs) | set(states)

    # backward: live assignments from the gradients it returns
    results = [*bw.grad_inputs, *bw.grad_states, *bw.grad_params]
    bw_live = live(bw.assignments, set().union(*(_free(r) for r in results)) if results else set())
    bw_assign = [(y, e) for y, e in bw.assignments if y in bw_live]
    need_fwd: set[sp.Symbol] = set()
    for _, e in bw_assign:
        need_fwd |= _free(e) & fwd_syms
    for r in results:
        need_fwd |= _free(r) & fwd_syms
    need_fwd -= free

    # min vertex cut: sources = inputs and previous states, sinks = needed forward values
    nodes = sorted(fwd_syms - free, key=lambda s: s.name)
    cost = {v: (1 if v in inputs else 2) for v in nodes}
    edges = [(a, y) for y, e in step.assignments if y not in free for a in _free(e) if a in cost]
    cut = _maxflow_cut(nodes, cost, edges, [*inputs, *states], sorted(need_fwd, key=lambda s: s.name))
    # recompute what is needed from the cut
    closure = set(need_fwd)
    for y, e in reversed(step.assignments):
        if y in closure and y not in cut:
            closure |= _free(e)
    for leaf in [*inputs, *states]:
        if leaf in closure and leaf not in cut:  # cannot happen: the cut separates leaves
            cut.add(leaf)
    order = {s: i for i, s in enumerate([*inputs, *states, *(y for y, _ in step.assignments)])}
    saved = sorted((c for c in cut if c not in inputs), key=order.__getitem__)
    reread = [x for x in inputs if x in cut]
    recompute = [(y, e) for y, e in step.assignments if y in closure and y not in cut and y not in free]

    roots = set().union(*(_free(v) for _, v in step.outputs), *(_free(v) for v in step.next_states), set(saved))
    fwd_live = live(step.assignments, roots)
    fwd_hoisted = [(y, e) for y, e in step.assignments if y in fhoist and y in fwd_live]
    fwd_body = [(y, e) for y, e in step.assignments if y not in fhoist and y in fwd_live]

    bw_need_hoist: set[sp.Symbol] = set()
    for _, e in [*recompute, *bw_assign]:
        bw_need_hoist |= _free(e)
    for r in results:
        bw_need_hoist |= _free(r)
    hoisted_assign = [(a, b) for a, b in step.assignments if a in fhoist]
    bw_fwd_live = live(hoisted_assign, bw_need_hoist)
    bwd_fwd_hoisted = [(y, e) for y, e in hoisted_assign if y in bw_fwd_live]
    bhoist = param_only(bw_assign, free)
    bwd_hoisted = [(y, e) for y, e in bw_assign if y in bhoist]
    bwd_body = [(y, e) for y, e in bw_assign if y not in bhoist]
    used: set[sp.Symbol] = set()
    for _, e in bw_assign:
        used |= _free(e)
    for r in results:
        used |= _free(r)
    sch = Schedule(
        fwd_hoisted, fwd_body, saved, reread, bwd_fwd_hoisted, recompute, bwd_hoisted, bwd_body,
        [g in used for g in bw.grad_outputs], [g in used for g in bw.grad_next_states],
        [not _is_zero(g) for g in bw.grad_inputs], [not _is_zero(g) for g in bw.grad_states],
        [not _is_zero(g) for g in bw.grad_params])
    _plan_recompute(step, sch, fhoist, hoisted_assign, bwd_hoisted)
    sch.host = hoisted or hoist(step)
    return sch


def _plan_recompute(step: StepModel, sch: Schedule, fhoist: set[sp.Symbol], hoisted_assign: Assignments,
                    bwd_hoisted: Assignments) -> None:
    """The recompute alternative. Within a chunk the recompute keeps in registers only what
    saving would write to memory (the minimum cut: `saved`, and the inputs the backward reads
    again); the backward recomputes the rest from them per step, as the saving backward does.
    (How long a chunk is, and which plan trains faster on a target, is the backend's cost model.)"""
    inputs = list(step.inputs)
    roots = set(sch.saved) | set(sch.reread) | set().union(*(_free(v) for v in step.next_states))
    body = [(y, e) for y, e in step.assignments if y in live(step.assignments, roots) and y not in fhoist]
    used = set().union(*(_free(e) for _, e in body)) | roots
    sch.rc_body = body
    sch.rc_inputs = [x for x in inputs if x in used]
    need_h = used | set().union(*(_free(e) for _, e in [*sch.recompute, *sch.bwd_body, *bwd_hoisted]))
    h_live = live(hoisted_assign, need_h | set().union(*(_free(e) for _, e in bwd_hoisted)))
    rc_h = [(y, e) for y, e in hoisted_assign if y in h_live]
    sch.rc_hoisted = rc_h + [(y, e) for y, e in bwd_hoisted if y not in {a for a, _ in rc_h}]


def param_denominators(step: StepModel, h: Hoisted) -> list[tuple[sp.Symbol, sp.Expr]]:
    """(statement, denominator) for every denominator of the per-step body that depends on
    params only: params that make one 0 make the step divide by zero (`x/(a - 1)` at a = 1)."""
    pset = {p.symbol for p in step.params} | {y for y, _ in h.invariants}
    out: list[tuple[sp.Symbol, sp.Expr]] = []
    seen: set[sp.Expr] = set()
    for y, e in h.body:
        for pw in _unguarded_powers(e):
            base = pw.base
            if pw.exp.is_negative and base.free_symbols and base.free_symbols <= pset and base not in seen:
                seen.add(base)
                out.append((y, base))
    return out


def param_only_parts(step: StepModel, h: Hoisted) -> list[tuple[sp.Symbol, sp.Expr]]:
    """(statement, part) for the largest sub-expressions of the per-step body that depend on
    params only (not bare symbols or numbers; never inside the branches of a `where`, which its
    condition may guard)."""
    pset = {p.symbol for p in step.params} | {y for y, _ in h.invariants}
    out: list[tuple[sp.Symbol, sp.Expr]] = []
    seen: set[sp.Expr] = set()
    for y, e in h.body:
        stack = [e]
        while stack:
            n = stack.pop()
            if not isinstance(n, sp.Expr) or n.is_Atom:
                continue
            free = n.free_symbols
            if free and free <= pset and not isinstance(n, SpikeGE | SpikeGT):
                if n not in seen:
                    seen.add(n)
                    out.append((y, n))
                continue
            stack.extend([n.args[0]] if isinstance(n, Where) else n.args)
    return out


def _unguarded_powers(e: sp.Expr) -> list[sp.Pow]:
    """The powers in `e` outside the branches of a `where` (a branch may guard its division)."""
    out: list[sp.Pow] = []
    stack = [e]
    while stack:
        n = stack.pop()
        if isinstance(n, sp.Pow):
            out.append(n)
        if isinstance(n, Where):
            stack.append(n.args[0])
            continue
        stack.extend(n.args)
    return out


__all__ = ["Hoisted", "Schedule", "hoist", "make_schedule", "param_only", "live", "param_denominators",
           "param_only_parts"]
