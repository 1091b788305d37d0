"""The numbers behind the doc plots (flexdsl/docs/simulate.py, plots.py, units.py), against
hand-written loops of the models' equations: spike counts of the f–I lanes, the values before the
reset, the threshold (constant, state-dependent, solved from an expression), the time axes and
rates, the surrogate curves."""

from __future__ import annotations

import math

import pytest
import torch

import flexdsl
from flexdsl.docs.explore import explore
from flexdsl.docs.plots import surrogate_curve
from flexdsl.docs.simulate import TimeAxis, simulate, time_axis
from flexdsl.docs.units import looks_like_unit, trailing_parenthesized, unit_of

D = torch.float64


def _if_loop(x: float, T: int, onset: int):
    """SpikingJelly's IFNode (v += x; fire at v >= 1; v = 0), in plain floats."""
    v, pre, spikes = 0.0, [], []
    for t in range(T):
        v = v + (x if t >= onset else 0.0)
        pre.append(v)
        s = v >= 1.0
        spikes.append(s)
        v = 0.0 if s else v
    return pre, spikes


def test_if_lanes_against_a_loop():
    c = flexdsl.compile("if")
    ex = explore(c)
    run = ex.run
    assert ex.time == TimeAxis()  # no dt: steps
    for k, a in enumerate(run.amplitudes.tolist()):
        pre, spikes = _if_loop(a, run.T, run.onset)
        assert run.spikes[:, k].tolist() == [float(s) for s in spikes], a
        assert torch.allclose(run.pre["v"][:, k], torch.tensor(pre, dtype=D), rtol=0, atol=1e-12)
    assert float(run.threshold.flatten()[0]) == 1.0 and run.threshold_state == "v"
    # the lane shown as the step response fires, and the f-I grid reaches into firing
    assert float(run.counts()[ex.lane]) >= 1
    assert ex.rheobase is not None and float(run.amplitudes[-1]) >= ex.rheobase


def test_lif_pre_reset_values():
    """LIF (tau 2): with x = 1.5 from step 0, v goes 0.75, then 1.125 (fires), 0.75, 1.125 ..."""
    c = flexdsl.compile("lif")
    run = simulate(c, torch.tensor([1.5], dtype=D), 8, 0)
    assert run.pre["v"][:, 0].tolist() == [0.75, 1.125] * 4
    assert run.states["v"][:, 0].tolist() == [0.75, 0.0] * 4
    assert run.spikes[:, 0].tolist() == [0.0, 1.0] * 4
    assert run.u[:, 0].tolist() == [-0.25, 0.125] * 4


def test_alif_threshold_follows_the_adaptation():
    c = flexdsl.compile("alif")
    T, onset, x = 120, 10, 2.5
    run = simulate(c, torch.tensor([x], dtype=D), T, onset)
    dt, tau_m, tau_a, v_th, beta = 1.0, 20.0, 200.0, 1.0, 1.8  # the file's defaults
    alpha, rho = math.exp(-dt / tau_m), math.exp(-dt / tau_a)
    v = a = 0.0
    n = 0
    for t in range(T):
        xt = x if t >= onset else 0.0
        v = alpha * v + (1 - alpha) * xt
        a = rho * a
        thr = v_th + beta * a
        assert math.isclose(float(run.pre["v"][t, 0]), v, rel_tol=1e-12, abs_tol=1e-12)
        assert math.isclose(float(run.threshold[t, 0]), thr, rel_tol=1e-12)
        s = v >= thr
        assert float(run.spikes[t, 0]) == float(s), t
        if s:
            v -= v_th
            a += 1.0
            n += 1
    assert n >= 2  # the threshold rose between spikes


def test_threshold_solved_from_an_expression():
    """Hodgkin-Huxley's `spike when v crosses v_spike`: the line is v = v_spike (0 mV) at every step."""
    c = flexdsl.compile("hodgkin_huxley")
    run = simulate(c, torch.tensor([10.0], dtype=D), 300, 10)
    assert run.threshold_state == "v" and bool((run.threshold == 0.0).all())
    text = """neuron Half:
    input x
    param th = 3.0
    state v = 0.0
    update:
        v = v + x
    spike when 2 * v >= th
    on spike:
        v = 0.0
    output v
"""
    c = flexdsl.compile(text)
    run = simulate(c, torch.tensor([0.4], dtype=D), 12, 0)
    assert run.threshold_state == "v" and float(run.threshold) == 1.5
    # `output v` only: the spikes come from the rule itself, v >= 1.5 at 0.4, 0.8, 1.2, 1.6 -> fires
    assert run.spikes[:, 0].tolist() == [0, 0, 0, 1] * 3


def test_time_axes_and_rates():
    adex = time_axis(flexdsl.compile("adex"))
    assert (adex.dt, adex.unit, adex.label, adex.seconds) == (0.1, "ms", "time (ms)", 1e-3)
    assert torch.allclose(adex.times(3), torch.tensor([0.0, 0.1, 0.2], dtype=D))  # (step k at k dt, as printed)
    assert adex.rate(torch.tensor([5.0], dtype=D), 1000).item() == pytest.approx(50.0)  # 5 spikes in 100 ms
    li = time_axis(flexdsl.compile("li"))
    assert (li.unit, li.rate_label) == ("s", "rate (Hz)")
    assert time_axis(flexdsl.compile("lif")) == TimeAxis()
    raf = time_axis(flexdsl.compile("raf"))  # "time step (time units)": no unit known
    assert raf.unit is None and raf.label == "step"
    steps = TimeAxis()
    assert steps.rate(torch.tensor([20.0], dtype=D), 200).item() == pytest.approx(0.1)
    assert steps.rate_label == "rate (spikes per step)"


@pytest.mark.parametrize("text,unit", [
    ("membrane potential (mV)", "mV"), ("integration step (ms)", "ms"), ("current density (uA/cm^2)", "uA/cm^2"),
    ("coefficient (1/(mV ms))", "1/(mV ms)"), ("time constant (steps)", "steps"), ("(voltage units)", None),
    ("input (threshold units; scaled by 1 - alpha)", None), ("membrane potential (the output)", None),
    ("no unit here", None), ("", None),
])
def test_units_from_descriptions(text, unit):
    class Decl:
        meta: dict = {}
        doc = text

    assert unit_of(Decl()) == unit


def test_declared_unit_wins():
    class Decl:
        meta = {"unit": "ms"}
        doc = "step (s)"

    assert unit_of(Decl()) == "ms"
    assert trailing_parenthesized("a (b (c)) ") == "b (c)"
    assert not looks_like_unit("a very long description of something")


def test_surrogate_curve_sigmoid():
    u, s, d = surrogate_curve(flexdsl.compile("lif"))  # sigmoid(alpha=4.0)
    ref = 4 * torch.sigmoid(4 * u) * (1 - torch.sigmoid(4 * u))
    assert torch.allclose(d, ref, rtol=1e-12, atol=1e-15)
    integral = torch.sigmoid(4 * u) - torch.sigmoid(4 * u[0])  # S, from the left end of the range
    assert torch.allclose(s, integral, atol=1e-4)
    assert float(d[0]) <= 0.02 * float(d.max()) and float(d[-1]) <= 0.02 * float(d.max())


def test_surrogate_curve_with_param_keyword():
    """ALIF: pseudo_derivative(gamma=0.3, width=1.0): 0.3 * relu(1 - |u|)."""
    u, _, d = surrogate_curve(flexdsl.compile("alif"))
    assert torch.allclose(d, 0.3 * torch.relu(1 - u.abs()), atol=1e-15)
