"""Where a model fires, and over how long a window: the step amplitudes of a page's f–I curve.

`explore(c)`: a scan of step amplitudes over ±1e-3 … 1e4 (on a short window: the first spikes
tell), the threshold by bisection on the full window between the last silent and the first firing
amplitude, then a grid of round amplitudes from 0 to about 3 times it (with the two that bracket the
threshold), and the lane shown as the step response (one of the round amplitudes, so that the
`flexdsl run` command of the page repeats it exactly and the f–I plot has it as a point).

The window is `duration(time)` steps to begin with. The grid's lanes are then run on
(`continue_run`) to `LONGER` times the window (at most `MAX_EXTRA` steps more): where a lane that
was silent in the window fires in that continuation, the window was too short for the model (a
first spike that comes late: an integrator, a slow adaptation current, a saddle-node), and the
exploration is done once more with the continued window as the window, then continued again. The
last continuation is kept (`Exploration.later`): what a caption says about the spikes the window
cannot show comes from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .simulate import DTYPE, Run, TimeAxis, continue_run, firing_rates, simulate, time_axis

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled

SCAN = torch.logspace(-3, 4, 29, dtype=DTYPE)  # amplitudes tried to find where a model fires
POINTS = 25  # about this many round amplitudes in the grid
LONGER = 4  # the continuation: the window this many times as long ...
MAX_EXTRA = 3000  # ... but at most this many steps more (a step costs the same in a long run: Hodgkin-Huxley)


@dataclass
class Exploration:
    time: TimeAxis
    run: Run | None  # the f–I lanes (or one lane for a non-spiking model)
    lane: int  # the lane shown as the step response
    rheobase: float | None  # the smallest amplitude that fires within the window (refined by bisection)
    note: str = ""
    silent: float | None = None  # the largest amplitude found not to fire (the rheobase lies above it)
    later: Run | None = None  # the f–I lanes run on after the window (the same step input)
    shorter: int | None = None  # the first window (steps after the onset) where it was extended

    @property
    def spiking(self) -> bool:
        return self.run is not None and self.run.spikes is not None

    @property
    def window(self) -> int:
        """Steps from the onset of the step to the end of the window."""
        assert self.run is not None
        return self.run.T - self.run.onset

    def rates(self) -> torch.Tensor:
        """Each lane's firing rate (see `firing_rates`), NaN where the states are not finite."""
        assert self.run is not None
        r = firing_rates(self.run, self.time)
        return torch.where(self.run.finite(), r, torch.full_like(r, float("nan")))


def duration(time: TimeAxis) -> int:
    """Steps simulated: 200, or about 100 ms of model time (at most 3000 steps)."""
    if time.seconds and time.dt:
        return int(min(max(round(0.1 / (time.dt * time.seconds)), 200), 3000))
    return 200


def nice(v: float) -> float:
    """`v` rounded away from zero to two significant digits (1743.2 -> 1800)."""
    if v == 0 or not math.isfinite(v):
        return v
    e = math.floor(math.log10(abs(v))) - 1
    return math.copysign(float(f"{math.ceil(round(abs(v) / 10**e, 9))}e{e}"), v)


def round_step(span: float, points: int = POINTS) -> float:
    """The step of 1, 2, 2.5 or 5 times a power of ten nearest (in ratio) to `span / (points - 1)`."""
    target = abs(span) / (points - 1)
    e = math.floor(math.log10(target))
    steps = [m * 10.0**k for k in (e - 1, e, e + 1) for m in (1.0, 2.0, 2.5, 5.0)]
    return math.copysign(min(steps, key=lambda s: abs(math.log(s / target))), span)


