"""Plasticity rules (`.rule` files): each library rule against an independent implementation —
SpikingJelly's learners (STDPLearner multi- and single-step, MSTDPLearner, MSTDPETLearner), Norse's
Tsodyks–Markram step, Brian2 (its STDP.py example closed-loop; triplet STDP with given trains),
and spike-time sums written here from the papers' formulas; gradients of learnable constants
against central finite differences (float64); the located errors of bad rules and bad calls."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import flexdsl
from flexdsl import FlexDSLError
from tests.tolerances import assert_close

F64 = torch.float64


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    yield
    torch.set_default_dtype(old)


def _spikes(gen: torch.Generator, *shape: int, p: float = 0.4, scale: float = 1.0) -> torch.Tensor:
    return (torch.rand(*shape, generator=gen) < p).to(F64) * scale




def _sj():
    from spikingjelly.activation_based import learning, neuron

    return learning, neuron


def _sj_rule_text(f: str) -> str:
    """SpikingJelly's pair STDP with f_pre = f_post = `f` (an expression of w), as a rule."""
    return f"""rule SJ_F:
    param tau_pre = 2.0
    param tau_post = 2.0
    state x_pre = 0
    state x_post = 0
    update:
        x_pre = x_pre - x_pre / tau_pre + pre
        x_post = x_post - x_post / tau_post + post
        w += {f} * (post * x_pre - pre * x_post)
"""


# ---------------------------------------------------------------- SpikingJelly
@pytest.mark.parametrize("f", ["identity", "clamp"])
def test_pair_stdp_equals_spikingjelly_multistep(f):
    learning, neuron = _sj()
    g = torch.Generator().manual_seed(1)
    T, B, n_in, n_out = 12, 3, 7, 5
    fc = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        fc.weight.copy_(torch.randn(n_out, n_in, generator=g))
    lif = neuron.LIFNode(tau=2.0, step_mode="m")
    kw = {} if f == "identity" else {"f_pre": lambda w: torch.clamp(w, -0.5, 0.5),
                                     "f_post": lambda w: torch.clamp(w, -0.5, 0.5)}
    learner = learning.STDPLearner(step_mode="m", synapse=fc, sn=lif, tau_pre=2.0, tau_post=3.5, **kw)
    x = _spikes(g, T, B, n_in, scale=2.0)  # graded presynaptic values: SpikingJelly multiplies by them
    w0 = fc.weight.detach().clone()
    with torch.no_grad():
        post = lif(fc(x))
    assert 0 < post.mean() < 1
    ref = learner.step(on_grad=False)
    rule = flexdsl.load_rule("stdp_sj" if f == "identity" else _sj_rule_text("clip(w, -0.5, 0.5)"), tau_post=3.5)
    assert rule.separable  # the window runs as products over T*B
    dw = rule.window(x, post, w0)
    assert_close(dw, ref, ops=T * B * 6 + T * 8)  # (traces: T steps; the change: a sum of T*B products)
    assert ref.abs().max() > 0.1


def test_pair_stdp_equals_spikingjelly_singlestep_window_and_online():
    """Single-step learner: each step's change with the weights held sums to the window; applied after
    every step (SGD, lr 1, on the learner's -dW gradient) it is the online semantics, closed loop."""
    learning, neuron = _sj()
    g = torch.Generator().manual_seed(2)
    T, B, n_in, n_out = 10, 2, 6, 4
    x = _spikes(g, T, B, n_in, scale=3.0)
    w_init = 0.5 * torch.randn(n_out, n_in, generator=g)
    # held weights: the sum of single steps is the window
    fc = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        fc.weight.copy_(w_init)
    lif = neuron.LIFNode(tau=2.0, step_mode="s")
    learner = learning.STDPLearner(step_mode="s", synapse=fc, sn=lif, tau_pre=2.0, tau_post=2.0)
    posts, total = [], torch.zeros_like(w_init)
    for t in range(T):
        with torch.no_grad():
            posts.append(lif(fc(x[t])))
        total += learner.step(on_grad=False)
    dw = flexdsl.load_rule("stdp_sj").window(x, torch.stack(posts), w_init)
    assert_close(dw, total, ops=T * B * 6 + T * 8)
    # applied every step, closed loop: a flexdsl layer with `rule stdp_sj online`
    fc = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        fc.weight.copy_(w_init)
    lif = neuron.LIFNode(tau=2.0, step_mode="s")
    learner = learning.STDPLearner(step_mode="s", synapse=fc, sn=lif, tau_pre=2.0, tau_post=2.0)
    opt = torch.optim.SGD(fc.parameters(), lr=1.0)
    outs = []
    for t in range(T):
        with torch.no_grad():
            outs.append(lif(fc(x[t])))
        opt.zero_grad()
        learner.step(on_grad=True)
        opt.step()
    m = flexdsl.feedforward("lif", n_in, n_out, bias=False, rule="stdp_sj", plasticity="online", backend="torch")
    with torch.no_grad():
        m.W.copy_(w_init)
    out = m(x)
    assert torch.equal(out, torch.stack(outs))
    assert_close(m.W, fc.weight, ops=T * (B * 6 + 8), scale=float(w_init.abs().max()))
    assert (fc.weight - w_init).abs().max() > 0.1


def test_layer_window_equals_spikingjelly_and_changes_its_weight():
    learning, neuron = _sj()
    g = torch.Generator().manual_seed(3)
    T, B, n_in, n_out = 9, 4, 6, 3
    m = flexdsl.load("""layer P:
    neuron lif
    input spikes size 6
    size 3
    synapses W from spikes to x:
        rule stdp_sj
""", backend="torch")
    fc = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        fc.weight.copy_(m.W)
    lif = neuron.LIFNode(tau=2.0, step_mode="m")
    learner = learning.STDPLearner(step_mode="m", synapse=fc, sn=lif, tau_pre=2.0, tau_post=2.0)
    x = _spikes(g, T, B, n_in, scale=3.0)
    with torch.no_grad():
        ref_out = lif(fc(x))
    ref_w = fc.weight + learner.step(on_grad=False)
    out = m(x)
    assert torch.equal(out, ref_out)
    assert_close(m.W, ref_w, ops=T * B * 6 + T * 8, scale=float(ref_w.abs().max()))
    assert_close(m.last_dw("W"), ref_w - fc.weight, ops=T * B * 6 + T * 8, scale=float(ref_w.abs().max()))


