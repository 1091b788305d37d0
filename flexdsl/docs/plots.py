"""The doc plots (matplotlib, Agg), each written as a PNG.

- `surrogate_figure`: the surrogate S (the smooth step whose slope backward uses) and S'.
- `response_figure`: the response to a step input — the input, every state (the state of the
  spike rule with its values before the reset at the spikes, and the threshold), the spikes.
- `fi_figure`: the f–I curve (`fi.FICurve`: the rate during the step against its amplitude; a
  noisy model's mean over trials with a band of their spread).
- `thumbnail`: a small trace for the index.

Time axes are in the model's time unit where `dt` is declared with one, else in steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .explore import Exploration
from .simulate import DTYPE, Run, TimeAxis, evaluate_expr, param_defaults
from .units import unit_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..runtime.compiler import Compiled
    from .fi import FICurve

DPI = 100
THRESHOLD_COLOR = "tab:red"
TRACE_COLOR = "tab:blue"


def _figure(w: float, h: float, rows: int = 1, cols: int = 1, **kw: Any):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(w, h), dpi=DPI)
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes


def _margins(fig: Figure, left: float = 0.8, right: float = 0.2, top: float = 0.45, bottom: float = 0.55,
             hspace: float = 0.3, wspace: float = 0.0) -> None:
    """Fixed margins in inches (tight_layout measures every label: slow for many figures)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h, hspace=hspace,
                        wspace=wspace / (w / 2) if wspace else 0.2)


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    png = path.suffix.lower() == ".png"
    fig.savefig(path, dpi=DPI, metadata={"Software": "flexdsl"} if png else None)
    return path


def figure_src(fig: Figure, outdir: str | Path | None, name: str) -> str:
    """Where a page finds a figure: the PNG `name` written into `outdir`, or (no `outdir`) the figure
    embedded as a data URL."""
    if outdir is not None:
        save(fig, Path(outdir) / name)
        return name
    import base64
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def delay_histogram(delays: torch.Tensor, max_delay: int, title: str) -> Figure:
    """The histogram of a synapse group's delays (whole steps 0..max, or real ones binned by step)."""
    fig, axes = _figure(5.0, 2.6)
    ax = axes[0][0]
    d = delays.detach().double().flatten().cpu().numpy()
    ax.hist(d, bins=[k - 0.5 for k in range(max_delay + 2)], color="tab:green")
    ax.set_xlabel("delay (steps)")
    ax.set_ylabel("count")
    ax.set_xlim(-0.5, max_delay + 0.5)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_path_problem(path: str | Path) -> tuple[str, str] | None:
    """Why a plot cannot be written to `path` ((reason, hint)), checked before the work that makes
    it: an extension matplotlib does not write, a folder that does not exist, a directory; None: fine."""
    p = Path(path)
    ext = p.suffix.lower().lstrip(".")
    formats = supported_formats()
    if not ext or ext not in formats:
        why = f"`.{ext}` is not an image format matplotlib writes" if ext else "the name has no extension"
        return why, "the extension picks the image format: " + ", ".join(f".{f}" for f in formats)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        return f"the directory `{parent}` does not exist", "create it first, or choose another path"
    if p.is_dir():
        return "it is a directory", "give a file name, e.g. curves.png"
    return None


