"""Stage 5b: Triton multi-step kernels, printed from the equations (StepModel, BackwardModel).

One neuron per lane, the time loop inside the kernel (T is a runtime bound, never unrolled),
float32 arithmetic and states in registers, loads and stores in the tensors' own dtype.

Two kernels per model:
- `fwd_kernel`: inference (outputs every step, final states), optionally the state sequences
  (`_STORE_SEQS`) and, for training (`_SAVE`), the few per-step values the backward needs;
- `bwd_kernel`: a reverse-time loop carrying the state gradients in registers; gradients of
  the inputs (per step), of the initial states, and per-lane partial sums of the learnable
  params' gradients (reduced over broadcast dims by the caller, no atomics).

What to save for the backward is a minimum vertex cut on the SSA graph of one step (see
`plan_saves`): the backward needs some forward values; every one of them must be computable
from the saved set plus the params. Saving a value costs a write (forward) and a read
(backward) per step, re-reading an input a read. For LIF that is one sequence, the pre-spike
membrane `v_1`, and the input is not re-read.

Loop-invariant assignments (functions of params only) are hoisted before the time loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from .derive import BackwardModel
from .functions import SpikeGE, SpikeGT
from .lower import StepModel
from .printing import BasePrinter, lhs_rhs_lines

FP = "tl.float32"


class TritonPrinter(BasePrinter):
    FUNCS = {
        "exp": "tl.exp", "log": "tl.log", "sqrt": "tl.sqrt", "abs": "tl.abs", "sin": "tl.sin",
        "cos": "tl.cos", "sigmoid": "tl.sigmoid", "min": "tl.minimum", "max": "tl.maximum",
        "where": "tl.where", "tanh": "_tanh",
    }

    def _num(self, e) -> str:
        if isinstance(e, sp.Basic) and e.is_number and not isinstance(e, sp.logic.boolalg.BooleanAtom):
            try:
                return repr(float(e))
            except TypeError:
                pass
        return self._print(e)

    def _print_Where(self, e):
        c, a, b = e.args
        return f"tl.where({self._print(c)}, {self._num(a)}, {self._num(b)})"

    def _print_relu(self, e):
        return f"tl.maximum({self._print(e.args[0])}, 0.0)"

    def _print_clip(self, e):
        x, lo, hi = e.args
        return f"tl.minimum(tl.maximum({self._print(x)}, {self._num(lo)}), {self._num(hi)})"

    def _print_fmin(self, e):
        return f"tl.minimum({self._num(e.args[0])}, {self._num(e.args[1])})"

    def _print_fmax(self, e):
        return f"tl.maximum({self._num(e.args[0])}, {self._num(e.args[1])})"

    def _print_heaviside(self, e):
        return f"tl.where({self._print(e.args[0])} >= 0, 1.0, 0.0)"

    def _print_SpikeGE(self, e):
        return f"tl.where({self._print(e.args[0])} >= 0, 1.0, 0.0)"

    def _print_SpikeGT(self, e):
        return f"tl.where({self._print(e.args[0])} > 0, 1.0, 0.0)"

    def _print_Detach(self, e):  # identity in forward; derive.py gives it no gradient
        return self._print(e.args[0])

    def _print_sign(self, e):
        x = self._print(e.args[0])
        return f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))"

    def _print_Pow(self, e, rational=False):
        base, ex = e.args
        if ex.is_number:
            fe = float(ex)
            if fe == 0.5:
                return f"tl.sqrt({self._print(base)})"
            if fe == -0.5:
                return f"(1.0 / tl.sqrt({self._print(base)}))"
            if fe.is_integer() and 0 < abs(fe) <= 16:
                b = self._print(base)
                b = b if base.is_Atom or base.is_Function else f"({b})"
                prod = "*".join([b] * int(abs(fe)))
                return f"({prod})" if fe > 0 else f"(1.0 / ({prod}))"
        if base == sp.E:
            return f"tl.exp({self._print(ex)})"
        return f"_pow({self._print(base)}, {self._num(ex)})"


class HostPrinter(BasePrinter):
    """Python (float64, `math`) for the loop invariants computed on the host."""

    FUNCS = {
        "exp": "math.exp", "log": "math.log", "sqrt": "math.sqrt", "abs": "abs", "sin": "math.sin",
        "cos": "math.cos", "tanh": "math.tanh", "sigmoid": "_sigmoid", "min": "min", "max": "max",
        "where": "_where", "relu": "_relu", "clip": "_clip", "heaviside": "_heaviside", "detach": "",
        "sign": "_sign",
    }

    def _print_SpikeGE(self, e):
        return f"_heaviside({self._print(e.args[0])})"

    def _print_SpikeGT(self, e):
        return f"_heaviside_gt({self._print(e.args[0])})"


# --------------------------------------------------------------------------- analysis
def _free(e: sp.Expr) -> set[sp.Symbol]:
    return set(e.free_symbols) if isinstance(e, sp.Basic) else set()


def hoisted(assignments, invariant: set[sp.Symbol]) -> set[sp.Symbol]:
    """SSA symbols whose value depends only on `invariant` symbols (params), transitively."""
    out: set[sp.Symbol] = set()
    for y, e in assignments:
        if _free(e) <= invariant | out:
            out.add(y)
    return out


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


@dataclass
class Plan:
    """What the kernels compute, save and recompute (see the module docstring)."""

    fwd_hoisted: list[tuple[sp.Symbol, sp.Expr]]
    fwd_body: list[tuple[sp.Symbol, sp.Expr]]
    saved: list[sp.Symbol]  # SSA values / previous states written per step by the forward
    reread: list[sp.Symbol]  # inputs read again by the backward
    bwd_fwd_hoisted: list[tuple[sp.Symbol, sp.Expr]]
    recompute: list[tuple[sp.Symbol, sp.Expr]]
    bwd_hoisted: list[tuple[sp.Symbol, sp.Expr]]
    bwd_body: list[tuple[sp.Symbol, sp.Expr]]
    grad_outputs_used: list[bool]
    grad_next_used: list[bool]
    notes: list[str] = field(default_factory=list)


def plan_saves(step: StepModel, bw: BackwardModel) -> Plan:
    params = {p.symbol for p in step.params}
    inputs, states = list(step.inputs), list(step.states)
    fhoist = hoisted(step.assignments, params)
    free = params | fhoist
    fwd_syms = {y for y, _ in step.assignments} | set(inputs) | set(states)

    # forward: dead-code elimination from outputs and next states (saved values are added below)
    def live(assignments, roots: set[sp.Symbol]) -> set[sp.Symbol]:
        need = set(roots)
        for y, e in reversed(assignments):
            if y in need:
                need |= _free(e)
        return need

    # backward: live assignments from the gradients it returns
    results = [*bw.grad_inputs, *bw.grad_states, *bw.grad_params]
    bw_live = live(bw.assignments, set().union(*(_free(r) for r in results)) if results else set())
    bw_assign = [(y, e) for y, e in bw.assignments if y in bw_live]
    need_fwd = set()
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

    fwd_live = live(step.assignments, set().union(*(_free(v) for _, v in step.outputs), *(_free(v) for v in
                                                                                            step.next_states),
                                                 set(saved)))
    fwd_hoisted = [(y, e) for y, e in step.assignments if y in fhoist and y in fwd_live]
    fwd_body = [(y, e) for y, e in step.assignments if y not in fhoist and y in fwd_live]

    bw_need_hoist = set()
    for _, e in [*recompute, *bw_assign]:
        bw_need_hoist |= _free(e)
    for r in results:
        bw_need_hoist |= _free(r)
    bw_fwd_hoisted = [(y, e) for y, e in step.assignments
                      if y in fhoist and y in live([(a, b) for a, b in step.assignments if a in fhoist], bw_need_hoist)]
    bhoist = hoisted(bw_assign, free)
    bwd_hoisted = [(y, e) for y, e in bw_assign if y in bhoist]
    bwd_body = [(y, e) for y, e in bw_assign if y not in bhoist]
    used = set()
    for _, e in bw_assign:
        used |= _free(e)
    for r in results:
        used |= _free(r)
    return Plan(fwd_hoisted, fwd_body, saved, reread, bw_fwd_hoisted, recompute, bwd_hoisted, bwd_body,
                [g in used for g in bw.grad_outputs], [g in used for g in bw.grad_next_states])


def _fire_on_stored_values(plan: Plan, step: StepModel, io_ptr: str) -> list[tuple[sp.Symbol, sp.Expr]]:
    """The forward body, where the spike decision reads saved values as they are stored (in
    the I/O dtype): the backward recomputes the spike from the stored values, so with 16-bit
    I/O both must see the same rounding, or a lane just under the threshold would get the
    other branch's reset derivative. (A no-op for float32 I/O.)"""
    inner = [s for s in plan.saved if s not in step.states]
    if not inner:
        return list(plan.fwd_body)
    fire_args = {e.args[0] for _, e in plan.fwd_body if isinstance(e, SpikeGE | SpikeGT)}
    stored = {s: sp.Symbol(f"{s.name}.to({io_ptr}.dtype.element_ty).to(tl.float32)") for s in inner}
    out = []
    for y, e in plan.fwd_body:
        if y in fire_args or isinstance(e, SpikeGE | SpikeGT):
            e = e.xreplace(stored)
        out.append((y, e))
    return out


