"""A model's doc figures: simulated once, written as PNG files beside a page (or embedded as
data URIs for a self-contained page), with their captions."""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import FlexDSLError
from . import plots
from .simulate import explore
from .units import unit_of

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled


@dataclass
class Figures:
    """Image sources (file names relative to the page, or data URIs) and captions."""

    response: str | None = None
    fi: str | None = None
    surrogate: str | None = None
    thumbnail: str | None = None
    response_caption: str = ""
    fi_caption: str = ""
    surrogate_caption: str = ""
    note: str = ""  # why there are no plots, where there are none

    def files(self) -> list[str]:
        return [s for s in (self.response, self.fi, self.surrogate, self.thumbnail)
                if s is not None and not s.startswith("data:")]


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
            for name in ("response", "fi", "surrogate", "thumbnail"):
                src = getattr(figs, name)
                if src is not None:
                    data = base64.b64encode((Path(tmp) / src).read_bytes()).decode("ascii")
                    setattr(figs, name, "data:image/png;base64," + data)
            return figs
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)  # (a folder that is not there yet: made, as `flexdsl doc -o` does)
    ck = c.checked
    figs = Figures()
    ex = explore(c)
    run = ex.run
    assert run is not None
    inp = ck.inputs[0]
    unit = unit_of(inp)
    amp = float(run.amplitudes[ex.lane])
    t = ex.time
    onset = f"t = {_g(run.onset * t.dt)} {t.unit}" if t.unit and t.dt else f"step {run.onset}"
    others = ", the other inputs 0" if len(ck.inputs) > 1 else ""
    figs.response = plots.response_figure(c, run, ex.lane, t, out / f"{stem}.response.png").name
    cap = (f"Response to a step input: {inp.name} = {_g(amp)}{' ' + unit if unit else ''} from {onset}{others}; "
           f"{run.T} steps simulated in float64 (torch backend)")
    if t.unit:
        cap += f", dt = {_g(t.dt or 0)} {t.unit}"
    cap += ". "
    if run.spikes is not None:
        n = int(run.spikes[:, ex.lane].sum())
        cap += f"{n} spike{'s' if n != 1 else ''}. "
    if run.threshold_state is not None:
        cap += (f"At each spike, {run.threshold_state} is drawn through its value before the reset (where it "
                f"crossed the threshold, dashed) down to its reset value. ")
    if ex.note:
        cap += ex.note[0].upper() + ex.note[1:] + ". "
    if not bool(run.finite()[ex.lane]):
        cap += "The states are not finite (NaN or inf) with these params and this input."
    figs.response_caption = cap.strip()
    if ex.spiking and ex.rheobase is not None:
        figs.fi = plots.fi_figure(c, ex, out / f"{stem}.fi.png").name
        figs.fi_caption = (f"Mean firing rate while a step input of {inp.name} is on, against its amplitude "
                           f"({run.amplitudes.numel()} amplitudes from 0 to {_g(float(run.amplitudes[-1]))}); "
                           f"the smallest amplitude of a scan over 0.001 to 10000 that fired is "
                           f"{_g(ex.rheobase)}.")
    if c.step.surrogate is not None:
        figs.surrogate = plots.surrogate_figure(c, out / f"{stem}.surrogate.png").name
        figs.surrogate_caption = ("Forward, the spike is the step (dashed); backward, d spike / d u is the "
                                  "surrogate S\u2032(u) (right), the slope of the smooth step S (left).")
    figs.thumbnail = plots.thumbnail(c, ex, out / f"{stem}.thumb.png").name
    return figs


__all__ = ["Figures", "make_figures"]
