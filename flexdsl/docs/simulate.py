"""The numbers behind the doc plots: a model simulated on the torch backend in float64.

- `time_axis(c)`: steps, or time in the unit of `dt` where the model declares `dt` with a time
  unit (from the declaration's unit, else from its description, e.g. "integration step (ms)").
- `evaluate_step(step, values)`: the discretized step's SSA assignments evaluated on tensors
  by the host evaluator (`ir/host.py`, the catalog's numeric forms: nothing is `eval`-ed).
  With the spike forced to 0 the step's new states are the values *before* the reset, and the
  spike rule's `u` is the quantity that fires at 0: the plots draw the threshold crossing and
  the threshold itself (`B` in `spike when A >= B`) from them.
- `explore(c)`: step inputs of increasing amplitude; the f–I curve (mean rate during the step
  against amplitude) and the lane shown as the step response.
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
        t = torch.arange(n, dtype=DTYPE) + 1  # the value after step k is at the end of the step
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
             params: Mapping[str, float] | None = None) -> Run:
    """Step inputs (0 before `onset`, then each amplitude) on the first input, the others 0."""
    from ..runtime.module import NeuronModule

    m = NeuronModule(c, dict(params or {}), "m", "torch", store_state_seqs=True)
    x = torch.zeros(T, amplitudes.numel(), dtype=DTYPE)
    x[onset:] = amplitudes.to(DTYPE)
    return run_module(m, x, params, amplitudes=amplitudes, onset=onset)


def run_module(m: Any, x: torch.Tensor, params: Mapping[str, float] | None = None, *,
               amplitudes: torch.Tensor | None = None, onset: int = 0, seed: int | None = None) -> Run:
    """Run a loaded model (a `NeuronModule`, any backend; float64 on the torch backend is what
    the docs use) on `x` ([T, B]) fed to its first input, the other inputs 0; the states, the
    spikes, and the values before the reset with the threshold. A noisy model draws from `seed`
    (default `DOC_SEED`)."""
    c = m.compiled
    m = m.to(DTYPE)
    m.store_state_seqs = True
    m.reset()
    T, B = x.shape
    zeros = torch.zeros_like(x)
    inputs = [x] + [zeros] * (len(c.checked.inputs) - 1)
    init = {s: _as_lanes(v, B) for s, v in m._initial_values().items()}
    noisy = c.checked.stochastic  # (a fixed seed: the pages show the same noise at every build)
    seed = DOC_SEED if seed is None else seed
    with torch.no_grad():
        out = m(*inputs, seed=seed) if noisy else m(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    outputs = {n: o.to(DTYPE) for (n, _), o in zip(c.checked.outputs, outs)}
    states = {s: m.state_seqs[s].to(DTYPE) for s in m._state_names}
    # the step once more, for all steps at once, with the spike forced to 0: the pre-reset values
    pvals = param_defaults(c, params)
    declared = [pvals[p.name] for p in c.checked.params]
    pvals.update(zip(c.derived_names, c.with_derived(declared)[len(declared):]))  # e.g. exact propagators
    prev = {s: torch.cat([init[s].reshape(1, B), states[s][:-1]]) for s in states}
    values: dict[str, Any] = {**pvals, **prev, c.checked.inputs[0].name: x}
    for i in c.checked.inputs[1:]:
        values[i.name] = zeros
    step = c.step
    if noisy:
        values.update(_draw_values(step, T, B, seed))
    ssa = evaluate_step(step, values, spike=0.0 if step.spike is not None else None)
    env = {sp.Symbol(k, real=True): v for k, v in ssa.items()}
    pre = {s.name: _as_lanes(evaluate_expr(nxt, env), B, T) for s, nxt in zip(step.states, step.next_states)}
    u = spikes = None
    if step.spike is not None:
        u = _as_lanes(evaluate_expr(step.spike_u, env), B, T)
        if "spike" in outputs:
            spikes = outputs["spike"]
        else:
            spikes = (u >= 0 if c.checked.spike.op == ">=" else u > 0).to(DTYPE)
    amps = amplitudes if amplitudes is not None else x[-1] if T else torch.zeros(B, dtype=DTYPE)
    run = Run(amps, x, onset, states, pre, spikes, u, init=init, outputs=outputs)
    if step.spike is not None:
        run.threshold_state, run.threshold = _threshold(c, run, pvals)
    return run


def _draw_values(step: StepModel, T: int, B: int, seed: int) -> dict[str, torch.Tensor]:
    """The draws of a run with `seed` ([T, B] each, lane b the element b): what `m(x, seed=seed)`
    drew after a reset."""
    from ..backends.torch.random import draws
    from ..ir.functions import Rand, Randn

    steps, lanes = torch.arange(T, dtype=torch.int64).unsqueeze(1), torch.arange(B, dtype=torch.int64)
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


# ----------------------------------------------------------------------------- choosing the input
SCAN = torch.logspace(-3, 4, 29, dtype=DTYPE)  # amplitudes tried to find where a model fires


@dataclass
class Exploration:
    time: TimeAxis
    run: Run | None  # the f–I lanes (or one lane for a non-spiking model)
    lane: int  # the lane shown as the step response
    rheobase: float | None  # the smallest amplitude that fires within the window (refined by bisection)
    note: str = ""
    silent: float | None = None  # the largest amplitude found not to fire (the rheobase lies above it)

    @property
    def spiking(self) -> bool:
        return self.run is not None and self.run.spikes is not None

    def rates(self) -> torch.Tensor:
        """Each lane's firing rate (see `firing_rates`), NaN where the states are not finite."""
        assert self.run is not None
        r = firing_rates(self.run, self.time)
        return torch.where(self.run.finite(), r, torch.full_like(r, float("nan")))


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