def supported_formats() -> list[str]:
    """The file extensions matplotlib can write."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # pgf needs a LaTeX installation to write
    return sorted(f for f in FigureCanvasAgg(Figure()).get_supported_filetypes() if f != "pgf")


# ----------------------------------------------------------------------------- surrogate
def surrogate_curve(c: Compiled, n: int = 801) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(u, S(u), S'(u)): S' from the model's surrogate with its keywords (params at their
    defaults), on a range that shows its support; S is its integral from the left end."""
    import sympy as sp

    sur = c.step.surrogate
    assert sur is not None
    env: dict[Any, Any] = {sp.Symbol(k, real=True): v for k, v in param_defaults(c).items()}

    def dS(u: torch.Tensor) -> torch.Tensor:
        env[sur.u] = u
        return torch.as_tensor(evaluate_expr(sur.derivative, env), dtype=DTYPE).expand_as(u)

    half = 1.0
    for w in (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0):
        probe = torch.linspace(-w, w, 401, dtype=DTYPE)
        d = dS(probe).abs()
        peak = float(d.max())
        if peak > 0 and float(d[0]) <= 0.02 * peak and float(d[-1]) <= 0.02 * peak:
            half = w
            break
    else:
        half = 2.0  # no decay (e.g. straight_through): a fixed window
    u = torch.linspace(-half, half, n, dtype=DTYPE)
    d = dS(u)
    s = torch.cat([torch.zeros(1, dtype=DTYPE), torch.cumulative_trapezoid(d, u)])
    return u, s, d


def surrogate_figure(c: Compiled, path: str | Path, call: str | None = None) -> Path:
    return save(draw_surrogate(c, call), path)


def draw_surrogate(c: Compiled, call: str | None = None) -> Figure:
    """S and S' side by side, against u in the unit of the spike rule's sides; `call`: the
    surrogate as written (its keywords with their units), for the title."""
    u, s, d = surrogate_curve(c)
    sur = c.step.surrogate
    assert sur is not None
    if call is None:
        call = f"{sur.name}(" + ", ".join(f"{k}={_num(v)}" for k, v in sur.kwargs.items()) + ")"
    unit = rule_unit(c)
    fig, axes = _figure(8.6, 2.7, 1, 2)
    a0, a1 = axes[0]
    a0.plot(u.numpy(), (u >= 0).to(DTYPE).numpy(), color="0.6", lw=1, ls="--", label="spike\n(forward)")
    a0.plot(u.numpy(), s.numpy(), color=TRACE_COLOR, lw=1.8, label="S (its\nintegral)")
    a0.set_title("S(u): what backward differentiates", fontsize=10)
    a0.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    a1.plot(u.numpy(), d.numpy(), color=THRESHOLD_COLOR, lw=1.8)
    a1.set_title("S\u2032(u) = d spike / d u in backward", fontsize=10)
    a1.set_ylabel(f"S\u2032 (1/{unit})" if unit else "S\u2032", fontsize=9)
    fires = "u \u2265 0" if c.checked.spike.op == ">=" else "u > 0"
    for a in (a0, a1):
        a.set_xlabel(f"u ({unit}; fires at {fires})" if unit else f"u (fires at {fires})", fontsize=9)
        a.axvline(0, color="0.85", lw=0.8, zorder=0)
        a.grid(alpha=0.3)
        a.tick_params(labelsize=8)
    fig.suptitle(f"surrogate {call}", fontsize=11)
    _margins(fig, left=0.55, right=0.15, top=0.6, bottom=0.55, wspace=1.9)
    return fig


def rule_unit(c: Compiled) -> str | None:
    """The unit of the spike rule's sides (`v >= v_th` with v in mV: mV), or None."""
    rule = c.checked.spike
    if rule is None:
        return None
    from ..frontend import ast as A

    decls = {d.name: d for d in [*c.checked.inputs, *c.checked.params, *c.checked.states]}
    for side in (rule.left, rule.right):
        for n in A.names(side):
            if n.id in decls:
                u = unit_label(decls[n.id])
                if u and u != "1":
                    return u
    return None


def _num(v: Any) -> str:
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return str(v)


# ----------------------------------------------------------------------------- response
def _time(time: TimeAxis, T: int) -> torch.Tensor:
    """The x of the initial values (one step before step 0), then of each step k: k steps (times dt
    on a time axis), so a plot's spikes are at the steps `flexdsl run` prints."""
    return time.times(T + 1) - time.times(2)[1]