def test_mstdp_equals_spikingjelly():
    learning, neuron = _sj()
    g = torch.Generator().manual_seed(4)
    T, B, n_in, n_out = 10, 3, 5, 4
    fc = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        fc.weight.copy_(0.6 * torch.randn(n_out, n_in, generator=g))
    lif = neuron.LIFNode(tau=2.0, step_mode="s")
    learner = learning.MSTDPLearner(step_mode="s", synapse=fc, sn=lif, tau_pre=2.0, tau_post=3.0)
    x = _spikes(g, T, B, n_in, p=0.5, scale=2.0)
    reward = torch.randn(T, B, generator=g)
    w0 = fc.weight.detach().clone()
    posts, total = [], torch.zeros_like(w0)
    for t in range(T):
        with torch.no_grad():
            posts.append(lif(fc(x[t])))
        total += learner.step(reward[t], on_grad=False)
    rule = flexdsl.load_rule("mstdp", tau_post=3.0)
    dw = rule.window(x, torch.stack(posts), w0, reward=reward)
    assert torch.stack(posts).mean() > 0.05 and total.abs().max() > 0.1
    assert_close(dw, total, ops=T * B * 6 + T * 8)
    # a scalar reward per step ([T]) is the same for every sample
    rule.reset()
    assert torch.allclose(rule.window(x, torch.stack(posts), w0, reward=reward[:, 0]),
                          flexdsl.load_rule("mstdp", tau_post=3.0).window(
                              x, torch.stack(posts), w0, reward=reward[:, :1].expand(T, B).contiguous()))


def test_mstdpet_equals_spikingjelly():
    learning, neuron = _sj()
    g = torch.Generator().manual_seed(5)
    T, n_in, n_out = 14, 5, 4
    fc = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        fc.weight.copy_(0.3 * torch.randn(n_out, n_in, generator=g))
    lif = neuron.LIFNode(tau=2.0, step_mode="s")
    learner = learning.MSTDPETLearner(step_mode="s", synapse=fc, sn=lif, tau_pre=2.0, tau_post=3.0, tau_trace=4.0)
    x = _spikes(g, T, n_in, p=0.5, scale=6.0)
    reward = torch.randn(T, generator=g)
    w0 = fc.weight.detach().clone()
    posts, total = [], torch.zeros_like(w0)
    for t in range(T):
        with torch.no_grad():
            posts.append(lif(fc(x[t])))
        total += learner.step(float(reward[t]), on_grad=False)
    post = torch.stack(posts)
    assert post.sum() > 0
    dw = flexdsl.load_rule("mstdpet", tau_post=3.0, tau_z=4.0).window(x[:, None], post[:, None], w0, reward=reward)
    assert total.abs().max() > 0.01
    assert_close(dw, total, ops=T * 12 + T * 8)  # (eligibility and reward traces: T steps each)


# ---------------------------------------------------------------- Norse
def test_tsodyks_markram_equals_norse():
    from norse.torch.functional.tsodyks_makram import TsodyksMakramParameters, TsodyksMakramState, stp_step

    g = torch.Generator().manual_seed(6)
    T, B, n = 60, 2, 5
    z = _spikes(g, T, B, n, p=0.3)
    s = TsodyksMakramState(u=torch.zeros(B, n), x=torch.ones(B, n))
    outs = []
    for t in range(T):
        o, s = stp_step(z[t], s, TsodyksMakramParameters(), dt=0.001)
        outs.append(o)
    ref = torch.stack(outs)
    rule = flexdsl.load_rule("tsodyks_markram")
    assert not rule.changes_weight and rule.has_output
    got = torch.cat([rule.carry(z[:25]), rule.carry(z[25:])])  # kept across calls
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-15)
    assert ref.max() > 0.3 and (ref[ref > 0].min() < 0.2)  # depression shows
    # in a layer: the current is W times what the synapse carries
    m = flexdsl.feedforward("lif", n, 3, bias=False, rule="tsodyks_markram", backend="torch")
    cur = m.W @ ref.unsqueeze(-1)
    lif = flexdsl.load("lif", backend="torch")
    assert torch.equal(m(z), lif(cur.squeeze(-1)))


# ---------------------------------------------------------------- Brian2
SONG_NEURON = """neuron SongLIF:
    input x
    param dt = 0.1 ms
    param taum = 10 ms
    param taue = 5 ms
    param Ee = 0 mV
    param vt = -54 mV
    param vr = -60 mV
    param El = -74 mV
    state v = vr
    state ge = 0
    equations:
        dv/dt = (ge * (Ee - vr) + El - v) / taum
        dge/dt = -ge / taue
    update:
        ge += x
    spike when v > vt
    on spike:
        v = vr
    output spike
"""


def _brian2_song(spikes: np.ndarray, w0: np.ndarray, dt: float):
    import brian2 as b2

    b2.prefs.codegen.target = "numpy"
    b2.start_scope()
    b2.defaultclock.dt = dt * b2.second
    n = spikes.shape[1]
    ns = {"taum": 10 * b2.ms, "taupre": 20 * b2.ms, "taupost": 20 * b2.ms, "taue": 5 * b2.ms, "Ee": 0 * b2.mV,
          "vt": -54 * b2.mV, "vr": -60 * b2.mV, "El": -74 * b2.mV, "gmax": 0.01}
    ns["dApre"] = 0.01 * ns["gmax"]
    ns["dApost"] = -0.01 * ns["taupre"] / ns["taupost"] * 1.05 * ns["gmax"]
    ti, ii = np.nonzero(spikes)
    inp = b2.SpikeGeneratorGroup(n, ii, ti * dt * b2.second)
    neurons = b2.NeuronGroup(1, "dv/dt = (ge * (Ee-vr) + El - v) / taum : volt\ndge/dt = -ge / taue : 1",
                             threshold="v>vt", reset="v = vr", method="exact", namespace=ns)
    neurons.v = ns["vr"]
    S = b2.Synapses(inp, neurons, """w : 1
        dApre/dt = -Apre / taupre : 1 (event-driven)
        dApost/dt = -Apost / taupost : 1 (event-driven)""",
                    on_pre="ge += w\nApre += dApre\nw = clip(w + Apost, 0, gmax)",
                    on_post="Apost += dApost\nw = clip(w + Apre, 0, gmax)", namespace=ns)
    S.connect()
    S.w = w0
    mon = b2.SpikeMonitor(neurons)
    b2.run(spikes.shape[0] * b2.defaultclock.dt)
    return np.round(np.asarray(mon.t / b2.second) / dt).astype(int), np.asarray(S.w)


