"""The f–I captions of the model pages say what the model does: for every library model, the page's
f–I data (the CSV the plot is drawn from) and every claim of its caption — the window, the
threshold, the amplitude below it that gives no spike, what happens after the window — are checked
against a simulation of the model made here, with `flexdsl.load` as a user would (torch backend,
float64), and rates counted here from its spikes: nothing of `flexdsl/docs` computes them. A noisy
model's curve (a mean over trials with a band) is checked the same way, trial by trial, and against
trials of other seeds."""

from __future__ import annotations

import html
import math
import re
import sys
from pathlib import Path

import pytest
import torch

import flexdsl
import flexdsl.docs as docs

sys.path.insert(0, str(Path(__file__).parent))
from htmltree import parse  # noqa: E402

D = torch.float64
MODELS = flexdsl.library()
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
NUM = r"(-?[\d.]+(?:e[+-]?\d+)?)"


@pytest.fixture(scope="module")
def site(library_site):
    return library_site[0]


def caption(out: Path, stem: str) -> str | None:
    doc = parse((out / f"{stem}.html").read_text(encoding="utf-8"))
    for fig in doc.find_all("figure"):
        if "f-I" in fig.find("img").attrs.get("alt", ""):
            return html.unescape(" ".join(fig.find("figcaption").text().split()))
    return None


def command(out: Path, stem: str) -> tuple[int, float, int]:
    """(T, amplitude, onset) of the page's `flexdsl run` command (the step response shown)."""
    m = re.search(r"--T (\d+) --input step:(\S+)@(\d+)", (out / f"{stem}.html").read_text(encoding="utf-8"))
    return int(m.group(1)), float(m.group(2)), int(m.group(3))


def table(out: Path, stem: str) -> tuple[list[str], list[list[float | None]]]:
    lines = (out / f"{stem}.fi.csv").read_text(encoding="utf-8").strip().splitlines()
    rows = [[float(v) if v else None for v in ln.split(",")] for ln in lines[1:]]
    return lines[0].split(","), rows


def duration(text: str, per_step: float | None) -> int:
    """Steps of a duration the caption writes ("90 ms", "720 steps")."""
    value, unit = text.split()
    if unit == "steps":
        return int(value)
    assert per_step is not None
    return round(float(value) / per_step)


def spikes_of(m, x: torch.Tensor, seed: int | None = None) -> torch.Tensor:
    """The module's `spike` output for input `x` ([T, B]) on its first input, the others 0."""
    ins = [x] + [torch.zeros_like(x)] * (len(m.compiled.checked.inputs) - 1)
    with torch.no_grad():
        out = m(*ins, seed=seed) if seed is not None else m(*ins)
    outs = out if isinstance(out, tuple) else (out,)
    names = [n for n, _ in m.compiled.checked.outputs]
    return outs[names.index("spike")]


def rates(s: torch.Tensor, window: int, per_step: float | None) -> list[float]:
    """The captions' rate, counted here: 1 / the mean interval between spikes; one spike: 1 / the
    window; none: 0 (per step, or in Hz with `per_step` in seconds)."""
    unit = per_step if per_step else 1.0
    out = []
    for lane in range(s.shape[1]):
        at = torch.nonzero(s[:window, lane] > 0).flatten().tolist()
        if len(at) >= 2:
            out.append((len(at) - 1) / ((at[-1] - at[0]) * unit))
        else:
            out.append(len(at) / (window * unit))
    return out


def check_claims(cap: str, amps: list[float], rate: list[float], first: list[float | None], window: int,
                 longer: int, steps_of) -> None:
    """The caption's threshold, silent amplitude and after-the-window sentences against the rates
    and first-spike steps simulated here (`first`: steps from the onset, None: none up to `longer`)."""
    if "fires without input" in cap:
        assert rate[0] > 0
        return
    on = next(i for i, r in enumerate(rate) if r > 0)
    said = float(re.search(r"It fires from " + NUM, cap).group(1))
    assert said == pytest.approx(amps[on], rel=5e-4), (cap, amps[on])
    none = re.search(r"; " + NUM + r"(?: \S+)? gives none\)", cap)
    if on > 1:
        assert none and float(none.group(1)) == pytest.approx(amps[on - 1], rel=5e-4)
    gaps = [a for a, r in zip(amps[on:], rate[on:]) if r == 0]
    assert ("Above it," in cap) == bool(gaps), (cap, gaps)
    late = [(a, f) for a, f in zip(amps[:on], first[:on]) if f is not None]
    assert all(f > window for _, f in late)  # (silent in the window)
    if not late:
        assert re.search(r"still give no spike", cap), cap
        return
    m = re.search(NUM + r"(?: \S+)? gives a first spike (\S+ \S+) after the onset, outside the window", cap)
    a, f = min(late, key=lambda p: abs(p[0]))
    assert float(m.group(1)) == pytest.approx(a, rel=5e-4) and steps_of(m.group(2)) == f, (cap, a, f)


SPIKING = [s for s in MODELS if flexdsl.compile(s).checked.spike is not None]


