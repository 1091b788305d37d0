"""A model's doc figures: simulated once, written as PNG files beside a page (or embedded as
data URIs for a self-contained page), with their captions."""

from __future__ import annotations

import base64
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import FlexDSLError
from . import plots
from .simulate import DOC_SEED, DTYPE, Exploration, Run, TimeAxis, explore, firing_rates, simulate
from .units import unit_label

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled


@dataclass
class Figures:
    """Image sources (file names relative to the page, or data URIs) and captions."""

    response: str | None = None
    fi: str | None = None
    surrogate: str | None = None
    thumbnail: str | None = None
    fi_data: str | None = None  # the f–I numbers as CSV (a file beside the page)
    response_caption: str = ""
    fi_caption: str = ""
    surrogate_caption: str = ""
    note: str = ""  # why there are no plots, where there are none
    run: RunCommand | None = None  # the step response as a `flexdsl run` command

    def files(self) -> list[str]:
        return [s for s in (self.response, self.fi, self.surrogate, self.thumbnail, self.fi_data)
                if s is not None and not s.startswith("data:")]


@dataclass
class RunCommand:
    """`flexdsl run` arguments that reproduce the step response shown (it spikes)."""

    T: int
    amplitude: float
    onset: int
    input: str
    unit: str | None
    spikes: int
    onset_time: str  # "t = 10 ms" or "step 20"

    @property
    def spec(self) -> str:
        return f"step:{_spec_number(self.amplitude)}@{self.onset}"

    def comment(self) -> str:
        u = f" {self.unit}" if self.unit else ""
        n = f"{self.spikes} spike{'s' if self.spikes != 1 else ''}"
        at = f" ({self.onset_time})" if self.onset_time.startswith("t") else ""
        return f"{self.input} = {_g(self.amplitude)}{u} from step {self.onset}{at}: {n}"


def _spec_number(v: float) -> str:
    t = f"{v:.6g}"
    return t if float(t) == v else repr(v)


def _g(v: float) -> str:
    return f"{v:.4g}"


def nice(v: float) -> float:
    """`v` rounded away from zero to two significant digits (1743.2 -> 1800)."""
    if v == 0 or not math.isfinite(v):
        return v
    e = math.floor(math.log10(abs(v))) - 1
    return math.copysign(float(f"{math.ceil(round(abs(v) / 10**e, 9))}e{e}"), v)


def make_figures(c: Compiled, stem: str, outdir: str | Path | None = None) -> Figures:
    """Simulate the model (torch backend, float64) and draw its figures as `<stem>.<kind>.png` in
    `outdir`; without `outdir` the images are embedded in the sources as data URIs. A model that
    cannot be simulated with its defaults gets a page without plots that says why."""
    try:
        return _make_figures(c, stem, outdir)
    except FlexDSLError as e:
        return Figures(note=f"No plots: the model cannot run with its default params. {e.reason}")
    except (ArithmeticError, RuntimeError, TypeError, ValueError) as e:
        return Figures(note=f"No plots: simulating the model failed ({type(e).__name__}: {e}).")


def _make_figures(c: Compiled, stem: str, outdir: str | Path | None = None) -> Figures:
    if outdir is None:
        with tempfile.TemporaryDirectory(prefix="flexdsl-doc-") as tmp:
            figs = _make_figures(c, stem, tmp)
            for name in ("response", "fi", "surrogate", "thumbnail", "fi_data"):
                src = getattr(figs, name)
                if src is not None:
                    data = base64.b64encode((Path(tmp) / src).read_bytes()).decode("ascii")
                    mime = "text/csv" if src.endswith(".csv") else "image/png"
                    setattr(figs, name, f"data:{mime};base64," + data)
            return figs
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)  # (a folder that is not there yet: made, as `flexdsl doc -o` does)
    figs = Figures()
    ex = explore(c)
    run = ex.run
    assert run is not None
    lane_run, lane, cmd = _response(c, ex)
    figs.run = cmd
    figs.response = plots.response_figure(c, lane_run, lane, ex.time, out / f"{stem}.response.png").name
    figs.response_caption = _response_caption(c, ex, lane_run, lane)
    if ex.spiking and ex.rheobase is not None:
        marked = None
        if cmd is not None:
            marked = (cmd.amplitude, float(firing_rates(lane_run, ex.time)[lane]))
        figs.fi = plots.fi_figure(c, ex, out / f"{stem}.fi.png", marked).name
        figs.fi_data = _write_fi_data(c, ex, out / f"{stem}.fi.csv").name
        figs.fi_caption = fi_caption(c, ex)
    if c.step.surrogate is not None:
        from .content import surrogate_call

        figs.surrogate = plots.surrogate_figure(c, out / f"{stem}.surrogate.png", surrogate_call(c)).name
        figs.surrogate_caption = ("Forward, the spike is the step (dashed); backward, d spike / d u is the "
                                  "surrogate S\u2032(u) (right), the slope of the smooth step S (left).")
    figs.thumbnail = plots.thumbnail(c, ex, out / f"{stem}.thumb.png").name
    return figs