def test_song_stdp_equals_brian2_closed_loop(tmp_path):
    """Brian2's examples/synapses/STDP.py (1000 Poisson inputs at 15 Hz onto one LIF neuron, exact
    event-driven traces, clipped weights) with the same input trains: the postsynaptic spike steps
    are Brian2's and the weights equal Brian2's within 1e-6 of gmax after 0.4 s."""
    dt, steps, n = 1e-4, 4000, 1000
    rng = np.random.default_rng(0)
    spikes = rng.random((steps, n)) < 15 * dt
    w0 = rng.random(n) * 0.01
    b2_spikes, b2_w = _brian2_song(spikes, w0, dt)
    (tmp_path / "song.neuron").write_text(SONG_NEURON)
    m = flexdsl.feedforward(str(tmp_path / "song.neuron"), n, 1, bias=False, rule="stdp_song", plasticity="online",
                            backend="torch")
    with torch.no_grad():
        m.W.copy_(torch.tensor(w0)[None])
    x = torch.tensor(spikes, dtype=F64)[:, None, :]
    with torch.no_grad():
        out = torch.cat([m(x[:1500]), m(x[1500:])])  # two calls: the online state carries over
    ours = np.nonzero(out[:, 0, 0].numpy())[0]
    assert len(b2_spikes) > 10
    assert np.array_equal(ours, b2_spikes)
    assert np.abs(m.W.detach().numpy()[0] - b2_w).max() < 1e-6 * 0.01
    assert np.abs(b2_w - w0).max() > 1e-4  # the weights did move


def test_triplet_equals_brian2_given_trains():
    import brian2 as b2

    b2.prefs.codegen.target = "numpy"
    b2.start_scope()
    dt = 1e-3
    b2.defaultclock.dt = dt * b2.second
    rng = np.random.default_rng(1)
    steps, n_pre, n_post = 400, 6, 3
    pre = rng.random((steps, n_pre)) < 0.04
    post = rng.random((steps, n_post)) < 0.04
    rule = flexdsl.load_rule("triplet", A2_plus=4e-3)
    p = {k: float(v) for k, v in rule.param_values().items()}
    ti, ii = np.nonzero(pre)
    tj, jj = np.nonzero(post)
    G_pre = b2.SpikeGeneratorGroup(n_pre, ii, ti * dt * b2.second)
    G_post = b2.SpikeGeneratorGroup(n_post, jj, tj * dt * b2.second)
    ns = {"tau_plus": p["tau_plus"] * b2.ms, "tau_minus": p["tau_minus"] * b2.ms, "tau_x": p["tau_x"] * b2.ms,
          "tau_y": p["tau_y"] * b2.ms, "A2p": p["A2_plus"], "A3p": p["A3_plus"], "A2m": p["A2_minus"],
          "A3m": p["A3_minus"]}
    S = b2.Synapses(G_pre, G_post, """w : 1
        dr1/dt = -r1 / tau_plus : 1 (event-driven)
        dr2/dt = -r2 / tau_x : 1 (event-driven)
        do1/dt = -o1 / tau_minus : 1 (event-driven)
        do2/dt = -o2 / tau_y : 1 (event-driven)""",
                    on_pre="w = w - o1 * (A2m + A3m * r2)\nr1 += 1\nr2 += 1",
                    on_post="w = w + r1 * (A2p + A3p * o2)\no1 += 1\no2 += 1", namespace=ns)
    S.connect()
    w0 = rng.random((n_post, n_pre))
    S.w[:] = w0.T.reshape(-1)  # Brian2 orders synapses by presynaptic neuron
    b2.run(steps * b2.defaultclock.dt)
    b2_w = np.asarray(S.w).reshape(n_pre, n_post).T
    got = rule.online(torch.tensor(pre, dtype=F64)[:, None], torch.tensor(post, dtype=F64)[:, None], torch.tensor(w0))
    assert np.abs(b2_w - w0).max() > 1e-3
    assert np.allclose(got.numpy(), b2_w, rtol=1e-6, atol=1e-12)


# ---------------------------------------------------------------- spike-time sums (the papers' formulas)
def _trains(seed: int, steps: int, n_pre: int, n_post: int, p: float = 0.05):
    rng = np.random.default_rng(seed)
    return rng.random((steps, n_pre)) < p, rng.random((steps, n_post)) < p


def test_additive_all_to_all_is_the_pair_sum():
    """Window (weights held), all-to-all: every pair with t_pre <= t_post adds A+ exp(-(t_post-t_pre)/tau+),
    every pair with t_post < t_pre subtracts A- exp(-(t_pre-t_post)/tau-) (Morrison et al. 2008, 4.1)."""
    dt, steps = 0.5, 300
    pre, post = _trains(2, steps, 5, 4)
    rule = flexdsl.load_rule("stdp_additive", dt=dt, tau_plus=15.0, tau_minus=25.0, w_min=-10.0, w_max=10.0)
    ref = np.zeros((4, 5))
    for j in range(4):
        for i in range(5):
            for tq in np.nonzero(post[:, j])[0]:
                for tp in np.nonzero(pre[:, i])[0]:
                    d = (tq - tp) * dt
                    ref[j, i] += 0.01 * math.exp(-d / 15.0) if d >= 0 else -0.0105 * math.exp(d / 25.0)
    dw = rule.window(torch.tensor(pre, dtype=F64)[:, None], torch.tensor(post, dtype=F64)[:, None],
                     torch.zeros(4, 5))
    assert np.abs(ref).max() > 0.01
    assert np.allclose(dw.numpy(), ref, rtol=1e-9, atol=1e-14)


def test_nearest_spike_pairs_only_neighbours():
    dt, steps = 1.0, 400
    pre, post = _trains(3, steps, 4, 3, p=0.04)
    rule = flexdsl.load_rule("stdp_nearest", w_min=-10.0, w_max=10.0)
    ref = np.zeros((3, 4))
    for j in range(3):
        for i in range(4):
            tp_all, tq_all = np.nonzero(pre[:, i])[0], np.nonzero(post[:, j])[0]
            for tq in tq_all:  # potentiation: the latest presynaptic spike at or before it
                before = tp_all[tp_all <= tq]
                if len(before):
                    ref[j, i] += 0.01 * math.exp(-(tq - before[-1]) * dt / 20.0)
            for tp in tp_all:  # depression: the latest postsynaptic spike strictly before it
                before = tq_all[tq_all < tp]
                if len(before):
                    ref[j, i] -= 0.0105 * math.exp(-(tp - before[-1]) * dt / 20.0)
    dw = rule.window(torch.tensor(pre, dtype=F64)[:, None], torch.tensor(post, dtype=F64)[:, None],
                     torch.zeros(3, 4))
    assert np.allclose(dw.numpy(), ref, rtol=1e-9, atol=1e-14)