def grid(lo: float, hi: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Round amplitudes from 0 in steps of `round_step` up to at least 3 * `hi` (about `POINTS`
    of them), with `lo` and `hi` (silent and firing, the threshold between them); and which of
    them are the round ones."""
    step = round_step(3.0 * hi)
    n = math.ceil(round(3.0 * hi / step, 9))
    regular = {float(f"{k * step:.12g}") + 0.0 for k in range(n + 1)}  # (+ 0.0: no -0.0)
    amps = sorted(regular | {lo, hi}, key=abs)
    return torch.tensor(amps, dtype=DTYPE), torch.tensor([a in regular for a in amps])


def _fires(run: Run) -> torch.Tensor:
    """Which lanes fire because of the input: more spikes than lane 0 (no input) had."""
    counts, finite = run.counts(), run.finite()
    base = float(counts[0]) if bool(finite[0]) else 0.0  # a model may fire without input
    return (counts >= base + max(1.0, 0.5 * base)) & finite


def fires_later(run: Run, later: Run) -> torch.Tensor:
    """Lanes without a spike in the window that spike in its continuation."""
    assert run.spikes is not None and later.spikes is not None
    return (run.counts() == 0) & (later.spikes.sum(0) > 0) & later.finite()


def extra_steps(run: Run) -> int:
    window = run.T - run.onset
    return min((LONGER - 1) * window, MAX_EXTRA)


def explore(c: Compiled, T: int | None = None, params: Mapping[str, float] | None = None) -> Exploration:
    """Find where the model fires and over how long a window (see the module doc); `T`: the
    window (steps, the onset at a tenth of it) to begin with."""
    time = time_axis(c, params)
    T = T or duration(time)
    onset = max(T // 10, 1)
    ex = _explore_at(c, time, T, onset, params)
    if ex.rheobase is None or ex.run is None:
        return ex
    ex.later = continue_run(ex.run, extra_steps(ex.run))
    if bool(fires_later(ex.run, ex.later).any()):  # the window was too short for the model
        longer = ex.run.T + ex.later.T
        again = _explore_at(c, time, longer, onset, params)
        if again.rheobase is not None and again.run is not None:
            again.later = continue_run(again.run, extra_steps(again.run))
            again.shorter = ex.window
            return again
    return ex


def _scan(c: Compiled, T: int, onset: int, params: Mapping[str, float] | None) -> tuple[float, float] | None:
    """(silent, firing): neighbours of the scan, positive amplitudes first, on a short window."""
    t_scan = min(T, onset + max((T - onset) // 4, 50))
    for sign in (1.0, -1.0):
        amps = torch.cat([torch.zeros(1, dtype=DTYPE), sign * SCAN])
        fired = _fires(simulate(c, amps, t_scan, onset, params))
        if bool(fired.any()):
            k = int(torch.nonzero(fired)[0])
            return float(amps[k - 1]), float(amps[k])
    return None


def _explore_at(c: Compiled, time: TimeAxis, T: int, onset: int,
                params: Mapping[str, float] | None) -> Exploration:
    """The scan, the bisection and the grid on a window of `T` steps (the step from `onset`)."""
    if c.checked.spike is None:
        run = simulate(c, torch.tensor([1.0], dtype=DTYPE), T, onset, params)
        return Exploration(time, run, 0, None, "non-spiking: the response to a unit step")
    found = _scan(c, T, onset, params)
    if found is None:
        run = simulate(c, torch.tensor([1.0], dtype=DTYPE), T, onset, params)
        return Exploration(time, run, 0, None, "no spike for step inputs from \u00b10.001 to \u00b110000")
    lo, hi = _bisect(c, *found, T, onset, params)
    amps, regular = grid(lo, hi)
    run = simulate(c, amps, T, onset, params)
    fired = _fires(run)
    firing = torch.nonzero(fired).flatten()
    rheo = float(amps[int(firing[0])]) if len(firing) else None
    counts = torch.where(run.finite(), run.counts(), torch.full_like(run.counts(), -1.0))
    top = float(counts.max())
    # the step response: a round amplitude with a fair number of spikes (about one per 10 steps at most)
    want = min(0.1 * (T - onset), max(0.5 * top, min(3.0, top)))
    # (a lane the input makes fire: a model that fires on its own fires at amplitude 0 as well)
    fair = (counts >= want) & (fired if bool(fired.any()) else torch.ones_like(fired))
    pick = torch.nonzero(fair & regular).flatten()
    if top <= 0 or not bool(fair.any()):
        lane = len(amps) - 1
    else:
        lane = int(pick[0]) if len(pick) else int(torch.nonzero(fair)[0])
    silent = [float(a) for a, f in zip(amps, fired) if not f and (rheo is None or abs(float(a)) < abs(rheo))]
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


__all__ = ["SCAN", "LONGER", "MAX_EXTRA", "Exploration", "duration", "explore", "grid", "nice", "fires_later",
           "extra_steps", "round_step"]