def _with_peaks(t: torch.Tensor, post: torch.Tensor, pre: torch.Tensor, init: float,
                spikes: torch.Tensor | None) -> tuple[list[float], list[float]]:
    """The trace from its initial value, through each step's value; at a spike the value before
    the reset first (where the threshold was crossed), then the reset value at the same time."""
    xs, ys = [float(t[0])], [init]
    fired = spikes if spikes is not None else torch.zeros_like(post)
    for k in range(post.shape[0]):
        tk = float(t[k + 1])
        if fired[k] > 0:
            xs.append(tk)
            ys.append(float(pre[k]))
        xs.append(tk)
        ys.append(float(post[k]))
    return xs, ys


def response_figure(c: Compiled, run: Run, lane: int, time: TimeAxis, path: str | Path,
                    title: str | None = None) -> Path:
    return save(draw_response(c, run, lane, time, title), path)


def draw_response(c: Compiled, run: Run, lane: int, time: TimeAxis, title: str | None = None) -> Figure:
    """The input, every state (the spike rule's state through its values before the reset, and
    the threshold) and the spikes of one lane; the legend beside the axes, never on the data."""
    ck = c.checked
    hidden = set(ck.hidden)  # bookkeeping of refractoriness and crossing rules
    states = [s for s in run.states if s not in hidden]
    has_spikes = run.spikes is not None
    n = 1 + len(states) + (1 if has_spikes else 0)
    heights = [0.7] + [1.0] * len(states) + ([0.45] if has_spikes else [])
    fig, axes = _figure(8.8, 0.55 + 1.25 * sum(heights), n, 1, sharex=True,
                        gridspec_kw={"height_ratios": heights})
    axes = axes[:, 0]
    T = run.T
    t = _time(time, T)
    inp = ck.inputs[0]
    x = torch.cat([torch.zeros(1, dtype=DTYPE), run.x[:, lane]])  # (step k's input over [k, k + 1))
    axes[0].step(t.numpy(), x.numpy(), where="post", color="0.35", lw=1.4)
    axes[0].set_ylabel(_label(inp.name, unit_label(inp)), fontsize=9)
    spikes = run.spikes[:, lane] if has_spikes else None
    for ax, s in zip(axes[1:], states):
        decl = next(d for d in ck.states if d.name == s)
        post, pre = run.states[s][:, lane], run.pre[s][:, lane]
        init = float(run.init[s][lane]) if s in run.init else float(post[0])
        if s == run.threshold_state:
            xs, ys = _with_peaks(t, post, pre, init, spikes)
            ax.plot(xs, ys, color=TRACE_COLOR, lw=1.3)
            thr = run.threshold
            if thr is not None and thr.numel() == 1:
                ax.axhline(float(thr), color=THRESHOLD_COLOR, ls="--", lw=1.1, label="threshold")
            elif thr is not None:
                ax.plot(t[1:].numpy(), thr[:, lane].numpy(), color=THRESHOLD_COLOR, ls="--", lw=1.1,
                        label="threshold")
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, borderaxespad=0)
        else:
            ax.plot(t.numpy(), torch.cat([torch.tensor([init], dtype=DTYPE), post]).numpy(), color=TRACE_COLOR,
                    lw=1.3)
        ax.set_ylabel(_label(s, unit_label(decl)), fontsize=9)
    if has_spikes:
        ax = axes[-1]
        idx = torch.nonzero(spikes > 0).flatten()
        ax.vlines(t[1:][idx].numpy(), 0, 1, color="black", lw=1.0)
        ax.set_ylim(0, 1.15)
        ax.set_yticks([])
        ax.set_ylabel("spikes", fontsize=9)
    for ax in axes:
        ax.grid(alpha=0.25)
        ax.tick_params(labelsize=8)
    axes[-1].set_xlabel(time.label, fontsize=9)
    axes[-1].set_xlim(float(t[0]), float(t[-1]))
    axes[0].set_title(title or f"{ck.name}: response to a step input", fontsize=11)
    _margins(fig, left=0.95, right=1.0, top=0.35, bottom=0.5, hspace=0.25)
    fig.align_ylabels(axes)
    return fig