def test_multiplicative_soft_bounds_event_by_event():
    """Online: at a postsynaptic spike w += A+ (w_max - w) x_pre, at a presynaptic one w -= A- w x_post,
    the traces as sums over earlier spikes of exp(-age/tau) (computed from spike times here)."""
    dt, steps = 1.0, 300
    pre, post = _trains(4, steps, 3, 2, p=0.08)
    rule = flexdsl.load_rule("stdp_multiplicative", A_plus=0.1, A_minus=0.12)
    w = np.full((2, 3), 0.5)
    for t in range(steps):
        for j in range(2):
            for i in range(3):
                if pre[t, i]:
                    x_post = sum(math.exp(-(t - s) * dt / 20.0) for s in np.nonzero(post[:t, j])[0])
                    w[j, i] -= 0.12 * w[j, i] * x_post
                if post[t, j]:
                    x_pre = sum(math.exp(-(t - s) * dt / 20.0) for s in np.nonzero(pre[:t + 1, i])[0])
                    w[j, i] += 0.1 * (1.0 - w[j, i]) * x_pre
    got = rule.online(torch.tensor(pre, dtype=F64)[:, None], torch.tensor(post, dtype=F64)[:, None],
                      torch.full((2, 3), 0.5))
    assert np.abs(w - 0.5).max() > 0.05 and (w > 0).all() and (w < 1).all()
    assert np.allclose(got.numpy(), w, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- semantics
def test_window_is_held_weights_and_online_sees_each_change():
    g = torch.Generator().manual_seed(7)
    pre, post = _spikes(g, 20, 2, 4, p=0.3), _spikes(g, 20, 2, 3, p=0.3)
    w = torch.rand(3, 4, generator=g)
    rule = flexdsl.load_rule("stdp_multiplicative", A_plus=0.05, A_minus=0.05)
    dw = rule.window(pre, post, w)
    rule.reset()
    online = rule.online(pre, post, w)
    rule.reset()
    steps = w.clone()
    for t in range(20):  # online = one window per step, the weights updated in between (no bound reached)
        steps = steps + rule.window(pre[t:t + 1], post[t:t + 1], steps)
    assert torch.allclose(online, steps, rtol=1e-12, atol=1e-14)
    assert (online - (w + dw)).abs().max() > 1e-4  # the two semantics differ


def test_streams_cut_into_calls_equal_one_call():
    g = torch.Generator().manual_seed(8)
    pre, post = _spikes(g, 30, 3, 5, p=0.2), _spikes(g, 30, 3, 4, p=0.2)
    w = torch.rand(4, 5, generator=g)
    for name in ("stdp_sj", "triplet", "mstdp"):
        kw = {"reward": torch.randn(30, 3, generator=g)} if name == "mstdp" else {}
        one = flexdsl.load_rule(name)
        whole = one.window(pre, post, w, **kw)
        parts = flexdsl.load_rule(name)
        cut = sum(parts.window(pre[a:b], post[a:b], w, **{k: v[a:b] for k, v in kw.items()})
                  for a, b in ((0, 7), (7, 8), (8, 30)))
        assert torch.allclose(cut, whole, rtol=1e-12, atol=1e-14), name
        parts.reset()
        assert torch.allclose(parts.window(pre, post, w, **kw), whole, rtol=1e-12, atol=1e-14)


def test_layer_online_chunks_equal_one_call_and_bounds_hold():
    g = torch.Generator().manual_seed(9)
    x = _spikes(g, 40, 2, 6, p=0.5, scale=1.0)

    def make():
        torch.manual_seed(0)
        m = flexdsl.feedforward("lif", 6, 3, rule="stdp_additive", plasticity="online", backend="torch",
                                rule_params={"A_plus": 0.2, "A_minus": 0.2, "w_max": 0.9})
        with torch.no_grad():
            m.W.uniform_(0.5, 0.9)
        return m

    a, b = make(), make()
    out_a = a(x)
    out_b = torch.cat([b(x[:13]), b(x[13:])])
    assert torch.equal(out_a, out_b)
    assert torch.allclose(a.W, b.W, rtol=1e-12, atol=1e-14)
    assert a.W.min() >= 0.0 and a.W.max() <= 0.9
    assert ((a.W == 0.9) | (a.W == 0.0)).any()  # the bound was reached and held


# ---------------------------------------------------------------- gradients through the rule
def _fd(f, p: torch.Tensor, eps: float = 1e-6) -> float:
    with torch.no_grad():
        p0 = p.detach().clone()
        p.copy_(p0 + eps)
        up = f().item()
        p.copy_(p0 - eps)
        down = f().item()
        p.copy_(p0)
    return (up - down) / (2 * eps)


@pytest.mark.parametrize("name, learn", [("stdp_additive", ["A_plus", "A_minus", "tau_plus", "tau_minus"]),
                                         ("triplet", ["A3_plus", "tau_y", "tau_x"]),
                                         ("stdp_multiplicative", ["A_plus", "w_max"])])
def test_learnable_constants_match_finite_differences(name, learn):
    """The weight after several online steps (and a window's change), differentiated into the rule's
    constants: autograd through the generated step equals central finite differences (float64)."""
    g = torch.Generator().manual_seed(10)
    pre, post = _spikes(g, 40, 2, 4, p=0.25), _spikes(g, 40, 2, 3, p=0.25)
    w0 = torch.rand(3, 4, generator=g) * 0.5 + 0.25
    target = torch.rand(3, 4, generator=g)
    rule = flexdsl.load_rule(name, learnable=learn)
    assert sorted(n for n, _ in rule.named_parameters()) == sorted(learn)

    def loss_online():
        rule.reset()
        return ((rule.online(pre, post, w0) - target) ** 2).sum()

    def loss_window():
        rule.reset()
        return ((w0 + 30 * rule.window(pre, post, w0) - target) ** 2).sum()

    for loss in (loss_online, loss_window):
        grads = torch.autograd.grad(loss(), [getattr(rule, n) for n in learn])
        for n, gr in zip(learn, grads):
            fd = _fd(loss, getattr(rule, n))
            assert abs(gr.item() - fd) <= 1e-4 * max(1.0, abs(fd)), (name, n, gr.item(), fd)
        assert any(abs(gr.item()) > 1e-6 for gr in grads)


LEARN_RULE = """rule LEARN:
    param tau = 3.0 learnable
    param A = 0.02 learnable
    state x = 0
    state y = 0
    update:
        x = x - x / tau + pre
        y = y - y / tau + post
        w += A * w * (post * x - pre * y)
"""


@pytest.mark.parametrize("chosen", ["in the file", "at load"])
def test_the_rules_derived_backward_is_the_gradient_the_runtime_computes(chosen):
    """A rule's step has a backward derived symbolically, like a neuron's (`rule.ir.core_backward`, printed
    by `flexdsl show x.rule` for a rule with learnable constants): chained backwards through the steps of
    an online run (batch 1: Brian2's sequential updates), it gives the gradient of the final weights into
    the constants that autograd through the runtime's generated step gives (float64). The constants are
    learnable by the file's flags, or by `load_rule(text, learnable=[...])` on a text without them: the
    same derived backward either way."""
    g = torch.Generator().manual_seed(4)
    T, n_pre, n_post = 12, 5, 3
    pre, post = _spikes(g, T, 1, n_pre, p=0.3), _spikes(g, T, 1, n_post, p=0.3)
    w0 = torch.rand(n_post, n_pre, generator=g) + 0.5
    G = torch.randn(n_post, n_pre, generator=g)
    if chosen == "in the file":
        rule = flexdsl.load_rule(LEARN_RULE)
    else:
        plain = LEARN_RULE.replace(" learnable", "")
        assert "learnable" not in plain and "grad_tau" not in flexdsl.load_rule(plain).ir.source("torch")
        rule = flexdsl.load_rule(plain, learnable=["tau", "A"])
        assert pickle.loads(pickle.dumps(rule)).ir.core_backward is not None  # (the choice travels with it)
    tau, A = rule.tau, rule.A
    auto = torch.autograd.grad((rule.online(pre, post, w0) * G).sum(), [tau, A])
    # the derived backward by hand: the forward steps of the reference core, then the VJPs in reverse
    core, back = rule.ir.reference_module.core, rule.ir.core_backward
    t_, a_ = tau.detach(), A.detach()
    x, y, w = torch.zeros(1, n_pre), torch.zeros(n_post, 1), w0.clone()
    saved = []
    for t in range(T):
        p_t, q_t = pre[t, 0][None, :], post[t, 0][:, None]  # (broadcast to [n_post, n_pre] per synapse)
        saved.append((p_t, q_t, x, y, w))
        _, x, y, w = core(p_t, q_t, x, y, w, t_, a_)
    # every synapse a lane with its own copy of the traces (the copies have equal values): the lanes'
    # backwards are independent, and a constant's gradient is the sum over lanes and steps
    gx, gy, gw = torch.zeros(n_post, n_pre), torch.zeros(n_post, n_pre), G.clone()
    g_tau, g_a = torch.zeros(()), torch.zeros(())
    for p_t, q_t, x, y, w in reversed(saved):
        out = back(p_t, q_t, x, y, w, torch.zeros_like(w), gx, gy, gw, t_, a_)
        gx, gy, gw = (torch.broadcast_to(o, (n_post, n_pre)) for o in out[2:5])
        g_tau = g_tau + out[5].sum()
        g_a = g_a + out[6].sum()
    assert torch.allclose(auto[0], g_tau, rtol=1e-10, atol=1e-14), (auto[0], g_tau)
    assert torch.allclose(auto[1], g_a, rtol=1e-10, atol=1e-14), (auto[1], g_a)
    assert abs(g_tau) > 1e-6 and abs(g_a) > 1e-6


def test_show_prints_a_rule_and_its_derived_backward(tmp_path):
    """`flexdsl show x.rule`: the generated step and parts, where each state lives, the window's change, and
    for a rule with learnable constants the step's backward derived symbolically; `flexdsl check` says ok."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    f = tmp_path / "learn.rule"
    f.write_text(LEARN_RULE)
    outs = {}
    for path in (f, root / "neurons" / "stdp_sj.rule"):
        r = subprocess.run([sys.executable, "-m", "flexdsl", "show", str(path)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
        outs[path.name] = r.stdout
    learn, sj = outs["learn.rule"], outs["stdp_sj.rule"]
    for out in (learn, sj):
        assert "def step(" in out and "# where each state lives:" in out and "# the window's change:" in out
    assert "def core_backward(" in learn and "grad_tau =" in learn and "grad_A =" in learn
    assert "learnable constants (tau, A)" in learn
    assert "core_backward" not in sj  # (no learnable constant: no gradient into the rule)
    r = subprocess.run([sys.executable, "-m", "flexdsl", "check", str(f)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and "ok — rule LEARN" in r.stdout, r.stdout + r.stderr


def test_show_and_check_of_a_rule_take_learnable_and_refuse_what_a_rule_has_not(tmp_path):
    """`flexdsl show x.rule --learnable tau,A` prints the derived backward of those constants on a rule
    that declares none learnable (as `load_rule(..., learnable=...)`); an unknown name is a located error
    with a suggestion; `--surrogate` on a rule and either option on a layer file are errors of `show`, and
    a note of `check` (which checks the file as written), never silently ignored."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    f = tmp_path / "plain.rule"
    f.write_text(LEARN_RULE.replace(" learnable", ""))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "flexdsl", *args], capture_output=True, text=True, env=env,
                              timeout=300)

    plain, chosen = cli("show", str(f)), cli("show", str(f), "--learnable", "tau,A")
    assert plain.returncode == 0 and "core_backward" not in plain.stdout
    assert chosen.returncode == 0 and "grad_tau =" in chosen.stdout and "grad_A =" in chosen.stdout
    assert "learnable constants (tau, A)" in chosen.stdout
    assert cli("check", str(f), "--learnable", "A").returncode == 0
    bad = cli("show", str(f), "--learnable", "tua")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and "did you mean `tau`" in bad.stderr
    for args in (("show", str(f), "--surrogate", "atan()"), ("show", str(root / "neurons" / "rlif.layer"),
                                                              "--learnable", "tau")):
        r = cli(*args)
        assert r.returncode == 1 and "Traceback" not in r.stderr and "applies to neuron models" in r.stderr, r.stderr
    r = cli("check", str(f), "--surrogate", "atan()")  # (check, of a directory too: a note, the file as written)
    assert r.returncode == 0 and "note: --surrogate applies to neuron models" in r.stderr and "ok — rule" in r.stdout


