"""The numbers behind the doc plots: a model simulated on the torch backend in float64.

- `time_axis(c)`: steps, or time in the unit of `dt` where the model declares `dt` with a time
  unit (from the declaration's unit, else from its description, e.g. "integration step (ms)").
- `evaluate_step(step, values)`: the discretized step's SSA assignments evaluated on tensors
  by the host evaluator (`ir/host.py`, the catalog's numeric forms: nothing is `eval`-ed).
  With the spike forced to 0 the step's new states are the values *before* the reset, and the
  spike rule's `u` is the quantity that fires at 0: the plots draw the threshold crossing and
  the threshold itself (`B` in `spike when A >= B`) from them.
- `simulate(c, amplitudes, T, onset)`: step inputs, one per lane; `continue_run(run, steps)` runs the
  same lanes on, from where the run ended (the window of an f–I curve continued, `explore.py`).
- `firing_rates(run, time)`: each lane's rate while the step is on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sympy as sp
import torch

from ..frontend import ast as A
from ..frontend.evaluate import evaluate
from ..ir.host import evaluate_expr
from .units import TIME_UNITS, unit_of

if TYPE_CHECKING:
    from ..ir.lower import StepModel
    from ..runtime.compiler import Compiled

DTYPE = torch.float64
DOC_SEED = 2021  # the seed of a noisy model's simulations in the docs


# ----------------------------------------------------------------------------- time
@dataclass(frozen=True)
class TimeAxis:
    """How a step maps to time: `dt` (the param's default) in `unit`, or plain steps."""

    dt: float | None = None
    unit: str | None = None  # a time unit ("ms"); None: the axis counts steps

    @property
    def seconds(self) -> float | None:
        """Seconds per time unit, or None (steps)."""
        return TIME_UNITS.get(self.unit) if self.unit else None

    @property
    def label(self) -> str:
        return f"time ({self.unit})" if self.unit else "step"

    def times(self, n: int) -> torch.Tensor:
        t = torch.arange(n, dtype=DTYPE)  # step k (as `flexdsl run` prints it) at k steps, its input and its values
        return t * self.dt if self.unit and self.dt else t

    @property
    def rate_label(self) -> str:
        return "rate (Hz)" if self.seconds else "rate (spikes per step)"

    def rate(self, count: torch.Tensor, steps: int) -> torch.Tensor:
        """Spike counts over `steps` steps as a rate (Hz where the time unit is known)."""
        if self.seconds and self.dt:
            return count / (steps * self.dt * self.seconds)
        return count / max(steps, 1)


def param_defaults(c: Compiled, overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """Every param's value (defaults may use earlier params), with overrides."""
    env: dict[str, float] = {}
    for p in c.checked.params:
        env[p.name] = float(overrides[p.name]) if overrides and p.name in overrides else float(
            evaluate(p.default, env))
    return env


def time_axis(c: Compiled, params: Mapping[str, float] | None = None) -> TimeAxis:
    dt = next((p for p in c.checked.params if p.name == "dt"), None)
    if dt is None:
        return TimeAxis()
    unit = unit_of(dt)
    value = (params or param_defaults(c))["dt"]
    if unit in TIME_UNITS:
        return TimeAxis(value, unit)
    return TimeAxis(value, None)


# ----------------------------------------------------------------------------- the step, numerically
def evaluate_step(step: StepModel, values: Mapping[str, Any], spike: Any = None) -> dict[str, Any]:
    """Every SSA value of one step, by name, from the inputs', states' and params' values.
    `spike` replaces the spike's value (0: the values before the reset). Everything is computed
    on float64 tensors (IEEE semantics: an overflow is inf, not an exception)."""
    env: dict[sp.Basic, Any] = {sp.Symbol(k, real=True): torch.as_tensor(v, dtype=DTYPE) for k, v in values.items()}
    for y, e in step.assignments:
        if spike is not None and y == step.spike:
            env[y] = spike
        elif y in env:  # (a draw: its values are given)
            continue
        else:
            env[y] = evaluate_expr(e, env)
    return {s.name: v for s, v in env.items() if isinstance(s, sp.Symbol)}


# ----------------------------------------------------------------------------- simulation
@dataclass
class Run:
    """One batch of step inputs: lanes are amplitudes."""

    amplitudes: torch.Tensor  # [B]
    x: torch.Tensor  # [T, B], the driven input
    onset: int
    states: dict[str, torch.Tensor]  # [T, B], after each step (post-reset)
    pre: dict[str, torch.Tensor]  # [T, B], after the update, before the reset
    spikes: torch.Tensor | None  # [T, B]
    u: torch.Tensor | None  # [T, B], the spike rule's A - B
    threshold_state: str | None = None  # the state the threshold applies to
    threshold: torch.Tensor | None = None  # [T, B] or [1, 1]
    init: dict[str, torch.Tensor] = field(default_factory=dict)  # [B], before the first step
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    module: Any = field(default=None, repr=False)  # the module, its states where the run ended
    params: Mapping[str, float] | None = None  # the param overrides it ran with
    seed: int | None = None  # a noisy model's seed
    start: int = 0  # the run's first step counted from the reset (a continued run: > 0)

    @property
    def T(self) -> int:
        return self.x.shape[0]

    def finite(self) -> torch.Tensor:
        ok = torch.ones(self.x.shape[1], dtype=torch.bool)
        for v in self.states.values():
            ok &= torch.isfinite(v).all(0)
        return ok

    def counts(self) -> torch.Tensor:
        if self.spikes is None:
            return torch.zeros(self.x.shape[1], dtype=DTYPE)
        return self.spikes[self.onset:].sum(0)


def simulate(c: Compiled, amplitudes: torch.Tensor, T: int, onset: int,
             params: Mapping[str, float] | None = None, detail: bool = True) -> Run:
    """Step inputs (0 before `onset`, then each amplitude) on the first input, the others 0
    (`detail`: see `run_module`)."""
    from .. import backends
    from ..runtime.module import NeuronModule

    m = NeuronModule(c, dict(params or {}), "m", backends.REFERENCE, store_state_seqs=True)
    x = torch.zeros(T, amplitudes.numel(), dtype=DTYPE)
    x[onset:] = amplitudes.to(DTYPE)
    return run_module(m, x, params, amplitudes=amplitudes, onset=onset, detail=detail)


def continue_run(run: Run, steps: int, detail: bool = False) -> Run:
    """The lanes of `run` (made by `simulate` or `run_module`) for `steps` more steps of the same
    input, from the states where it ended; a noisy model's draws go on as one longer call's would
    (the steps are counted from the reset). Its `onset` is 0: the step is on throughout."""
    assert run.module is not None, "a run made by run_module"
    x = run.x[-1:].expand(steps, -1).clone()
    return run_module(run.module, x, run.params, amplitudes=run.amplitudes, onset=0, seed=run.seed,
                      start=run.start + run.T, detail=detail)


def run_module(m: Any, x: torch.Tensor, params: Mapping[str, float] | None = None, *,
               amplitudes: torch.Tensor | None = None, onset: int = 0, seed: int | None = None,
               start: int = 0, detail: bool = True) -> Run:
    """Run a loaded model (a `NeuronModule`, any backend; float64 on the torch backend is what
    the docs use) on `x` ([T, B]) fed to its first input, the other inputs 0; the states, the
    spikes, and (`detail`, or where the model does not output its spike) the values before the
    reset with the threshold. A noisy model draws from `seed` (default `DOC_SEED`). `start` > 0:
    the module goes on from its states (`continue_run`)."""
    c = m.compiled
    m = m.to(DTYPE)
    m.store_state_seqs = True
    T, B = x.shape
    if start:
        init = {s: _as_lanes(m.state_seqs[s][-1], B) for s in m._state_names}
    else:
        m.reset()
        init = {s: _as_lanes(v, B) for s, v in m._initial_values().items()}
    zeros = torch.zeros_like(x)
    inputs = [x] + [zeros] * (len(c.checked.inputs) - 1)
    noisy = c.checked.stochastic  # (a fixed seed: the pages show the same noise at every build)
    seed = DOC_SEED if seed is None else seed
    with torch.no_grad():
        out = m(*inputs, seed=seed) if noisy else m(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    outputs = {n: o.to(DTYPE) for (n, _), o in zip(c.checked.outputs, outs)}
    states = {s: m.state_seqs[s].to(DTYPE) for s in m._state_names}
    amps = amplitudes if amplitudes is not None else x[-1] if T else torch.zeros(B, dtype=DTYPE)
    spiking = c.step.spike is not None
    run = Run(amps, x, onset, states, {}, outputs.get("spike") if spiking else None, None, init=init,
              outputs=outputs, module=m, params=params, seed=seed if noisy else None, start=start)
    if detail or (spiking and run.spikes is None):
        pvals = _before_reset(c, run)
        if spiking:
            if run.spikes is None:
                assert run.u is not None
                run.spikes = (run.u >= 0 if c.checked.spike.op == ">=" else run.u > 0).to(DTYPE)
            run.threshold_state, run.threshold = _threshold(c, run, pvals)
    return run


def _before_reset(c: Compiled, run: Run) -> dict[str, float]:
    """The step once more, for all steps at once, with the spike forced to 0: the values before the
    reset (`run.pre`) and the spike rule's `u`. Returns the params' values (derived ones too)."""
    pvals = param_defaults(c, run.params)
    declared = [pvals[p.name] for p in c.checked.params]
    pvals.update(zip(c.derived_names, c.with_derived(declared)[len(declared):]))  # e.g. exact propagators
    T, B = run.x.shape
    prev = {s: torch.cat([run.init[s].reshape(1, B), v[:-1]]) for s, v in run.states.items()}
    zeros = torch.zeros_like(run.x)
    values: dict[str, Any] = {**pvals, **prev, c.checked.inputs[0].name: run.x}
    for i in c.checked.inputs[1:]:
        values[i.name] = zeros
    step = c.step
    if run.seed is not None:
        values.update(_draw_values(step, T, B, run.seed, run.start))
    ssa = evaluate_step(step, values, spike=0.0 if step.spike is not None else None)
    env = {sp.Symbol(k, real=True): v for k, v in ssa.items()}
    run.pre = {s.name: _as_lanes(evaluate_expr(nxt, env), B, T) for s, nxt in zip(step.states, step.next_states)}
    if step.spike is not None:
        run.u = _as_lanes(evaluate_expr(step.spike_u, env), B, T)
    return pvals


def _draw_values(step: StepModel, T: int, B: int, seed: int, start: int = 0) -> dict[str, torch.Tensor]:
    """The draws of a run with `seed` ([T, B] each, lane b the element b): what `m(x, seed=seed)`
    drew `start` steps after a reset."""
    from ..backends.random import draws
    from ..ir.functions import Rand, Randn

    steps = torch.arange(start, start + T, dtype=torch.int64).unsqueeze(1)
    lanes = torch.arange(B, dtype=torch.int64)
    return {y.name: draws(seed, "randn" if isinstance(e, Randn) else "rand", int(e.args[0]), steps, lanes)
            for y, e in step.assignments if isinstance(e, Randn | Rand)}


def _as_lanes(v: Any, B: int, T: int | None = None) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=DTYPE)
    if T is None:
        return t.expand(B).clone() if t.dim() == 0 else t.reshape(B)
    return t.expand(T, B).clone()


def _threshold(c: Compiled, run: Run, params: Mapping[str, float]) -> tuple[str | None, torch.Tensor | None]:
    """The threshold of `spike when A >= B` as a level of one state: `B` itself where `A` is a
    state (exact at every step: A − u), else the state's value where `A − B = 0` when `A − B` is
    linear in it and that value is a constant of the params (e.g. `was_below * (v - v_spike) > 0`
    → v_spike)."""
    rule = c.checked.spike
    states = [s.name for s in c.checked.states]
    if rule is None or run.u is None:
        return None, None
    if isinstance(rule.left, A.Name) and rule.left.id in states:
        s = rule.left.id
        return s, run.pre[s] - run.u
    if isinstance(rule.right, A.Name) and rule.right.id in states:
        s = rule.right.id
        return s, run.pre[s] + run.u
    from ..ir.lower import sym, to_sympy

    names = {d.name for d in [*c.checked.inputs, *c.checked.params, *c.checked.states]}
    env = {n: sym(n) for n in [*names, *c.checked.locals, *c.checked.subexprs]}
    try:
        expr = to_sympy(rule.left, env) - to_sympy(rule.right, env)
    except Exception:  # noqa: BLE001 - a plot without a threshold line is still a plot
        return None, None
    for s in dict.fromkeys(n.id for n in A.names(rule.left)):
        if s not in states:
            continue
        # only where A - B is linear in the state: its root is then s - (A - B) / slope (no solver
        # that could take long on a user's expression)
        sym_s = env[s]
        slope = expr.diff(sym_s)
        if slope == 0 or slope.has(sym_s):
            continue
        root = sym_s - expr / slope
        if {x.name for x in root.free_symbols} <= set(params):
            value = evaluate_expr(root, {sym(k): v for k, v in params.items()})
            if math.isfinite(float(value)):
                return s, torch.full((1, 1), float(value), dtype=DTYPE)
    return None, None


# ----------------------------------------------------------------------------- rates
def firing_rates(run: Run, time: TimeAxis) -> torch.Tensor:
    """The firing rate of each lane while the step is on: 1 / (mean interspike interval), i.e.
    (n - 1) spikes over the time from the first spike to the last; one spike: 1 / the window
    (the least the window can show); none: 0. Not spikes / window, which a short window rounds
    to a staircase of multiples of 1 / window."""
    assert run.spikes is not None
    s = run.spikes[run.onset:] > 0
    steps = s.shape[0]
    idx = torch.arange(steps, dtype=DTYPE).unsqueeze(1).expand_as(s)
    n = s.sum(0).to(DTYPE)
    first = torch.where(s, idx, torch.full_like(idx, math.inf)).min(0).values
    last = torch.where(s, idx, torch.full_like(idx, -math.inf)).max(0).values
    one = time.rate(torch.ones_like(n), steps)  # one spike in the window, as a rate
    span = (last - first).clamp(min=1)
    isi = time.rate(n - 1, 1) / span  # (n - 1) intervals over span steps, in the rate's unit
    return torch.where(n >= 2, isi, torch.where(n == 1, one, torch.zeros_like(n)))


__all__ = ["TimeAxis", "time_axis", "evaluate_step", "evaluate_expr", "simulate", "run_module", "continue_run", "Run",
           "param_defaults", "firing_rates", "DOC_SEED", "DTYPE"]
