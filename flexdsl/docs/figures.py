"""A model's doc figures: simulated once, written as PNG files beside a page (or embedded as
data URIs for a self-contained page), with their captions."""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import FlexDSLError
from . import plots
from .explore import Exploration, explore, nice
from .fi import fi_caption, fi_curve, write_csv
from .simulate import DOC_SEED, DTYPE, Run, TimeAxis, simulate
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
    alone: int = 0  # the spikes of the same window without input (a model that fires on its own)

    @property
    def spec(self) -> str:
        return f"step:{_spec_number(self.amplitude)}@{self.onset}"

    def comment(self) -> str:
        u = f" {self.unit}" if self.unit else ""
        n = f"{self.spikes} spike{'s' if self.spikes != 1 else ''}"
        at = f" ({self.onset_time})" if self.onset_time.startswith("t") else ""
        own = f" (it fires on its own: {self.alone} without input)" if self.alone else ""
        return f"{self.input} = {_g(self.amplitude)}{u} from step {self.onset}{at}{own}: {n}"


def _spec_number(v: float) -> str:
    t = f"{v:.6g}"
    return t if float(t) == v else repr(v)


def _g(v: float) -> str:
    return f"{v:.4g}"


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
        fi = fi_curve(c, ex, ex.lane if cmd is not None else None)
        figs.fi = plots.fi_figure(c, fi, out / f"{stem}.fi.png").name
        figs.fi_data = write_csv(c, fi, out / f"{stem}.fi.csv").name
        figs.fi_caption = fi_caption(c, fi)
        if c.checked.stochastic and cmd is not None:
            figs.fi_caption += (f" The circle marks the step response's amplitude; the one trial shown above has "
                                f"{cmd.spikes} spike{'s' if cmd.spikes != 1 else ''}.")
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
    """The step response to show (a lane of the f–I grid: a round amplitude; a noisy model's
    simulated alone, so that the command repeats its draws) and the command that reproduces it."""
    run = ex.run
    assert run is not None
    inp = c.checked.inputs[0]
    if not ex.spiking or ex.rheobase is None:
        return run, ex.lane, None
    amp = float(run.amplitudes[ex.lane])
    shown, lane = run, ex.lane
    if c.checked.stochastic:
        shown, lane = simulate(c, torch.tensor([amp], dtype=DTYPE), run.T, run.onset, run.params), 0
    assert shown.spikes is not None
    n = int(shown.spikes[:, lane].sum())
    if n < 1:
        return shown, lane, None
    zero = [k for k, a in enumerate(run.amplitudes.tolist()) if a == 0]  # (the grid's no-input lane)
    alone = int(run.spikes[:, zero[0]].sum()) if zero and run.spikes is not None else 0
    return shown, lane, RunCommand(run.T, amp, run.onset, inp.name, unit_label(inp), n,
                                   _onset_text(ex.time, run.onset), alone)


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


__all__ = ["Figures", "RunCommand", "make_figures", "fi_caption", "nice"]