def test_layer_with_learnable_rule_keeps_its_change_as_state():
    g = torch.Generator().manual_seed(11)
    x = _spikes(g, 15, 2, 5, p=0.5, scale=2.0)
    torch.manual_seed(0)
    m = flexdsl.feedforward("lif", 5, 3, rule="stdp_additive", backend="torch",
                            rule_params={"learnable": ["A_plus"], "w_min": -5.0, "w_max": 5.0})
    w0 = m.W.detach().clone()
    m(x)
    m(x)
    d = m.plastic_change("W")
    assert d is not None and d.requires_grad and d.abs().max() > 0
    assert torch.equal(m.W, w0)  # the parameter itself is unchanged: the change is state
    d.sum().backward()
    assert m.rules["W"].A_plus.grad is not None and m.rules["W"].A_plus.grad.abs() > 0
    assert m.W.grad is not None  # the change depends on the weights it started from
    m.reset()
    assert m.plastic_change("W") is None


# ---------------------------------------------------------------- bad input
def test_a_learnable_constant_trained_out_of_its_constraint_is_a_located_error():
    """Training moves a learnable constant with no reparametrization: an optimizer step that takes
    `tau_plus` (`where tau_plus > 0`) below 0, or makes a constant NaN, is a located error at the next
    call (online, window, and a plastic layer's call), not weights computed with a negative time
    constant; putting a valid value back makes the rule run again."""
    g = torch.Generator().manual_seed(12)
    pre, post = _spikes(g, 6, 1, 4, p=0.5), _spikes(g, 6, 1, 3, p=0.5)
    w0 = torch.rand(3, 4, generator=g)
    rule = flexdsl.load_rule("stdp_additive", learnable=["tau_plus", "A_plus"])
    rule.online(pre, post, w0)
    with torch.no_grad():
        rule.tau_plus.fill_(-0.5)  # (as a too large step of an optimizer would)
    for call in (rule.online, rule.window):
        with pytest.raises(flexdsl.FlexDSLError) as e:
            call(pre, post, w0)
        assert "`tau_plus` is -0.5 after training" in str(e.value) and "tau_plus > 0" in str(e.value)
        assert "stdp_additive.rule:" in str(e.value)
    with torch.no_grad():
        rule.tau_plus.fill_(20.0)
        rule.A_plus.fill_(float("nan"))
    with pytest.raises(flexdsl.FlexDSLError, match="`A_plus` is nan after training"):
        rule.online(pre, post, w0)
    with torch.no_grad():
        rule.A_plus.fill_(0.01)
    assert torch.isfinite(rule.online(pre, post, w0)).all()
    m = flexdsl.feedforward("lif", 4, 3, rule="stdp_additive", backend="torch",
                            rule_params={"learnable": ["tau_plus"], "w_min": -5.0, "w_max": 5.0})
    m(pre * 2)
    with torch.no_grad():
        m.rules["W"].tau_plus.fill_(-1.0)
    with pytest.raises(flexdsl.FlexDSLError, match="`tau_plus` is -1 after training"):
        m(pre * 2)