def _label(name: str, unit: str | None) -> str:
    return f"{name} ({unit})" if unit else name


# ----------------------------------------------------------------------------- f–I
def fi_figure(c: Compiled, fi: FICurve, path: str | Path) -> Path:
    return save(draw_fi(c, fi), path)


def draw_fi(c: Compiled, fi: FICurve) -> Figure:
    """The f–I curve: `fi.mean` against the amplitudes (the numbers the caption and the data file
    give), a noisy model's spread as a band, and the step response's amplitude (`fi.marked`) as a
    circle on the curve."""
    rate, a = fi.mean, fi.amplitudes
    ok = fi.finite
    inp = c.checked.inputs[0]
    fig, axes = _figure(7.4, 3.2)
    ax = axes[0, 0]
    label = "rate" if fi.trials == 1 else f"mean of {fi.trials}\ntrials"
    if fi.trials > 1:
        lo = (rate - fi.spread).clamp(min=0)
        ax.fill_between(a[ok].numpy(), lo[ok].numpy(), (rate + fi.spread)[ok].numpy(), color=TRACE_COLOR,
                        alpha=0.2, lw=0, label="\u00b1 1 s.d.")
    ax.plot(a[ok].numpy(), rate[ok].numpy(), "o-", color=TRACE_COLOR, ms=3.5, lw=1.3, label=label)
    if fi.marked is not None and bool(ok[fi.marked]):
        ax.plot([float(a[fi.marked])], [float(rate[fi.marked])], "o", color=THRESHOLD_COLOR, ms=8, mfc="none",
                mew=1.5, label="the step\nresponse above")
    if not bool(ok.all()):
        ax.plot(a[~ok].numpy(), torch.zeros(int((~ok).sum()), dtype=DTYPE).numpy(), "x", color="0.5",
                label="not finite")
    ax.set_xlabel(f"step amplitude of {_label(inp.name, unit_label(inp))}", fontsize=9)
    ax.set_ylabel(fi.time.rate_label, fontsize=9)
    ax.set_title(f"{c.checked.name}: f\u2013I curve (1 / mean interspike interval, {fi.duration(fi.window)} window)",
                 fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    _margins(fig, left=0.75, right=1.55, top=0.35, bottom=0.5)
    return fig


# ----------------------------------------------------------------------------- thumbnail
def thumbnail(c: Compiled, ex: Exploration, path: str | Path) -> Path:
    run = ex.run
    assert run is not None
    lane = ex.lane
    fig, axes = _figure(2.4, 1.2)
    ax = axes[0, 0]
    t = _time(ex.time, run.T)
    s = run.threshold_state or next(iter(run.states), None)
    if s is not None:
        post, pre = run.states[s][:, lane], run.pre[s][:, lane]
        init = float(run.init[s][lane]) if s in run.init else float(post[0])
        spikes = run.spikes[:, lane] if run.spikes is not None else None
        xs, ys = _with_peaks(t, post, pre, init, spikes if s == run.threshold_state else None)
        ax.plot(xs, ys, color=TRACE_COLOR, lw=1.0)
        thr = run.threshold
        if s == run.threshold_state and thr is not None and thr.numel() == 1:
            ax.axhline(float(thr), color=THRESHOLD_COLOR, ls="--", lw=0.8)
        elif s == run.threshold_state and thr is not None:
            ax.plot(t[1:].numpy(), thr[:, lane].numpy(), color=THRESHOLD_COLOR, ls="--", lw=0.8)
    ax.set_axis_off()
    fig.subplots_adjust(0.02, 0.04, 0.98, 0.96)
    return save(fig, path)


__all__ = ["surrogate_figure", "surrogate_curve", "response_figure", "fi_figure", "thumbnail", "supported_formats",
           "save", "draw_surrogate", "draw_response", "draw_fi", "rule_unit"]
