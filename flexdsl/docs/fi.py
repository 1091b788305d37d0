"""A page's f–I curve: the rate at each plotted amplitude (`FICurve`), and the caption and the data
file (CSV) made from the same numbers, so that the plot, its caption and its data say the same.

The rate is the firing rate while the step is on, in the window from the step's onset: 1 / the mean
interval between the spikes; a single spike: 1 / the window (the least a window can show); none: 0.
A noisy model is simulated `TRIALS` times at every amplitude (independent draws: trial k of
amplitude a is lane a * TRIALS + k of one call with the docs' seed); its curve is the mean over the
trials, with their spread (± one standard deviation) as a band. The caption's threshold is the
smallest plotted amplitude whose (mean) rate is not 0, and what it says about spikes after the
window comes from the lanes run on past it (`Exploration.later`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .explore import Exploration
from .simulate import DOC_SEED, DTYPE, Run, TimeAxis, continue_run, firing_rates, simulate
from .units import unit_label

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled

TRIALS = 16  # a noisy model's trials per amplitude


@dataclass
class FICurve:
    amplitudes: torch.Tensor  # [A]
    rates: torch.Tensor  # [A, N]: each trial's rate in the window (NaN: the states are not finite)
    counts: torch.Tensor  # [A, N]: spikes in the window
    first: torch.Tensor  # [A, N]: steps from the onset to the first spike, window and continuation (inf: none)
    time: TimeAxis
    window: int  # steps from the onset to the end of the window
    longer: int  # steps from the onset to the end of the continuation (the window's: none)
    seed: int | None = None  # a noisy model's seed
    shorter: int | None = None  # the first window, where it was extended
    marked: int | None = None  # the amplitude of the step response shown (its index)

    @property
    def trials(self) -> int:
        return self.rates.shape[1]

    @property
    def finite(self) -> torch.Tensor:
        return torch.isfinite(self.rates).all(1)

    @property
    def mean(self) -> torch.Tensor:
        """The rate at each amplitude (over the trials), NaN where a trial is not finite."""
        return self.rates.mean(1)

    @property
    def spread(self) -> torch.Tensor:
        """The trials' standard deviation at each amplitude (0 with one trial)."""
        return self.rates.std(1, correction=0)

    def threshold(self) -> int | None:
        """The index of the smallest plotted amplitude with a (mean) rate above 0."""
        on = torch.nonzero(self.finite & (self.mean > 0)).flatten()
        return int(on[0]) if len(on) else None

    def duration(self, steps: int) -> str:
        t = self.time
        return f"{_g(steps * t.dt)} {t.unit}" if t.unit and t.dt else f"{steps} steps"


def _g(v: float) -> str:
    return f"{v:.4g}"


def _first_spikes(run: Run, later: Run | None) -> torch.Tensor:
    """Steps from the onset to each lane's first spike, in the window or after it (inf: none)."""
    assert run.spikes is not None
    s = run.spikes[run.onset:]
    if later is not None and later.spikes is not None:
        s = torch.cat([s, later.spikes])
    idx = torch.arange(1, s.shape[0] + 1, dtype=DTYPE).unsqueeze(1).expand_as(s)  # (a spike at the end of its step)
    return torch.where(s > 0, idx, torch.full_like(idx, math.inf)).min(0).values


def fi_curve(c: Compiled, ex: Exploration, marked: int | None = None) -> FICurve:
    """The f–I numbers of an exploration (`marked`: the lane of the step response shown): its own
    lanes, or for a noisy model `TRIALS` of them per amplitude over the same window, run on as long."""
    run, later = ex.run, ex.later
    assert run is not None and run.spikes is not None
    amps = run.amplitudes
    A = amps.numel()
    seed = None
    if c.checked.stochastic:
        seed = DOC_SEED
        run = simulate(c, amps.repeat_interleave(TRIALS), run.T, run.onset, run.params, detail=False)
        later = continue_run(run, ex.later.T) if ex.later is not None else None
    n = run.amplitudes.numel() // A
    rates = torch.where(run.finite(), firing_rates(run, ex.time), torch.full((run.amplitudes.numel(),), math.nan,
                                                                              dtype=DTYPE))
    return FICurve(amps, rates.reshape(A, n),
                   run.counts().reshape(A, n), _first_spikes(run, later).reshape(A, n), ex.time, ex.window,
                   ex.window + (later.T if later is not None else 0), seed, ex.shorter, marked)