def _onset_text(t: TimeAxis, onset: int) -> str:
    return f"t = {_g(onset * t.dt)} {t.unit}" if t.unit and t.dt else f"step {onset}"


def _response(c: Compiled, ex: Exploration) -> tuple[Run, int, RunCommand | None]:
    """The step response to show, and the command that reproduces it: the chosen lane's
    amplitude rounded to two digits (simulated again; the lane itself if that does not spike)."""
    run = ex.run
    assert run is not None
    inp = c.checked.inputs[0]
    if not ex.spiking or ex.rheobase is None:
        return run, ex.lane, None
    amp = float(run.amplitudes[ex.lane])
    shown, lane = run, ex.lane
    rounded = nice(amp)
    if rounded != amp:
        again = simulate(c, torch.tensor([rounded], dtype=DTYPE), run.T, run.onset)
        if again.spikes is not None and float(again.spikes[:, 0].sum()) >= 1 and bool(again.finite()[0]):
            shown, lane, amp = again, 0, rounded
    assert shown.spikes is not None
    n = int(shown.spikes[:, lane].sum())
    if n < 1:
        return shown, lane, None
    return shown, lane, RunCommand(run.T, amp, run.onset, inp.name, unit_label(inp), n,
                                   _onset_text(ex.time, run.onset))


def _response_caption(c: Compiled, ex: Exploration, run: Run, lane: int) -> str:
    ck = c.checked
    inp = ck.inputs[0]
    unit = unit_label(inp)
    t = ex.time
    amp = float(run.amplitudes[lane])
    others = ", the other inputs 0" if len(ck.inputs) > 1 else ""
    cap = (f"Response to a step input: {inp.name} = {_g(amp)}{' ' + unit if unit else ''} from "
           f"{_onset_text(t, run.onset)}{others}; {run.T} steps simulated in float64 (torch backend)")
    if t.unit:
        cap += f", dt = {_g(t.dt or 0)} {t.unit}"
    if ck.stochastic:
        cap += f"; one sample of the noise (seed={DOC_SEED})"
    cap += ". "
    if run.spikes is not None:
        n = int(run.spikes[:, lane].sum())
        cap += f"{n} spike{'s' if n != 1 else ''}. "
    if run.threshold_state is not None:
        cap += (f"At each spike, {run.threshold_state} is drawn through its value before the reset (where it "
                f"crossed the threshold, dashed) down to its reset value. ")
    if ex.note:
        cap += ex.note[0].upper() + ex.note[1:] + ". "
    if not bool(run.finite()[lane]):
        cap += "The states are not finite (NaN or inf) with these params and this input."
    return cap.strip()


def fi_caption(c: Compiled, ex: Exploration) -> str:
    """What the f–I plot shows, its numbers read from the same rates the plot draws."""
    run = ex.run
    assert run is not None and ex.rheobase is not None
    inp = c.checked.inputs[0]
    u = f" {unit_label(inp)}" if unit_label(inp) else ""
    rates = ex.rates()
    amps = run.amplitudes
    steps = run.T - run.onset
    window = f"{_g(steps * ex.time.dt)} {ex.time.unit}" if ex.time.unit and ex.time.dt else f"{steps} steps"
    cap = (f"Firing rate while a step input of {inp.name} is on (1 / the mean interval between its spikes in a "
           f"window of {window}; a single spike: 1 / the window), against the step's amplitude: {amps.numel()} "
           f"amplitudes from 0 to {_g(float(amps[-1]))}{u}. ")
    if float(rates[0]) > 0:
        return cap + f"The model fires without input (rate {_g(float(rates[0]))} at amplitude 0)."
    cap += f"It fires from {_g(ex.rheobase)}{u} on (the smallest amplitude plotted with a spike"
    if ex.silent is not None and ex.silent != 0:
        cap += f"; {_g(ex.silent)}{u} gives none"
    return cap + "); below it the rate is 0."


def _write_fi_data(c: Compiled, ex: Exploration, path: Path) -> Path:
    """The numbers behind the f–I plot, as CSV."""
    run = ex.run
    assert run is not None
    inp = c.checked.inputs[0]
    unit = unit_label(inp)
    head = f"amplitude of {inp.name}" + (f" ({unit})" if unit else "")
    rate_head = ex.time.rate_label
    counts = run.counts()
    lines = [f"{head},spikes,{rate_head}"]
    for a, n, r in zip(run.amplitudes.tolist(), counts.tolist(), ex.rates().tolist()):
        lines.append(f"{a!r},{int(n)},{r!r}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


__all__ = ["Figures", "RunCommand", "make_figures", "fi_caption", "nice"]