def _rule_error(text: str, **kw) -> FlexDSLError:
    with pytest.raises(FlexDSLError) as e:
        r = flexdsl.load_rule(text, **kw)
        r.bounds()
    return e.value


BASE = """rule R:
    param tau = 2.0
    param lo = 0
    param hi = 1
    state x = 0
"""


@pytest.mark.parametrize("body, words, line", [
    ("    on pre:\n        w += y\n", "unknown name `y`", 7),
    ("    on pre:\n        q += 1\n", "`q`, which is not a state", 7),
    ("    on spike:\n        w += 1\n", "unknown synaptic event `on spike`", 6),
    ("    on pro:\n        w += 1\n", "did you mean `pre`", 6),
    ("    input pre\n", "presynaptic spikes already", 6),
    ("    weight w where hi <= w <= lo\n", "cannot hold", 6),
    ("    weight w where 0 <= w <= x\n", "params only; `x` is not a param", 6),
    ("    param w = 1\n", "is the rule's weight", 6),
    ("    on pre:\n        w += 1\n    on pre:\n        w += 2\n", "a second `on pre`", 8),
    ("    update:\n        x = x + pre\n    on post:\n        w += x * post_trace\n", "unknown name `post_trace`", 9),
    ("    update:\n        x = x + pre * randn()\n", "cannot draw random numbers (`randn()`)", 7),
    ("    param dt = 1 ms\n    param tau_x = 5 ms\n    equations:\n        dx/dt = -x / tau_x + 0.1 * xi\n",
     "cannot draw random numbers (white noise `xi`)", 9),
])
def test_bad_rules_are_located(body, words, line):
    e = _rule_error(BASE + body)
    assert words in str(e)
    assert e.line == line, str(e)
    assert "^" in str(e)


def test_learnable_constant_without_a_derivative_is_refused():
    text = """rule R:
    param theta = 0.5 learnable
    state x = 0
    update:
        x = x * 0.5 + pre
        w += where(x > theta, 0.01, 0) * post
"""
    e = _rule_error(text)
    assert "no derivative reaches it" in str(e) and e.line == 2
    e = _rule_error(text.replace(" learnable", ""), learnable=["theta"])
    assert "no derivative reaches it" in str(e)


def test_bad_calls_are_located_errors():
    rule = flexdsl.load_rule("mstdp")
    pre, post, w = torch.zeros(5, 2, 4), torch.zeros(5, 2, 3), torch.zeros(3, 4)
    with pytest.raises(FlexDSLError, match="reads the modulator `reward`"):
        rule.window(pre, post, w)
    with pytest.raises(FlexDSLError, match="modulator `reward` has shape"):
        rule.window(pre, post, w, reward=torch.zeros(5, 3))
    with pytest.raises(FlexDSLError, match="no modulator `rewrd`"):
        rule.window(pre, post, w, reward=0.0, rewrd=1.0)
    with pytest.raises(FlexDSLError, match="connects 4 presynaptic"):
        rule.window(pre, post, torch.zeros(4, 4), reward=0.0)
    rule.window(pre, post, w, reward=torch.zeros(5))
    with pytest.raises(FlexDSLError, match="another batch size"):
        rule.window(torch.zeros(5, 3, 4), torch.zeros(5, 3, 3), w, reward=0.0)
    with pytest.raises(FlexDSLError, match="has no `output`"):
        flexdsl.load_rule("stdp_sj").carry(pre)
    with pytest.raises(FlexDSLError, match="no rule file `stdpp` and no library rule"):
        flexdsl.load_rule("stdpp")


@pytest.mark.parametrize("synapse, words", [
    ("synapses W from spikes to x:\n        rule stdp_sj sometimes\n", "unknown plasticity semantics `sometimes`"),
    ("synapses W from spikes to x:\n        rule nope\n", "no rule file `nope`"),
    ("synapses W from spikes to x:\n        connect one_to_one\n        rule stdp_sj\n", "one_to_one"),
    ("synapses W from spikes to x:\n        state e = 0\n", "belong in a plasticity rule"),
    ("synapses W from spikes to x:\n        delay 2\n        rule stdp_sj\n", "delayed synapses"),
])
def test_bad_plastic_layers_are_located(synapse, words):
    text = "layer P:\n    neuron lif\n    input spikes size 4\n    size 4\n    " + synapse
    with pytest.raises(FlexDSLError) as e:
        flexdsl.load(text)
    assert words in str(e.value)
    assert e.value.line is not None and e.value.line >= 5