def duration(time: TimeAxis) -> int:
    """Steps simulated: 200, or about 100 ms of model time (at most 3000 steps)."""
    if time.seconds and time.dt:
        return int(min(max(round(0.1 / (time.dt * time.seconds)), 200), 3000))
    return 200


def _fires(run: Run) -> torch.Tensor:
    """Which lanes fire because of the input: more spikes than lane 0 (no input) had."""
    counts, finite = run.counts(), run.finite()
    base = float(counts[0]) if bool(finite[0]) else 0.0  # a model may fire without input
    return (counts >= base + max(1.0, 0.5 * base)) & finite


def explore(c: Compiled, T: int | None = None, params: Mapping[str, float] | None = None) -> Exploration:
    """Find where the model fires: a scan of step amplitudes over ±1e-3 … 1e4 (the first spikes
    tell: a short window), then the rheobase by bisection on the full window between the last
    silent and the first firing amplitude; then an f–I grid from 0 to 3 times the rheobase that
    holds the rheobase itself."""
    time = time_axis(c, params)
    T = T or duration(time)
    onset = max(T // 10, 1)
    if c.checked.spike is None:
        run = simulate(c, torch.tensor([1.0], dtype=DTYPE), T, onset, params)
        return Exploration(time, run, 0, None, "non-spiking: the response to a unit step")
    lo = hi = None
    t_scan = min(T, onset + max((T - onset) // 4, 50))
    for sign in (1.0, -1.0):
        amps = torch.cat([torch.zeros(1, dtype=DTYPE), sign * SCAN])
        fired = _fires(simulate(c, amps, t_scan, onset, params))
        if bool(fired.any()):
            k = int(torch.nonzero(fired)[0])
            lo, hi = float(amps[k - 1]), float(amps[k])
            break
    if hi is None:
        run = simulate(c, torch.tensor([1.0], dtype=DTYPE), T, onset, params)
        return Exploration(time, run, 0, None, "no spike for step inputs from \u00b10.001 to \u00b110000")
    lo, hi = _bisect(c, lo, hi, T, onset, params)
    grid = torch.cat([torch.linspace(0.0, 3.0 * hi, 25, dtype=DTYPE), torch.tensor([lo, hi], dtype=DTYPE)])
    grid = grid[torch.argsort(grid.abs())].unique_consecutive()
    run = simulate(c, grid, T, onset, params)
    fired = _fires(run)
    firing = torch.nonzero(fired).flatten()
    rheo = float(grid[int(firing[0])]) if len(firing) else None
    counts = torch.where(run.finite(), run.counts(), torch.full_like(run.counts(), -1.0))
    top = float(counts.max())
    # the step response: a lane with a fair number of spikes (about one per 10 steps at most)
    want = min(0.1 * (T - onset), max(0.5 * top, min(3.0, top)))
    lane = int(torch.nonzero(counts >= want)[0]) if top > 0 else len(grid) - 1
    silent = [float(a) for a, f in zip(grid, fired) if not f and (rheo is None or abs(float(a)) < abs(rheo))]
    return Exploration(time, run, lane, rheo, silent=silent[-1] if silent else None)


def _bisect(c: Compiled, lo: float, hi: float, T: int, onset: int, params: Mapping[str, float] | None,
            rounds: int = 1, lanes: int = 24) -> tuple[float, float]:
    """Narrow (lo silent, hi firing) on the full window: each round simulates `lanes` amplitudes
    between them at once (one round: to 1/25 of the scan's interval, a factor 1.78)."""
    for _ in range(rounds):
        amps = torch.linspace(lo, hi, lanes + 2, dtype=DTYPE)[1:-1]
        fired = _fires(simulate(c, torch.cat([torch.zeros(1, dtype=DTYPE), amps]), T, onset, params))[1:]
        if not bool(fired.any()):
            break  # (the scan's firing amplitude fired on the short window; on the full one as well)
        k = int(torch.nonzero(fired)[0])
        hi = float(amps[k])
        lo = float(amps[k - 1]) if k > 0 else lo
    return lo, hi


__all__ = ["TimeAxis", "time_axis", "evaluate_step", "evaluate_expr", "simulate", "run_module", "explore", "Exploration", "Run",
           "param_defaults", "duration", "firing_rates"]