# ----------------------------------------------------------------------------- the caption
def fi_caption(c: Compiled, f: FICurve) -> str:
    """What the f–I plot shows, every number read from `f` (what the plot draws)."""
    inp = c.checked.inputs[0]
    unit = unit_label(inp)
    u = f" {unit}" if unit else ""
    amps = f.amplitudes
    cap = (f"Firing rate while a step input of {inp.name} is on, against the step's amplitude ({amps.numel()} "
           f"amplitudes from 0 to {_g(float(amps[-1]))}{u}), in a window of {f.duration(f.window)} from the step's "
           "onset: 1 / the mean interval between its spikes (a single spike: 1 / the window). ")
    if f.trials > 1:
        cap += (f"The model is noisy: each point is the mean over {f.trials} trials (independent noise, seed "
                f"{f.seed}), the band \u00b1 one standard deviation across the trials. ")
    if f.shorter is not None:
        cap += (f"The window is {f.duration(f.window)} long because in a window of {f.duration(f.shorter)}, "
                "amplitudes whose first spike comes later looked silent. ")
    return (cap + _threshold_text(f, u) + _later_text(f, u)).strip()


def _threshold_text(f: FICurve, u: str) -> str:
    mean, amps = f.mean, f.amplitudes
    k = f.threshold()
    some = "where a trial spikes" if f.trials > 1 else "with a spike"
    if k is None:
        return "No plotted amplitude gives a spike in the window. "
    if k == 0:
        return f"It fires without input (rate {_g(float(mean[0]))} at amplitude 0). "
    out = f"It fires from {_g(float(amps[k]))}{u} on (the smallest plotted amplitude {some} in the window"
    below = float(amps[k - 1])
    if below != 0 and bool(f.finite[k - 1]):
        out += f"; {_g(below)}{u} gives none"
    out += "). "
    gaps = [float(a) for a, m, ok in zip(amps[k:], mean[k:], f.finite[k:]) if ok and float(m) == 0]
    if gaps:
        out += f"Above it, {_list(gaps, u)} give{'s' if len(gaps) == 1 else ''} no spike in the window either. "
    bad = [float(a) for a, ok in zip(amps, f.finite) if not ok]
    if bad:
        out += f"At {_list(bad, u)} the states are not finite (marked \u00d7). "
    return out


def _later_text(f: FICurve, u: str) -> str:
    """What the continuation past the window says of the amplitudes silent in it."""
    k = f.threshold()
    if k is None or k == 0 or f.longer <= f.window:
        return ""
    times = f"{f.duration(f.longer)} after the onset ({f.longer / f.window:.3g} times the window)"
    R = f"{_g(float(f.amplitudes[k]))}{u}"
    silent = ((f.counts == 0).all(1) & f.finite)[:k]
    late = [(float(a), float(t.min())) for a, t, s in zip(f.amplitudes[:k], f.first[:k], silent)
            if s and bool(torch.isfinite(t).any())]
    if not late:
        trials = f" in any of the {f.trials} trials" if f.trials > 1 else ""
        return f"Simulated on to {times}, the amplitudes below {R} still give no spike{trials}."
    a0, t0 = min(late, key=lambda p: abs(p[0]))
    trial = "a trial at " if f.trials > 1 else ""
    return (f"Simulated on to {times}, {trial}{_g(a0)}{u} gives a first spike {f.duration(int(t0))} after the onset, "
            f"outside the window: the curve does not show spikes that come later than the window, and the "
            f"model fires below {R} too.")


def _list(values: list[float], u: str, most: int = 3) -> str:
    shown = [f"{_g(v)}{u}" for v in values[:most]]
    more = f" and {len(values) - most} more" if len(values) > most else ""
    return ", ".join(shown) + more


# ----------------------------------------------------------------------------- the data file
def write_csv(c: Compiled, f: FICurve, path: Path) -> Path:
    """The numbers behind the f–I plot, as CSV: the amplitude, the spikes in the window, the rate
    (for a noisy model: their means over the trials, and the rate's standard deviation), and the first
    spike's time after the onset, in the window or the continuation (empty: none)."""
    inp = c.checked.inputs[0]
    unit = unit_label(inp)
    head = f"amplitude of {inp.name}" + (f" ({unit})" if unit else "")
    t = f.time
    tunit = t.unit if t.unit and t.dt else "steps"
    cols = [head, "spikes" if f.trials == 1 else f"spikes (mean of {f.trials} trials)",
            t.rate_label if f.trials == 1 else f"{t.rate_label} (mean of {f.trials} trials)"]
    if f.trials > 1:
        cols.append(f"{t.rate_label} standard deviation")
    cols.append(f"first spike ({tunit} after the onset{', earliest trial' if f.trials > 1 else ''}; "
                f"run to {f.duration(f.longer)})")
    lines = [",".join(cols)]
    for i, a in enumerate(f.amplitudes.tolist()):
        first = float(f.first[i].min())
        row = [repr(a), str(int(f.counts[i, 0])) if f.trials == 1 else repr(float(f.counts[i].mean())),
               repr(float(f.mean[i]))]
        if f.trials > 1:
            row.append(repr(float(f.spread[i])))
        row.append(repr(first * t.dt if t.unit and t.dt else first) if math.isfinite(first) else "")
        lines.append(",".join(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


__all__ = ["FICurve", "TRIALS", "fi_curve", "fi_caption", "write_csv"]