def test_rule_on_recurrent_synapses_and_mismatched_dt_are_refused(tmp_path):
    text = ("layer P:\n    neuron lif\n    input spikes size 4\n    size 4\n    synapses W_in from spikes to x\n"
            "    synapses W_rec from spike to x:\n        rule stdp_sj\n")
    with pytest.raises(FlexDSLError, match="recurrent synapses"):
        flexdsl.load(text)
    with pytest.raises(FlexDSLError, match="steps by dt"):
        flexdsl.feedforward("norse_lif", 4, 3, rule="stdp_additive")  # Norse's dt 0.001 s, the rule's 1 ms steps
    m = flexdsl.feedforward("norse_lif", 4, 3, rule="stdp_additive", rule_params={"dt": 0.001})
    assert m.rules["W"].dt == 0.001
    with pytest.raises(TypeError, match="unexpected keyword"):
        flexdsl.feedforward("lif", 4, 3)(torch.zeros(2, 1, 4), reward=1.0)
    m = flexdsl.feedforward("lif", 4, 3, rule="mstdp")
    with pytest.raises(FlexDSLError, match="no modulator `rewad`"):
        m(torch.zeros(2, 1, 4), rewad=1.0)
    assert m(torch.zeros(2, 1, 4), reward=torch.ones(2)).shape == (2, 1, 3)


# ---------------------------------------------------------------- the two ways a step runs, the kernels
@pytest.mark.parametrize("name", ["stdp_sj", "stdp_additive", "triplet", "stdp_multiplicative"])
def test_products_equal_the_step_per_synapse(name):
    """A rule whose change factors runs as products over the samples (window) or rank-B updates
    (online); the same rule's whole step per synapse and sample gives the same weights."""
    g = torch.Generator().manual_seed(12)
    pre, post = _spikes(g, 25, 3, 5, p=0.3), _spikes(g, 25, 3, 4, p=0.3)
    w = torch.rand(4, 5, generator=g) * 0.5 + 0.25
    r = flexdsl.load_rule(name)
    assert r.separable
    p2, q2, mods = r._inputs(pre, post, w, {}, "test")
    for online in (False, True):
        r.reset()
        fast = r._online_products(p2, q2, w, mods) if online else r._window_products(p2, q2, w, mods)
        r.reset()
        slow = r._steps(p2, q2, w, mods, online=online)
        assert torch.allclose(fast, slow, rtol=1e-12, atol=1e-14), (name, online)


def test_linear_scan_kernel_equals_the_loop():
    """The Triton trace kernel (through the interpreter here) equals the step-by-step loop in float32."""
    from flexdsl.backends.triton.rules import linear_scan

    g = torch.Generator().manual_seed(13)
    u = _spikes(g, 37, 300).float()
    x0 = torch.rand(300, generator=g).float()
    a = torch.tensor(0.8, dtype=torch.float32)
    x, ref = x0.clone(), []
    for t in range(37):
        x = a * x + u[t]
        ref.append(x)
    assert torch.equal(linear_scan(a, u, x0), torch.stack(ref))


@pytest.mark.parametrize("name", ["stdp_sj", "stdp_additive", "triplet"])
def test_layer_online_products_equal_the_step_per_synapse(name, monkeypatch):
    """A big layer's online loop runs a factoring rule as rank-B products per step (its presynaptic side
    over the whole call first); a small one runs the rule's whole step per synapse: the same layer."""
    import flexdsl.runtime.plastic as plastic

    g = torch.Generator().manual_seed(14)
    x = _spikes(g, 30, 3, 6, p=0.5, scale=2.0)
    outs = []
    for limit in (1 << 30, 0):
        monkeypatch.setattr(plastic, "_PER_SYNAPSE", limit)
        torch.manual_seed(0)
        m = flexdsl.feedforward("lif", 6, 4, rule=name, plasticity="online", backend="torch",
                                rule_params={"w_min": -2.0, "w_max": 2.0} if name == "stdp_additive" else {})
        y = torch.cat([m(x[:11]), m(x[11:])])
        outs.append((y, m.W.detach().clone()))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.allclose(outs[0][1], outs[1][1], rtol=1e-12, atol=1e-14)


def test_rules_pickle_and_save_their_params():
    import pickle

    g = torch.Generator().manual_seed(15)
    pre, post = _spikes(g, 12, 2, 4), _spikes(g, 12, 2, 3)
    w = torch.rand(3, 4, generator=g)
    r = flexdsl.load_rule("stdp_additive", A_plus=0.02)
    r.tau_plus = 11.0
    with pytest.raises(FlexDSLError, match="violates the constraint"):
        r.tau_plus = -1.0
    r.window(pre[:5], post[:5], w)
    r2 = pickle.loads(pickle.dumps(r))  # mid-stream: its traces go along
    assert torch.equal(r2.window(pre[5:], post[5:], w), r.window(pre[5:], post[5:], w))
    r3 = flexdsl.load_rule("stdp_additive")
    r3.load_state_dict(r.state_dict())
    assert (r3.A_plus, r3.tau_plus) == (0.02, 11.0)
    m = flexdsl.feedforward("lif", 4, 3, rule="stdp_sj", backend="torch")
    m2 = pickle.loads(pickle.dumps(m))
    x = _spikes(g, 6, 2, 4, scale=3.0)
    assert torch.equal(m(x), m2(x)) and torch.equal(m.W, m2.W)


@pytest.mark.parametrize("mode", ["window", "online"])
def test_gradients_through_a_plastic_layer_use_the_weights_of_the_call(mode):
    """A plastic layer trained by gradient too: the call's gradients (inputs, weights) are those of the
    weights the call read, as a static layer with them gives, while the rule changes the weights after."""
    g = torch.Generator().manual_seed(16)
    torch.manual_seed(0)
    m = flexdsl.feedforward("lif", 4, 3, rule="stdp_sj", plasticity=mode, backend="torch")
    s = flexdsl.feedforward("lif", 4, 3, backend="torch")
    with torch.no_grad():
        s.W.copy_(m.W)
        s.bias.copy_(m.bias)
    x = _spikes(g, 6, 2, 4, p=0.5, scale=3.0).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, y2 = m(x), s(x2)
    if mode == "window":
        assert torch.equal(y, y2)
    (y * torch.arange(1.0, 7.0)[:, None, None]).sum().backward()
    (y2 * torch.arange(1.0, 7.0)[:, None, None]).sum().backward()
    assert not torch.equal(m.W, s.W)  # the rule changed the weights
    if mode == "window":
        assert torch.allclose(x.grad, x2.grad) and torch.allclose(m.W.grad, s.W.grad)
    else:  # every step's current reads that step's weights: dL/dW sums the steps' reads
        ref = []
        w_t = s.W.detach().clone()
        rule = flexdsl.load_rule("stdp_sj")
        xd = x.detach()
        lif = flexdsl.load("lif", backend="torch")
        wt = [w_t]
        for t in range(6):
            cur = xd[t] @ wt[-1].T + s.bias.detach()
            spk = lif(cur[None])[0]
            ref.append(spk)
            wt.append(rule.online(xd[t:t + 1], spk[None], wt[-1]))
        assert torch.equal(y, torch.stack(ref))
        W = s.W.detach().clone().requires_grad_()
        xg = x.detach().clone().requires_grad_()
        lif.reset()
        outs = [lif((xg[t] @ (W + (wt[t] - W).detach()).T + s.bias.detach())[None])[0] for t in range(6)]
        (torch.stack(outs) * torch.arange(1.0, 7.0)[:, None, None]).sum().backward()
        assert torch.allclose(x.grad, xg.grad) and torch.allclose(m.W.grad, W.grad)


