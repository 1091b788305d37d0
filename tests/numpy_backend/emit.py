"""The NumPy backend's one generated module per model, printed from the IR's schedule (as the
torch backend's layer scan is): `_invariants(*params)` (the param-only values, once per call),
`_fwd_step(*inputs, *states, *params, *invariants[, _noise])` -> (outputs, next states, the
values the backward reads) and `_bwd_step(*reread inputs, *saved, *params, *invariants,
*output grads, *next-state grads[, _noise])` -> (grads of inputs, of previous states, of the
learnable params): the model's derived backward."""

from __future__ import annotations

from typing import Any

from flexdsl.backends.printer import lhs_rhs_lines

from .printer import PROLOGUE, NumpyPrinter


def emit(ir: Any) -> tuple[str, dict[str, Any]]:
    step, bw, sch = ir.step, ir.backward, ir.schedule
    pr = NumpyPrinter()
    S = pr._print
    params = [S(p.symbol) for p in step.params]
    hnames = [S(y) for y, _ in sch.hoisted]
    inner = [s for s in sch.saved if s not in step.states]
    ins, states = [S(x) for x in step.inputs], [S(s) for s in step.states]
    noise = ["_noise"][:bool(step.draws)]
    g_out, g_next = [S(g) for g in bw.grad_outputs], [S(g) for g in bw.grad_next_states]
    saved, reread = [S(s) for s in sch.saved], [S(x) for x in sch.reread]

    def ret(values) -> str:
        return "    return (" + "".join(S(v) + ", " for v in values) + ")"

    lines = [
        PROLOGUE, "",
        f"def _invariants({', '.join(params)}):",
        *lhs_rhs_lines(pr, sch.hoisted),
        f"    return ({''.join(h + ', ' for h in hnames)})", "", "",
        f"def _fwd_step({', '.join([*ins, *states, *params, *hnames, *noise])}):",
        *lhs_rhs_lines(pr, sch.fwd_body),
        ret([*(v for _, v in step.outputs), *step.next_states, *inner]), "", "",
        f"def _bwd_step({', '.join([*reread, *saved, *params, *hnames, *g_out, *g_next, *noise])}):",
        *lhs_rhs_lines(pr, sch.recompute),
        *lhs_rhs_lines(pr, sch.bwd_body),
        ret([*bw.grad_inputs, *bw.grad_states, *bw.grad_params]), "",
    ]
    meta = {"inputs": [x.name for x in step.inputs], "states": [s.name for s in step.states],
            "outputs": [n for n, _ in step.outputs],
            "saved_states": [step.states.index(s) if s in step.states else -1 for s in sch.saved],
            "reread": [step.inputs.index(x) for x in sch.reread], "learnable": [p.name for p in step.learnable],
            "params": [p.name for p in step.params], "draws": step.draws}
    return "\n".join(lines) + "\n", meta
