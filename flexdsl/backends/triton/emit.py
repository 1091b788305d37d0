"""The Triton backend's emitter: multi-step kernels printed from the equations.

One neuron per lane, the time loop inside the kernel (T is a runtime bound, never unrolled),
float32 arithmetic and states in registers, loads and stores in the tensors' own dtype.
Three kernels per model, each a template in `templates/` filled from the kernel ABI
(`abi.KernelABI`), the schedule (`ir.schedule`) and the cost model's training plans (`cost.py`):

- `fwd_kernel`: inference (outputs every step, final states), optionally the state sequences
  (`_STORE_SEQS`) and, for training (`_SAVE`), the per-step values the backward needs;
- `bwd_kernel`: a reverse-time loop carrying the state gradients in registers; gradients of
  the inputs (per step), of the initial states, and per-lane partial sums of the learnable
  params' gradients (reduced over broadcast dims by the launcher, no atomics);
- `bwd_rc_kernel`: the same, re-running each chunk of steps from its checkpoint of the states,
  the values it needs kept in registers (the recompute training plan).

What is saved, re-read and recomputed, and what is hoisted out of the time loop, is the
schedule's decision; this module only prints it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sympy as sp

from ...frontend.numeric import EXPREL_D_SERIES, EXPREL_D_SERIES_F32, EXPREL_SERIES_BOUND
from ...frontend.parse import source_lines
from ...ir.functions import TNOW, SpikeGE, SpikeGT
from ...ir.schedule import Assignments
from ..base import IR
from ..naming import ident, tagged
from ..printer import BasePrinter, comment_text, lhs_rhs_lines, load_notes
from .abi import KernelABI
from .cost import TrainingPlans, training_plans

TEMPLATES = Path(__file__).resolve().parent / "templates"


class Stored(sp.Function):
    """A value as stored in the I/O dtype and read back (the spike decision of 16-bit I/O)."""

    nargs = 1


class TritonPrinter(BasePrinter):
    TARGET = "triton"
    SPELL = {
        "exp": "tl.exp({0})", "log": "tl.log({0})", "sqrt": "tl.sqrt({0})", "abs": "tl.abs({0})",
        "sin": "tl.sin({0})", "cos": "tl.cos({0})", "tanh": "_tanh({0})", "sigmoid": "tl.sigmoid({0})",
        # (NaN in, NaN out, as torch's: Triton's maximum/minimum drop a NaN by default)
        "relu": "tl.maximum({0}, 0.0, propagate_nan=tl.PropagateNan.ALL)",
        "min": "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
        "max": "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
        "clip": "tl.minimum(tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL), {2}, "
                "propagate_nan=tl.PropagateNan.ALL)",
        "where": "tl.where({0}, {1}, {2})",
        "heaviside": "tl.where({0} >= 0, 1.0, 0.0)", "spike_ge": "tl.where({0} >= 0, 1.0, 0.0)",
        "spike_gt": "tl.where({0} > 0, 1.0, 0.0)", "detach": "{0}",
        "sign": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))", "exprel": "_exprel({0})",
        "exprel_d": "_exprel_d({0})",
    }

    def __init__(self, io_ptr: str = "") -> None:
        super().__init__()
        self.io_ptr = io_ptr  # a pointer argument whose element type is the I/O dtype

    def arg(self, a: sp.Expr) -> str:  # numbers are float32 constants in kernels
        if isinstance(a, sp.Basic) and a.is_number and not isinstance(a, sp.logic.boolalg.BooleanAtom):
            try:
                return repr(float(a))
            except TypeError:
                pass
        return self._print(a)

    # the draws of a noisy model: element `_offs`, the step `_tnow` (each kernel's loop names it)
    def _print_Randn(self, e) -> str:
        return f"_randn(_seedlo, _seedhi, {self._print(e.args[1])}, _offs, {int(e.args[0])})"

    def _print_Rand(self, e) -> str:
        return f"_rand(_seedlo, _seedhi, {self._print(e.args[1])}, _offs, {int(e.args[0])})"

    def _print_Stored(self, e) -> str:
        return f"_stored({self._print(e.args[0])}, {self.io_ptr}, _ROUND)"

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
        return f"_pow({self._print(base)}, {self.arg(ex)})"


class HostPrinter(BasePrinter):
    """Python floats (`math`), for the loop invariants computed on the host in float64 (the
    helpers `_sigmoid`, `_relu`, `_clip`, `_host_exprel`... are defined in the kernels' module)."""

    TARGET = "host"
    SPELL = {
        "exp": "math.exp({0})", "log": "math.log({0})", "sqrt": "math.sqrt({0})", "abs": "abs({0})",
        "sin": "math.sin({0})", "cos": "math.cos({0})", "tanh": "math.tanh({0})", "sigmoid": "_sigmoid({0})",
        "relu": "_relu({0})", "min": "min({0}, {1})", "max": "max({0}, {1})", "clip": "_clip({0}, {1}, {2})",
        "where": "({1} if {0} else {2})", "heaviside": "(1.0 if {0} >= 0 else 0.0)",
        "spike_ge": "(1.0 if {0} >= 0 else 0.0)", "spike_gt": "(1.0 if {0} > 0 else 0.0)", "detach": "{0}",
        "sign": "float(({0} > 0) - ({0} < 0))", "exprel": "_host_exprel({0})", "exprel_d": "_host_exprel_d({0})",
    }


def _free(e: Any) -> set[sp.Symbol]:
    return set(e.free_symbols) if isinstance(e, sp.Basic) else set()


def _lanes(assignments: Assignments, base: set[sp.Symbol]) -> set[sp.Symbol]:
    """Symbols surely holding a [BLOCK] tensor (anything else may be a scalar)."""
    out = set(base)
    for y, e in assignments:
        if _free(e) & out:
            out.add(y)
    return out


def _simultaneous(pairs: list[tuple[str, str]]) -> list[str]:
    """Lines assigning several loop-carried variables at once (each right side sees the old values)."""
    if len(pairs) <= 1:
        return [f"{name} = {value}" for name, value in pairs]
    return ([f"{tagged('new', name)} = {value}" for name, value in pairs]
            + [f"{name} = {tagged('new', name)}" for name, _ in pairs])


@dataclass
class _Printed:
    """What the templates print, as plain strings."""

    pr: TritonPrinter
    origins: dict
    src: list[str]

    def lines(self, assignments: Assignments, comments: bool = True) -> list[str]:
        if comments:
            return lhs_rhs_lines(self.pr, assignments, self.origins, self.src, indent="")
        return lhs_rhs_lines(self.pr, assignments, indent="")

    def block(self, e: Any, lanes: set[sp.Symbol]) -> str:
        """An expression as a [BLOCK] tensor (scalars are broadcast by adding `_splat`, a -0.0,
        which keeps every value's sign)."""
        if isinstance(e, sp.Basic) and _free(e) & lanes:
            return self.pr._print(e)
        if isinstance(e, sp.Basic) and e.is_number:
            return f"_splat + {float(e)!r}"
        return f"_splat + ({self.pr._print(e)})"


def build_abi(ir: IR, plans: TrainingPlans | None = None) -> KernelABI:
    step, sch = ir.step, ir.schedule
    plans = plans or training_plans(step, sch)
    n_in, n_out = len(step.inputs), len(step.outputs)
    infer, train = sch.passes(n_in, n_out)
    return KernelABI(
        name=step.name,
        inputs=[x.name for x in step.inputs], states=[s.name for s in step.states],
        params=[p.name for p in step.params], learnable=[p.name for p in step.learnable],
        outputs=[n for n, _ in step.outputs], saved=[s.name for s in sch.saved],
        reread=[x.name for x in sch.reread], hoisted_fwd=[y.name for y, _ in sch.fwd_hoisted],
        hoisted_bwd=[y.name for y, _ in [*sch.bwd_fwd_hoisted, *sch.bwd_hoisted]],
        grad_inputs=list(sch.grad_inputs_nonzero), grad_states=list(sch.grad_states_nonzero),
        grad_params=list(sch.grad_params_nonzero), infer_passes=infer, train_passes=train,
        rc_inputs=[x.name for x in sch.rc_inputs], hoisted_rc=[y.name for y, _ in sch.rc_hoisted],
        chunk=plans.chunk, rc_passes=sch.recompute_passes(n_in, n_out, len(step.states), plans.chunk),
        train_plan=plans.plan32, train_plan16=plans.plan16, draws=step.draws)


def _fire_on_stored_values(body: Assignments, saved: list[sp.Symbol], states: list[sp.Symbol]) -> Assignments:
    """The forward body, where the spike decision reads saved values as they are stored (in
    the I/O dtype): the backward recomputes the spike from the stored values, so with 16-bit
    I/O both must see the same rounding, or a lane just under the threshold would get the
    other branch's reset derivative. (A no-op for float32 I/O.)"""
    inner = [s for s in saved if s not in states]
    if not inner:
        return list(body)
    fire_args = {e.args[0] for _, e in body if isinstance(e, SpikeGE | SpikeGT)}
    stored = {s: Stored(s) for s in inner}
    return [(y, e.xreplace(stored) if (y in fire_args or isinstance(e, SpikeGE | SpikeGT)) else e)
            for y, e in body]


def emit(ir: IR) -> tuple[str, KernelABI]:
    """The generated module (Triton source) and its ABI."""
    step, bw, sch = ir.step, ir.backward, ir.schedule
    plans = training_plans(step, sch)
    abi = build_abi(ir, plans)
    io_ptr = abi.name_of("out", abi.outputs[0])
    P = _Printed(TritonPrinter(io_ptr), step.origins, source_lines(step.checked.source))
    S = P.pr._print

    def sym_name(s: sp.Symbol) -> str:
        return S(s)

    param_loads = [{"name": ident(p), "arg": abi.name_of("param", p), "mode": abi.name_of("mode", p)}
                   for p in abi.params]

    # ---------------- forward
    lane_f = _lanes(step.assignments, set(step.inputs) | set(step.states) | {TNOW})
    fwd = SimpleNamespace(**{
        "states": [{"name": ident(s), "arg": abi.name_of("init", s), "mode": abi.name_of("initmode", s),
                    "seq": abi.name_of("seq", s), "fin": abi.name_of("fin", s)} for s in abi.states],
        "hoisted": [{"name": sym_name(y), "arg": abi.name_of("hoisted", y.name)} for y, _ in sch.fwd_hoisted],
        "hoisted_lines": P.lines(sch.fwd_hoisted),
        "inputs": [{"name": ident(x), "arg": abi.name_of("in", x), "stride": abi.name_of("stride", x),
                    "ptr": tagged("ptr", x)} for x in abi.inputs],
        "saved_before": [{"index": i, "name": sym_name(s)} for i, s in enumerate(sch.saved) if s in step.states],
        "body": P.lines(_fire_on_stored_values(sch.fwd_body, sch.saved, step.states)),
        "outputs": [{"arg": abi.name_of("out", n), "value": P.block(v, lane_f)} for n, v in step.outputs],
        "saved_after": [{"index": i, "name": sym_name(s)} for i, s in enumerate(sch.saved)
                        if s not in step.states],
        "update": _simultaneous([(ident(s.name), P.block(v, lane_f)) for s, v in zip(step.states, step.next_states)
                                 if v != s]),
    })

    # ---------------- backward
    lane_b = set(bw.grad_outputs) | set(bw.grad_next_states) | set(step.inputs) | set(step.states) | {TNOW}
    lane_b = _lanes([*sch.recompute, *sch.bwd_body], lane_b | set(sch.saved))
    grad_next = [S(g) for g in bw.grad_next_states]
    bwd_hoisted = [*sch.bwd_fwd_hoisted, *sch.bwd_hoisted]
    bwd = SimpleNamespace(**{
        "hoisted": [{"name": sym_name(y), "arg": abi.name_of("hoisted", y.name)} for y, _ in bwd_hoisted],
        "hoisted_lines": P.lines(bwd_hoisted),
        "states": [{"grad": g, "gfin": abi.name_of("gfin", s), "hasgfin": abi.name_of("hasgfin", s),
                    "gseq": abi.name_of("gseq", s), "hasgseq": abi.name_of("hasgseq", s)}
                   for s, g in zip(abi.states, grad_next)],
        "learnable": [{"acc": tagged("acc", p), "arg": abi.name_of("gp", p), "need": abi.name_of("needgp", p),
                       "value": S(g) if nz else ""}
                      for p, g, nz in zip(abi.learnable, bw.grad_params, abi.grad_params)],
        "reread": [{"name": ident(x), "arg": abi.name_of("in", x), "stride": abi.name_of("stride", x),
                    "ptr": tagged("ptr", x)} for x in abi.reread],
        "saved": [{"index": i, "name": sym_name(s)} for i, s in enumerate(sch.saved)],
        "recompute": P.lines(sch.recompute),
        "outputs": [{"grad": S(g), "arg": abi.name_of("gout", n), "hasg": abi.name_of("hasgout", n)}
                    for n, g, used in zip(abi.outputs, bw.grad_outputs, sch.grad_outputs_used) if used],
        "body": P.lines(sch.bwd_body, comments=False),
        "grad_inputs": [{"arg": abi.name_of("gx", x), "need": abi.name_of("needgx", x), "value": S(g)}
                        for x, g, nz in zip(abi.inputs, bw.grad_inputs, abi.grad_inputs) if nz],
        "update": _simultaneous([(g, P.block(v, lane_b)) for g, v in zip(grad_next, bw.grad_states)]),
        "grad_states": [{"arg": abi.name_of("gs", s), "need": abi.name_of("needgs", s), "grad": g}
                        for s, g, nz in zip(abi.states, grad_next, abi.grad_states) if nz],
    })

    rc = _recompute_view(ir, abi, P, grad_next)

    hp = HostPrinter()
    hoisted = sch.hoisted
    saved_note = ", ".join(s.name for s in sch.saved) or "nothing"
    if sch.reread:
        saved_note += "; inputs re-read: " + ", ".join(x.name for x in sch.reread)
    source = _env().get_template("kernels.py.j2").render(
        model=comment_text(step.name), filename=comment_text(step.checked.filename), notes=load_notes(step.checked),
        filename_repr=repr(step.checked.filename), abi=abi, saved_note=saved_note,
        params=[ident(p) for p in abi.params],
        host_lines=lhs_rhs_lines(hp, hoisted, indent=""),
        host_return="{" + ", ".join(f"{y.name!r}: {hp._print(y)}" for y, _ in hoisted) + "}",
        param_loads=param_loads, fwd=fwd, bwd=bwd, rc=rc,
        plan=textwrap.wrap(f"Training plan with float32 I/O: {comment_text(plans.why32, 400)}. With "
                           f"float16/bfloat16 I/O: {comment_text(plans.why16, 400)}.", 94),
        exprel={"bound": repr(EXPREL_SERIES_BOUND), "series": [repr(c) for c in EXPREL_D_SERIES_F32],
                "series64": textwrap.wrap(", ".join(repr(c) for c in reversed(EXPREL_D_SERIES)) + ",", 100)})
    return source, abi


def _recompute_view(ir: IR, abi: KernelABI, P: _Printed, grad_next: list[str]) -> SimpleNamespace:
    """What the recompute backward prints: per unrolled step j of a chunk, the forward (every
    name suffixed by the step: `_j3__v_1`), keeping what saving would write (`saved`, re-read
    inputs) in registers; then, in reverse, the saving backward's per-step code reading them."""
    step, bw, sch = ir.step, ir.backward, ir.schedule
    S = P.pr._print
    noise = [TNOW] if step.draws else []  # a step's draws read its own step
    renamed = [*step.states, *step.inputs, *(y for y, _ in sch.rc_body), *noise]
    kept = [*step.states, *sch.saved, *sch.reread, *noise]  # what the backward of a step reads of its forward

    def ren(j: int, syms) -> dict[sp.Symbol, sp.Symbol]:
        return {s: sp.Symbol(tagged(f"j{j}", s.name), real=True) for s in syms}

    steps = []
    for j in range(abi.chunk):
        r, r_next, rk = ren(j, renamed), ren(j + 1, step.states), ren(j, kept)
        lanes = _lanes([(r.get(y, y), e.xreplace(r)) for y, e in sch.rc_body],
                       {r[s] for s in [*step.states, *sch.rc_inputs, *noise]})
        forward = P.lines([(r[y], e.xreplace(r)) for y, e in sch.rc_body], comments=False)
        if j + 1 < abi.chunk:
            forward += [f"{S(r_next[s])} = {P.block(v.xreplace(r), lanes)}" for s, v in zip(step.states,
                                                                                       step.next_states)]
        back = [(y, e.xreplace(rk)) for y, e in [*sch.recompute, *sch.bwd_body]]
        lanes_b = _lanes(back, set(rk.values()) | set(bw.grad_outputs) | set(bw.grad_next_states))
        steps.append(SimpleNamespace(
            j=j, tnow=S(r[TNOW]) if noise else "",
            inputs=[{"name": S(r[x]), "arg": abi.name_of("in", x.name), "stride": abi.name_of("stride", x.name)}
                    for x in sch.rc_inputs],
            forward=forward,
            outputs=[{"grad": S(g), "pre": tagged(f"g{j}", n), "arg": abi.name_of("gout", n),
                      "hasg": abi.name_of("hasgout", n)}
                     for n, g, used in zip(abi.outputs, bw.grad_outputs, sch.grad_outputs_used) if used],
            backward=P.lines(back, comments=False),
            grad_inputs=[{"arg": abi.name_of("gx", x), "need": abi.name_of("needgx", x),
                          "value": S(g.xreplace(rk))}
                         for x, g, nz in zip(abi.inputs, bw.grad_inputs, abi.grad_inputs) if nz],
            learnable=[{"acc": tagged("acc", p), "value": P.block(g.xreplace(rk), lanes_b)}
                       for p, g, nz in zip(abi.learnable, bw.grad_params, abi.grad_params) if nz],
            update=_simultaneous([(g, f"tl.where(_ok{j}, {P.block(v.xreplace(rk), lanes_b)}, {g})")
                                  for g, v in zip(grad_next, bw.grad_states)]),
        ))
    first = ren(0, step.states)
    return SimpleNamespace(
        hoisted=[{"name": S(y), "arg": abi.name_of("hoisted", y.name)} for y, _ in sch.rc_hoisted],
        hoisted_lines=P.lines(sch.rc_hoisted),
        states=[{"grad": g, "gfin": abi.name_of("gfin", s), "hasgfin": abi.name_of("hasgfin", s),
                 "gseq": abi.name_of("gseq", s), "hasgseq": abi.name_of("hasgseq", s), "first": S(first[sym]),
                 "init": abi.name_of("init", s), "mode": abi.name_of("initmode", s)}
                for s, g, sym in zip(abi.states, grad_next, step.states)],
        learnable=[{"acc": tagged("acc", p), "arg": abi.name_of("gp", p), "need": abi.name_of("needgp", p),
                    "value": nz} for p, nz in zip(abi.learnable, abi.grad_params)],
        outputs=[{"grad": S(g), "arg": abi.name_of("gout", n), "hasg": abi.name_of("hasgout", n)}
                 for n, g, used in zip(abi.outputs, bw.grad_outputs, sch.grad_outputs_used) if used],
        grad_states=[{"arg": abi.name_of("gs", s), "need": abi.name_of("needgs", s), "grad": g}
                     for s, g, nz in zip(abi.states, grad_next, abi.grad_states) if nz],
        steps=steps,
    )


@lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)  # noqa: S701 - Python source, not HTML
    env.filters["block"] = lambda lines, n: "\n".join(" " * n + ln if ln else ln for ln in lines) if lines \
        else " " * n + "pass"
    return env


__all__ = ["emit", "build_abi", "TritonPrinter", "HostPrinter"]