CLOPATH_NEURON = """neuron MV_LIF:
    input x
    param tau = 10.0
    param v_rest = -70.6
    param v_th = -50.4
    param v_reset = -60.0
    state v = v_rest
    update:
        v = v + (v_rest - v + x) / tau
    spike when v > v_th
    on spike:
        v = v_reset
    output spike
"""


def test_clopath_equals_the_papers_equations_and_reads_the_neurons_voltage():
    """Clopath et al. 2010 (eqs. 2-4): the filtered potentials, LTD at presynaptic spikes from u_minus, LTP
    at every step from x_bar, u and u_plus; written here from the paper, with a given voltage trace; then
    in a layer, where `post_v` is the neuron's own `v` after each step (window and online)."""
    g = torch.Generator().manual_seed(17)
    T, n_pre, n_post = 300, 5, 3
    pre = _spikes(g, T, 1, n_pre, p=0.1)
    post = _spikes(g, T, 1, n_post, p=0.05)
    v = -70.0 + 30.0 * torch.rand(T, 1, n_post, generator=g)  # mV, often above theta_plus (-45.3)
    w0 = torch.full((n_post, n_pre), 0.5)
    rule = flexdsl.load_rule("clopath", A_LTP=8e-4, A_LTD=5e-4)
    p = {k: float(val) for k, val in rule.param_values().items()}
    x, um, up, w = np.zeros(n_pre), np.full(n_post, p["u_rest"]), np.full(n_post, p["u_rest"]), w0.numpy().copy()
    em, ep, ex = math.exp(-p["dt"] / p["tau_minus"]), math.exp(-p["dt"] / p["tau_plus"]), math.exp(-p["dt"] / p["tau_x"])
    dws = np.zeros_like(w)
    for t in range(T):
        u = v[t, 0].numpy()
        x = x * ex
        um = um * em + u * (1 - em)
        up = up * ep + u * (1 - ep)
        ltp = p["A_LTP"] * np.outer(np.maximum(u - p["theta_plus"], 0) * np.maximum(up - p["theta_minus"], 0), x) * p["dt"]
        s = pre[t, 0].numpy()
        x = x + s / p["tau_x"]  # (tau_x dx/dt = -x + X(t), X a sum of deltas: a jump of 1/tau_x)
        ltd = p["A_LTD"] * np.outer(np.maximum(um - p["theta_minus"], 0), s)
        dws += ltp - ltd
        w = np.clip(w + ltp - ltd, 0.0, 1.0)
    got = rule.online(pre, post, w0, post_v=v)
    assert np.abs(w - w0.numpy()).max() > 0.01
    assert np.allclose(got.numpy(), w, rtol=1e-9, atol=1e-12)
    rule.reset()
    assert np.allclose(rule.window(pre, post, w0, post_v=v).numpy(), dws, rtol=1e-9, atol=1e-12)
    with pytest.raises(FlexDSLError, match="value per postsynaptic neuron"):
        rule.window(pre, post, w0, post_v=v[:, :, :2])
    # in a layer: post_v is the neuron's v
    x_in = _spikes(g, 60, 2, n_pre, p=0.3, scale=1.0)
    for mode in ("window", "online"):
        torch.manual_seed(0)
        m = flexdsl.feedforward(CLOPATH_NEURON, n_pre, n_post, bias=False, rule="clopath", plasticity=mode,
                                backend="torch", rule_params={"A_LTP": 8e-4, "A_LTD": 5e-4})
        with torch.no_grad():
            m.W.uniform_(20.0, 40.0)
        w_start = m.W.detach().clone()
        lif = flexdsl.load(CLOPATH_NEURON, backend="torch", store_state_seqs=True)
        ref_rule = flexdsl.load_rule("clopath", A_LTP=8e-4, A_LTD=5e-4)
        out = m(x_in)
        if mode == "window":
            spk = lif(x_in @ w_start.T)
            assert torch.equal(out, spk)
            dw = ref_rule.window(x_in, spk, w_start, post_v=lif.state_seqs["v"])
            assert torch.allclose(m.last_dw("W"), ref_rule.bound(w_start + dw) - w_start, rtol=1e-9, atol=1e-12)
        else:
            w_t = w_start
            for t in range(60):
                spk = lif((x_in[t] @ w_t.T)[None])
                w_t = ref_rule.online(x_in[t:t + 1], spk, w_t, post_v=lif.state_seqs["v"])
            assert torch.allclose(m.W, w_t, rtol=1e-9, atol=1e-12)
        assert (m.W - w_start).abs().max() > 1e-4
    no_v = (CLOPATH_NEURON.replace("state v =", "state mem =").replace("v = v + (v_rest - v + x)", "mem = mem + "
                                                                                          "(v_rest - mem + x)")
            .replace("spike when v >", "spike when mem >").replace("        v = v_reset", "        mem = v_reset"))
    with pytest.raises(FlexDSLError, match="has no state or output `v`"):
        flexdsl.feedforward(no_v, n_pre, n_post, rule="clopath")


@pytest.mark.parametrize("name, words", [("lambda", "Python keyword"), ("_t0", "starts with `_`"),
                                         ("__import__", "starts with `_`")])
def test_rule_names_are_checked_like_a_neurons(name, words):
    """A rule's names become generated code's names: the neuron's rules apply (no `_` names, no keywords);
    names that the printer renames (a param called `torch`) still run."""
    text = f"rule R:\n    param {name} = 1.0\n    state x = 0\n    update:\n        x = x * 0.5 + pre\n" \
           f"        w += {name} * x * post\n"
    e = _rule_error(text)
    assert words in str(e) and e.line == 2
    ok = flexdsl.load_rule(text.replace(name, "torch"))
    assert torch.equal(ok.window(torch.ones(2, 1, 2), torch.ones(2, 1, 1), torch.ones(1, 2)),
                       torch.full((1, 2), 2.5))


def test_an_output_that_reads_the_postsynaptic_side_is_refused():
    text = ("rule R:\n    state u = 0\n    update:\n        u = u * 0.5 + pre\n        let r = u * pre * post\n"
            "    output r\n")
    e = _rule_error(text)
    assert "not a presynaptic value" in str(e) and e.line == 6
