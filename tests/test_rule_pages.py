"""The numbers a rule's or layer's page shows (`flexdsl doc`), against closed forms derived by hand:
an eligibility rule's window paid out in full, the window's span and units from the params as written,
a dendritic group's delayed bias, a library rule by its name."""

from __future__ import annotations

import math

import sympy as sp
import torch

import flexdsl
from flexdsl.docs.rulepage import _lags, _time_unit, stdp_window
from flexdsl.library import resolve_rule


def test_an_eligibility_rules_window_is_paid_out_in_full():
    """mstdpet (reward 1 at every step): a pair's eligibility term e = sgn(Δt) w exp(-|Δt|/tau) is paid
    out through z_t = z_{t-1} exp(-1/tau_z) + e/tau_z in full, e (1/tau_z) / (1 - exp(-1/tau_z)): a
    symmetric window (the run stopped before a late pair had paid out: -10 showed 39 % of it)."""
    rule = flexdsl.load_rule("mstdpet")
    p = {k: float(v) for k, v in rule.param_values().items()}
    lag, dw = stdp_window(rule, 10)
    tz = p["tau_z"]
    pay = (1 / tz) / (1 - math.exp(-1 / tz))
    for k in (-10, -3, -1, 1, 3, 10):
        tau = p["tau_pre"] if k > 0 else p["tau_post"]
        want = math.copysign(1.0, k) * math.exp(-abs(k) / tau) * pay
        got = float(dw[lag.tolist().index(k)])
        assert abs(got - want) <= 1e-9 * abs(want) + 1e-15, (k, got, want)


SONG_S = """rule SongS:
    param dt = 0.1 ms where dt > 0 ms
    param taupre = 0.02 s where taupre > 0 ms
    param taupost = 0.02 s where taupost > 0 ms
    param dApre = 0.01
    param dApost = -0.0105
    state Apre = 0
    state Apost = 0
    weight w where 0 <= w <= 1
    equations:
        dApre/dt = -Apre / taupre
        dApost/dt = -Apost / taupost
    on pre:
        Apre += dApre
        w = clip(w + Apost, 0, 1)
    on post:
        Apost += dApost
        w = clip(w + Apre, 0, 1)
"""


def test_the_windows_span_and_unit_come_from_the_params_as_written():
    """Time constants of 0.02 s over a dt of 0.1 ms: 3 x 200 steps (capped at 400), not 3 x 0.02 / 0.1;
    a `dt` written as a number whose description says "(ms)" labels the axis in ms."""
    assert _lags(flexdsl.load_rule(SONG_S)) == 400
    assert _lags(flexdsl.load_rule("stdp_song")) == 400
    assert _time_unit(flexdsl.load_rule("stdp_additive")) == "ms"  # (`dt = 1.0 "time step (ms)"`)


def test_a_dendritic_groups_bias_arrives_with_its_delayed_current():
    from flexdsl.docs.layerpage import _current

    text = ("layer L:\n    neuron lif\n    size 2\n    input s size 3\n    synapses U from s to x:\n"
            "        delay dendritic max 3\n        bias b\n")
    layer = flexdsl.loads(text)._layer
    _, rhs = _current(layer, layer.synapses[0])
    t, d = sp.Symbol("t"), sp.Symbol("d_i")
    assert rhs.has(sp.Heaviside(t - d, 1))
    # the runtime: with U = 0 and b = 5, no current before step d (3 here), then 5
    m = flexdsl.loads(text, backend="torch", delays={"U": torch.tensor([3, 0])})
    with torch.no_grad():
        m.U.zero_()
        m.b.fill_(5.0)
    cur = m.current(torch.zeros(6, 1, 3))
    assert cur[:3, 0, 0].eq(0).all() and cur[3:, 0, 0].eq(5).all() and cur[:, 0, 1].eq(5).all()


def test_doc_takes_a_library_rule_by_its_name(tmp_path):
    from flexdsl.docs.sitebuild import build

    build(["stdp_additive"], tmp_path, plots=False)
    assert (tmp_path / "stdp_additive.md").is_file()


def test_a_rule_page_lists_what_the_rule_reads_and_the_calls_that_apply(tmp_path):
    """Short-term plasticity reads no `post` and changes no weight: its page does not list `post`, nor
    `rule.window`/`rule.online` (which would return a zero change), and shows `rule.carry`, whose
    value on a one-spike train is the hand-derived first step `U * x0 = 0.45 * 1`. A pair-STDP page
    lists both spike trains and the weight calls."""
    from flexdsl.docs.sitebuild import build

    build(["tsodyks_markram", "stdp_song"], tmp_path, plots=False)
    stp = (tmp_path / "tsodyks_markram.md").read_text()
    interface = stp.split("## Interface")[1].split("| param")[0]
    assert "`pre`" in interface and "`post`" not in interface.replace("reads no postsynaptic", "")
    use = stp.split("## Use")[1]
    assert "rule.carry(pre)" in use and "rule.window" not in use and "rule.online" not in use
    r = flexdsl.load_rule("tsodyks_markram").carry(torch.tensor([[[1.0]]]))
    assert abs(float(r) - 0.45) < 1e-7
    song = (tmp_path / "stdp_song.md").read_text()
    assert "`post`: the postsynaptic spikes" in song and "rule.window(pre, post, W)" in song
    assert "rule.carry" not in song


def test_pages_of_modules_built_in_python_say_so_not_a_placeholder_name():
    """A layer built by `flexdsl.feedforward` or loaded from text, and a rule loaded from text: their
    pages said `<string>` / `<flexdsl.feedforward>` where a file's name goes."""
    m = flexdsl.feedforward("lif", 3, 4, delay="axonal max 3 learnable")
    pages = [flexdsl.docs.render_layer(m, markdown=True), flexdsl.docs.render_layer(m),
             flexdsl.docs.render_layer(flexdsl.loads(m.layer_text), markdown=True),
             flexdsl.docs.render_rule(flexdsl.load_rule(resolve_rule("stdp_song")[0]), markdown=True)]
    for page in pages:
        assert "<string>" not in page and "&lt;string&gt;" not in page and "<flexdsl." not in page
    assert "built by `flexdsl.feedforward`" in pages[0] and "loaded from text" in pages[2] + pages[3]