def _simultaneous(pairs: list[tuple[str, str]], ind: str) -> list[str]:
    """Lines assigning several loop-carried variables at once (each right side sees the old values)."""
    if len(pairs) <= 1:
        return [f"{ind}{name} = {value}" for name, value in pairs]
    return [f"{ind}_new_{name} = {value}" for name, value in pairs] + [f"{ind}{name} = _new_{name}" for name, _ in pairs]


# --------------------------------------------------------------------------- printing
def _ident(s: str) -> str:
    return s


def emit_triton(step: StepModel, bw: BackwardModel) -> str:
    """The generated module: metadata, `fwd_kernel` and `bwd_kernel` (Triton source)."""
    pr = TritonPrinter()
    P = pr._print
    plan = plan_saves(step, bw)
    src_lines = step.checked.source.splitlines()
    ins = [P(x) for x in step.inputs]
    sts = [P(s) for s in step.states]
    prs = [P(p.symbol) for p in step.params]
    lrn = [P(p.symbol) for p in step.learnable]
    outs = [name for name, _ in step.outputs]
    n_in = len(ins)
    saved = [P(s) for s in plan.saved]
    reread = [P(x) for x in plan.reread]
    g_in_nz = [not (isinstance(g, sp.Basic) and g == 0) for g in bw.grad_inputs]
    g_st_nz = [not (isinstance(g, sp.Basic) and g == 0) for g in bw.grad_states]
    g_p_nz = [not (isinstance(g, sp.Basic) and g == 0) for g in bw.grad_params]
    k = len(saved)
    train_passes = n_in + len(outs) + k + len(outs) + k + len(reread) + n_in
    infer_passes = n_in + len(outs)

    # symbols surely holding a [BLOCK] tensor (everything else may be a scalar)
    def lanes(syms_assign, base):
        out = set(base)
        for y, e in syms_assign:
            if _free(e) & out:
                out.add(y)
        return out

    def block(e, lane_set) -> str:
        if isinstance(e, sp.Basic) and _free(e) & lane_set:
            return P(e)
        if isinstance(e, sp.Basic) and e.is_number:
            return f"_zero + {float(e)!r}"
        return f"_zero + ({P(e)})"

    L: list[str] = []
    add = L.append
    add(f'"""Generated by flexdsl from {step.checked.filename}: neuron {step.name}. Do not edit.')
    add("")
    add("Triton kernels printed from the equations: one neuron per lane, the time loop in the kernel.")
    add(f"Saved for backward per step: {', '.join(saved) or 'nothing'}"
        f"{'; inputs re-read: ' + ', '.join(reread) if reread else ''}.")
    add(f"Passes over [T, N] per step (in the I/O dtype): inference {infer_passes}, "
        f"training forward + backward {train_passes}.")
    add('"""')
    add("import math")
    add("import os")
    add("")
    add("import triton")
    add("import triton.language as tl")
    add("")
    add(f"NAME = {step.name!r}")
    add(f"INPUTS = {tuple(ins)!r}")
    add(f"STATES = {tuple(sts)!r}")
    add(f"PARAMS = {tuple(prs)!r}")
    add(f"LEARNABLE = {tuple(lrn)!r}")
    add(f"OUTPUTS = {tuple(outs)!r}")
    add(f"SAVED = {tuple(saved)!r}  # per-step values written by the training forward, read by the backward")
    add(f"REREAD = {tuple(reread)!r}  # inputs the backward reads again")
    add(f"GRAD_INPUTS = {tuple(g_in_nz)!r}  # which gradients are not identically zero")
    add(f"GRAD_STATES = {tuple(g_st_nz)!r}")
    add(f"GRAD_PARAMS = {tuple(g_p_nz)!r}")
    add(f"GRAD_OUTPUTS_USED = {tuple(plan.grad_outputs_used)!r}")
    add(f"GRAD_NEXT_USED = {tuple(plan.grad_next_used)!r}")
    add(f"INFER_PASSES = {infer_passes}")
    add(f"TRAIN_PASSES = {train_passes}")
    add("")
    add('if os.environ.get("TRITON_INTERPRET", "0") == "1":')
    add("    @triton.jit")
    add("    def _tanh(x):")
    add("        return 2 * tl.sigmoid(2 * x) - 1")
    add("")
    add("    @triton.jit")
    add("    def _pow(x, y):")
    add("        return tl.exp(y * tl.log(x))")
    add("else:")
    add("    from triton.language.extra import libdevice")
    add("")
    add("    @triton.jit")
    add("    def _tanh(x):")
    add("        return libdevice.tanh(x)")
    add("")
    add("    @triton.jit")
    add("    def _pow(x, y):")
    add("        return libdevice.pow(x, y)")
    add("")

    hp = HostPrinter()
    fwd_h = [P(y) for y, _ in plan.fwd_hoisted]
    bwd_h = [P(y) for y, _ in [*plan.bwd_fwd_hoisted, *plan.bwd_hoisted]]
    all_h: list = []
    seen: set = set()
    for y, e in [*plan.fwd_hoisted, *plan.bwd_fwd_hoisted, *plan.bwd_hoisted]:
        if y not in seen:
            seen.add(y)
            all_h.append((y, e))
    add(f"HOISTED_FWD = {tuple(fwd_h)!r}  # loop invariants, computed on the host in float64 when every")
    add(f"HOISTED_BWD = {tuple(bwd_h)!r}  # param is a Python float, else in the kernel")
    add("")
    add("")
    add(f"def host_invariants({', '.join(prs)}):")
    add('    """The loop invariants in float64 (params given as Python floats)."""')
    L.extend(lhs_rhs_lines(hp, all_h, indent="    "))
    add("    return {" + ", ".join(f"{P(y)!r}: {hp._print(y)}" for y, _ in all_h) + "}")
    add("")
    add("")
    add("def _sigmoid(x):")
    add("    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))")
    add("")
    add("")
    add("def _where(c, a, b):")
    add("    return a if c else b")
    add("")
    add("")
    add("def _relu(x):")
    add("    return max(x, 0.0)")
    add("")
    add("")
    add("def _clip(x, lo, hi):")
    add("    return min(max(x, lo), hi)")
    add("")
    add("")
    add("def _heaviside(x):")
    add("    return 1.0 if x >= 0 else 0.0")
    add("")
    add("")
    add("def _heaviside_gt(x):")
    add("    return 1.0 if x > 0 else 0.0")
    add("")
    add("")
    add("def _sign(x):")
    add("    return (x > 0) - (x < 0)")
    add("")

    def hoist_lines(assign, origins=None, ind="    "):
        if not assign:
            return []
        out = [f"{ind}# loop invariants (params only)", f"{ind}if _HOST:"]
        out += [f"{ind}    {P(y)} = _h_{P(y)}" for y, _ in assign]
        out += [f"{ind}else:"]
        out += lhs_rhs_lines(pr, assign, origins, src_lines, indent=ind + "    ")
        return out

    def param_prologue(ind="    "):
        out = []
        for p in prs:
            out += [
                f"{ind}if _{p}_MODE == 0:",
                f"{ind}    {p} = _{p}_arg",
                f"{ind}elif _{p}_MODE == 1:",
                f"{ind}    {p} = tl.load(_{p}_arg).to({FP})",
                f"{ind}else:",
                f"{ind}    {p} = tl.load(_{p}_arg + _offs, mask=_mask, other=1.0).to({FP})",
            ]
        return out

    head = [
        "    _pid = tl.program_id(0)",
        "    _offs = _pid.to(tl.int64) * _BLOCK + tl.arange(0, _BLOCK)",
        "    _mask = _offs < _N",
        f"    _zero = tl.zeros([_BLOCK], dtype={FP})",
    ]

    def load(ptr, ind):
        return f"tl.load({ptr}, mask=_mask, other=0.0).to({FP})"

    def store(ptr, base, val, ind):
        return f"{ind}tl.store({ptr}, ({val}).to({base}.dtype.element_ty), mask=_mask)"

    # ---------------- forward
    fsig = []
    for x in ins:
        fsig += [f"_{x}_ptr", f"_{x}_st"]
    fsig += [f"_{s}_init" for s in sts]
    fsig += [f"_{p}_arg" for p in prs]
    fsig += [f"_out_{o}_ptr" for o in outs]
    fsig += [f"_{s}_fin_ptr" for s in sts]
    fsig += [f"_{s}_seq_ptr" for s in sts]
    fsig += [f"_h_{y}" for y in fwd_h]
    fsig += ["_sav_ptr", "_N", "_T"]
    fsig += [f"_{s}_INIT: tl.constexpr" for s in sts]
    fsig += [f"_{p}_MODE: tl.constexpr" for p in prs]
    fsig += ["_HOST: tl.constexpr", "_STORE_SEQS: tl.constexpr", "_SAVE: tl.constexpr", "_BLOCK: tl.constexpr"]
    add("")
    add('@triton.jit(do_not_specialize=["_T"])')
    add("def fwd_kernel(")
    for a in fsig:
        add(f"    {a},")
    add("):")
    add(f'    """{step.name}: T steps of {", ".join(ins)} -> {", ".join(outs)}; one neuron per lane.')
    add("    Params: MODE 0 scalar argument, 1 one-element tensor, 2 per-lane tensor [N].")
    add('    States: INIT 0 scalar argument, 2 per-lane tensor [N]."""')
    L.extend(head)
    add("    _TN = _T.to(tl.int64) * _N")
    L.extend(param_prologue())
    for s in sts:
        add(f"    if _{s}_INIT == 0:")
        add(f"        {s} = _zero + _{s}_init")
        add("    else:")
        add(f"        {s} = {load(f'_{s}_init + _offs', '        ')}")
    L.extend(hoist_lines(plan.fwd_hoisted, step.origins))
    for x in ins:
        add(f"    _{x}_p = _{x}_ptr + _offs")
    add("    _o = _offs")
    add("    for _step in range(0, _T):")
    ind = "        "
    for x in ins:
        add(f"{ind}{x} = {load(f'_{x}_p', ind)}")
    lane_f = lanes(step.assignments, set(step.inputs) | set(step.states))
    for i, s in enumerate(plan.saved):
        if s in step.states:
            add(f"{ind}if _SAVE:")
            add(store(f"_sav_ptr + {i} * _TN + _o", "_sav_ptr", P(s), ind + "    "))
    L.extend(lhs_rhs_lines(pr, _fire_on_stored_values(plan, step, f"_out_{outs[0]}_ptr"), step.origins,
                           src_lines, indent=ind))
    for (name, v) in step.outputs:
        add(store(f"_out_{name}_ptr + _o", f"_out_{name}_ptr", block(v, lane_f), ind))
    for i, s in enumerate(plan.saved):
        if s not in step.states:
            add(f"{ind}if _SAVE:")
            add(store(f"_sav_ptr + {i} * _TN + _o", "_sav_ptr", P(s), ind + "    "))
    nexts = [block(v, lane_f) for v in step.next_states]
    L.extend(_simultaneous([(s, v) for s, v in zip(sts, nexts) if v != s], ind))
    if sts:
        add(f"{ind}if _STORE_SEQS:")
        for s in sts:
            add(store(f"_{s}_seq_ptr + _o", f"_{s}_seq_ptr", s, ind + "    "))
    for x in ins:
        add(f"{ind}_{x}_p += _{x}_st")
    add(f"{ind}_o += _N")
    for s in sts:
        add(store(f"_{s}_fin_ptr + _offs", f"_{s}_fin_ptr", s, "    "))
    add("")

    # ---------------- backward
    g_out = [P(g) for g in bw.grad_outputs]
    g_next = [P(g) for g in bw.grad_next_states]
    bsig = []
    for x in ins:
        bsig += [f"_{x}_ptr", f"_{x}_st"]
    bsig += ["_sav_ptr"]
    bsig += [f"_{p}_arg" for p in prs]
    bsig += [f"_g_{o}_ptr" for o in outs]
    bsig += [f"_g_{s}_seq_ptr" for s in sts]
    bsig += [f"_g_{s}_fin_ptr" for s in sts]
    bsig += [f"_gx_{x}_ptr" for x in ins]
    bsig += [f"_gs_{s}_ptr" for s in sts]
    bsig += [f"_gp_{p}_ptr" for p in lrn]
    bsig += [f"_h_{y}" for y in bwd_h]
    bsig += ["_N", "_T"]
    bsig += [f"_{p}_MODE: tl.constexpr" for p in prs]
    bsig += [f"_HAS_G_{o}: tl.constexpr" for o in outs]
    bsig += [f"_HAS_GSEQ_{s}: tl.constexpr" for s in sts]
    bsig += [f"_HAS_GFIN_{s}: tl.constexpr" for s in sts]
    bsig += [f"_NEED_GX_{x}: tl.constexpr" for x in ins]
    bsig += [f"_NEED_GS_{s}: tl.constexpr" for s in sts]
    bsig += [f"_NEED_GP_{p}: tl.constexpr" for p in lrn]
    bsig += ["_HOST: tl.constexpr", "_BLOCK: tl.constexpr"]
    add("")
    add('@triton.jit(do_not_specialize=["_T"])')
    add("def bwd_kernel(")
    for a in bsig:
        add(f"    {a},")
    add("):")
    add(f'    """{step.name}: the derived vector-Jacobian product over T steps, in reverse time.')
    add("    State gradients are carried in registers; learnable params get per-lane partial sums.")
    add('    Saved values are read back; the rest of the forward is recomputed from them."""')
    L.extend(head)
    add("    _TN = _T.to(tl.int64) * _N")
    L.extend(param_prologue())
    L.extend(hoist_lines([*plan.bwd_fwd_hoisted, *plan.bwd_hoisted], step.origins))
    for s, g in zip(sts, g_next):
        add(f"    if _HAS_GFIN_{s}:")
        add(f"        {g} = {load(f'_g_{s}_fin_ptr + _offs', '        ')}")
        add("    else:")
        add(f"        {g} = _zero")
    for p in lrn:
        add(f"    _acc_{p} = _zero")
    add("    _o = _offs + (_T - 1).to(tl.int64) * _N")
    for x in reread:
        add(f"    _{x}_p = _{x}_ptr + _offs + (_T - 1).to(tl.int64) * _{x}_st")
    add("    for _step in range(0, _T):")
    for x in reread:
        add(f"{ind}{x} = {load(f'_{x}_p', ind)}")
    for i, s in enumerate(saved):
        add(f"{ind}{s} = {load(f'_sav_ptr + {i} * _TN + _o', ind)}")
    if plan.recompute:
        add(f"{ind}# forward values, recomputed")
        L.extend(lhs_rhs_lines(pr, plan.recompute, step.origins, src_lines, indent=ind))
    for o, g, used in zip(outs, g_out, plan.grad_outputs_used):
        if used:
            add(f"{ind}if _HAS_G_{o}:")
            add(f"{ind}    {g} = {load(f'_g_{o}_ptr + _o', ind)}")
            add(f"{ind}else:")
            add(f"{ind}    {g} = _zero")
    for s, g in zip(sts, g_next):
        add(f"{ind}if _HAS_GSEQ_{s}:")
        add(f"{ind}    {g} = {g} + {load(f'_g_{s}_seq_ptr + _o', ind)}")
    add(f"{ind}# backward")
    L.extend(lhs_rhs_lines(pr, plan.bwd_body, indent=ind))
    lane_b = set(bw.grad_outputs) | set(bw.grad_next_states) | set(step.inputs) | set(step.states)
    lane_b = lanes([*plan.recompute, *plan.bwd_body], lane_b | set(plan.saved))
    for x, g, nz in zip(ins, bw.grad_inputs, g_in_nz):
        if nz:
            add(f"{ind}if _NEED_GX_{x}:")
            add(store(f"_gx_{x}_ptr + _o", f"_gx_{x}_ptr", P(g), ind + "    "))
    for p, g, nz in zip(lrn, bw.grad_params, g_p_nz):
        if nz:
            add(f"{ind}_acc_{p} = _acc_{p} + {P(g)}")
    L.extend(_simultaneous([(g, block(v, lane_b)) for g, v in zip(g_next, bw.grad_states)], ind))
    for x in reread:
        add(f"{ind}_{x}_p -= _{x}_st")
    add(f"{ind}_o -= _N")
    for s, g, nz in zip(sts, g_next, g_st_nz):
        if nz:
            add(f"    if _NEED_GS_{s}:")
            add(store(f"_gs_{s}_ptr + _offs", f"_gs_{s}_ptr", g, "        "))
    for p, nz in zip(lrn, g_p_nz):
        if nz:
            add(f"    if _NEED_GP_{p}:")
            add(f"        tl.store(_gp_{p}_ptr + _offs, _acc_{p}, mask=_mask)")
    add("")
    return "\n".join(L) + "\n"


__all__ = ["emit_triton", "TritonPrinter", "plan_saves", "Plan"]