@pytest.mark.parametrize("stem", MODELS)
def test_fi_caption_agrees_with_a_simulation_of_the_model(site, stem):
    cap = caption(site, stem)
    if stem not in SPIKING:
        assert cap is None and not (site / f"{stem}.fi.csv").exists()
        return
    T, amp_shown, onset = command(site, stem)
    head, rows = table(site, stem)
    amps = [r[0] for r in rows]
    m = re.search(r"in a window of (\S+ \S+) from the step's onset", cap)
    unit = m.group(1).split()[1]
    per_step = float(m.group(1).split()[0]) / (T - onset) if unit != "steps" else None  # in the caption's unit

    def steps_of(text: str) -> int:
        return duration(text, per_step)

    window = steps_of(m.group(1))
    assert window == T - onset  # the window is the step response's, from its onset
    longer = steps_of(re.search(r"run to (\S+ \S+)\)$", head[-1]).group(1))  # the CSV's first spikes are up to here
    said = re.search(r"Simulated on to (\S+ \S+) after the onset", cap)
    assert said is None or steps_of(said.group(1)) == longer
    assert f"{len(amps)} amplitudes from 0 to" in cap and amps[0] == 0.0
    assert amp_shown in amps  # the circle on the curve is a point of it
    model = flexdsl.load(stem, backend="torch").to(D)
    x = torch.zeros(onset + longer, len(amps), dtype=D)
    x[onset:] = torch.tensor(amps, dtype=D)
    s = spikes_of(model, x)[onset:]
    seconds = per_step * SECONDS[unit] if per_step else None
    simulated = rates(s, window, seconds)
    assert [int(r[1]) for r in rows] == s[:window].sum(0).tolist()
    # float64, the same arithmetic: the rates agree to a few roundings of a quotient
    assert [r[2] for r in rows] == pytest.approx(simulated, rel=1e-12, abs=0)
    first = [int(i[0]) + 1 if len(i) else None for i in (torch.nonzero(s[:, k]).flatten() for k in range(len(amps)))]
    scale = per_step or 1.0
    assert [None if r[-1] is None else round(r[-1] / scale) for r in rows] == first
    check_claims(cap, amps, simulated, first, window, longer, steps_of)


NOISY = """neuron NoisyLeaky:
    \"\"\"A discrete leaky neuron with Gaussian noise in the membrane.\"\"\"
    input x
    param tau = 5.0
    param sigma = 0.15
    state v = 0.0
    update:
        v = v + (x - v) / tau + sigma * randn()
    spike when v >= 1.0
    on spike:
        v = 0.0
"""


def test_a_noisy_models_curve_is_a_mean_over_trials_with_its_spread(tmp_path):
    """The caption's trials (seed, count) are simulated here lane by lane as the docs state their
    layout (trial k of amplitude a: lane a * N + k); the CSV's means and standard deviations are
    theirs; the caption's threshold is the first amplitude where a trial spikes; and trials of
    another seed give means within 4 standard errors of the page's (the band is the spread)."""
    path = tmp_path / "noisy_leaky.neuron"
    path.write_text(NOISY, encoding="utf-8")
    res = docs.build([path], tmp_path / "site")
    out = res.outdir
    cap = caption(out, "noisy_leaky")
    trials, seed = (int(v) for v in re.search(r"mean over (\d+) trials \(independent noise, seed (\d+)\)", cap).groups())
    assert trials >= 8 and "band \u00b1 one standard deviation" in cap
    T, amp_shown, onset = command(out, "noisy_leaky")
    head, rows = table(out, "noisy_leaky")
    amps = [r[0] for r in rows]
    window = T - onset
    longer = duration(re.search(r"Simulated on to (\S+ \S+) after the onset", cap).group(1), None)
    model = flexdsl.load(path, backend="torch").to(D)

    def trial_rates(seed: int) -> torch.Tensor:
        model.reset()
        x = torch.zeros(onset + longer, len(amps) * trials, dtype=D)
        x[onset:] = torch.tensor(amps, dtype=D).repeat_interleave(trials)
        s = spikes_of(model, x, seed)[onset:]
        return torch.tensor(rates(s, window, None), dtype=D).reshape(len(amps), trials), s

    r, s = trial_rates(seed)
    mean, sd = r.mean(1), r.std(1, correction=0)
    assert [row[2] for row in rows] == pytest.approx(mean.tolist(), rel=1e-12, abs=1e-15)
    assert [row[3] for row in rows] == pytest.approx(sd.tolist(), rel=1e-9, abs=1e-15)
    assert sd.max() > 0  # a band, not a line
    first = [int(i[0]) + 1 if len(i) else None for i in (torch.nonzero(s[:, k]).flatten() for k in range(s.shape[1]))]
    earliest = [min((f for f in first[a * trials:(a + 1) * trials] if f is not None), default=None)
                for a in range(len(amps))]
    check_claims(cap, amps, mean.tolist(), earliest, window, longer, lambda t: duration(t, None))
    other, _ = trial_rates(seed + 1000)
    se = ((sd**2 + other.std(1, correction=0) ** 2) / trials).sqrt()
    assert ((mean - other.mean(1)).abs() <= 4 * se + 1e-12).all(), (mean, other.mean(1), se)
    assert math.isfinite(amp_shown) and amp_shown in amps
