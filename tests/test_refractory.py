"""Refractoriness (`refractory PERIOD`, `refractory while COND`, `unless refractory`) with
Brian2's meaning, and spike rules on an upward crossing (`spike when v crosses th`).

References: Brian2 2.9 with its units (numpy target, float64) for the dynamics; hand-written
float64 torch loops with their own spike autograd function for the surrogate gradients (what
the surrogate sees: `not_refractory * (1 - above_before) * S'(u)`); scipy's `solve_ivp` for the
action potentials of FitzHugh-Nagumo and Morris-Lecar (one spike each).
"""

from __future__ import annotations

import math
import textwrap
import warnings

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp
from scipy.signal import find_peaks

import flexdsl
from flexdsl._paths import NEURONS_DIR

from tolerances import assert_close, scan_ops

warnings.filterwarnings("ignore")
import brian2 as b2  # noqa: E402


def brian2_run(eqs, namespace, init, inputs, T, dt, method, threshold, reset=None, refractory=False,
               record=("v",), units=None):
    """A NeuronGroup with a constant input `I` per neuron; [T, n] spike raster and traces recorded
    after each step's reset, as numbers in units[name]."""
    b2.start_scope()
    b2.prefs.codegen.target = "numpy"
    b2.defaultclock.dt = dt * b2.ms
    kw = dict(threshold=threshold, refractory=refractory)
    if reset is not None:
        kw["reset"] = reset
    G = b2.NeuronGroup(len(inputs), eqs, method=method, namespace=namespace, **kw)
    for k, v in init.items():
        setattr(G, k, v)
    G.I = inputs
    M = b2.StateMonitor(G, list(record), record=True, when="end")
    S = b2.SpikeMonitor(G)
    b2.run(T * dt * b2.ms)
    spikes = np.zeros((T, len(inputs)))
    spikes[np.round(np.asarray(S.t / b2.ms) / dt).astype(int), np.asarray(S.i)] = 1.0
    units = units or {}
    return spikes, {k: np.asarray(getattr(M, k) / units.get(k, 1.0)).T for k in record}


def run(text_or_stem, x, **kw):
    m = flexdsl.load(text_or_stem, backend="torch", store_state_seqs=True, **kw) if "\n" not in text_or_stem \
        else flexdsl.loads(text_or_stem, backend="torch", store_state_seqs=True, **kw)
    with torch.no_grad():
        out = m(torch.as_tensor(x, dtype=torch.float64))
    return m, out if isinstance(out, tuple) else (out,)


# --------------------------------------------------------------------------- against Brian2
COUPLED = textwrap.dedent("""\
    neuron Coupled:
        input I : nA
        param dt = 0.1 ms
        param R = 10 Mohm
        param tau_m = 10 ms
        param tau_s = 5 ms
        param tau_w = 20 ms
        state v = 0 mV
        state I_s = 0 nA
        state w = 0 mV
        refractory 2 ms
        equations method {method}:
            dv/dt = (-v + R * I_s + R * I) / tau_m unless refractory
            dI_s/dt = -I_s / tau_s
            dw/dt = (v - w) / tau_w
        spike when v > 15 mV
        on spike:
            v = 0 mV
            I_s += 0.5 nA
        output spike
    """)
COUPLED_B2 = """
dv/dt = (-v + R*I_s + R*I)/tau_m : volt (unless refractory)
dI_s/dt = -I_s/tau_s : amp
dw/dt = (v - w)/tau_w : volt
I : amp
"""


@pytest.mark.parametrize("method", ["exact", "exponential_euler", "euler", "rk4"])
def test_held_equation_in_a_coupled_system_matches_brian2(method):
    """`v` held while refractory, `w` driven by it, `I_s` free: Brian2's `int(not_refractory)*f`."""
    T, I = 600, np.array([1.8, 2.5, 4.0])  # nA
    ns = dict(R=10 * b2.Mohm, tau_m=10 * b2.ms, tau_s=5 * b2.ms, tau_w=20 * b2.ms)
    spikes, tr = brian2_run(COUPLED_B2, ns, {}, I * b2.nA, T, 0.1, method, "v > 15*mV",
                            "v = 0*mV; I_s += 0.5*nA", 2 * b2.ms, ("v", "I_s", "w"),
                            dict(v=b2.mV, I_s=b2.pA, w=b2.mV))
    assert spikes.sum() >= 10
    m, (s,) = run(COUPLED.format(method=method), np.broadcast_to(I, (T, 3)).copy())
    np.testing.assert_array_equal(s.numpy(), spikes)
    for k in ("v", "I_s", "w"):
        np.testing.assert_allclose(m.state_seqs[k].numpy(), tr[k], rtol=1e-7, atol=1e-9)


def _hh_hysteresis() -> str:
    """The library's Hodgkin-Huxley with a threshold rule and a refractory condition instead of
    its crossing rule."""
    text = (NEURONS_DIR / "hodgkin_huxley.neuron").read_text()
    rule = "    spike when v crosses v_spike surrogate sigmoid(alpha=1/mV)"
    assert rule in text
    return text.replace(rule, "    spike when v > v_spike surrogate sigmoid(alpha=1/mV)\n"
                              "    refractory while v > -20 mV")


def test_refractory_condition_matches_brian2():
    """`refractory while v > -20 mV` (Brian2's `refractory='v > -20*mV'`): a spike at 0 mV, and none
    again until v has come back below -20 mV."""
    from test_library_ode import HH_EQS, _hh_rates

    T = 2500
    I = np.array([10.0, 20.0, 40.0])  # uA/cm**2
    ns = dict(g_Na=120 * b2.msiemens / b2.cm**2, g_K=36 * b2.msiemens / b2.cm**2, g_L=0.3 * b2.msiemens / b2.cm**2,
              E_Na=50 * b2.mV, E_K=-77 * b2.mV, E_L=-54.387 * b2.mV, C_m=1 * b2.uF / b2.cm**2)
    am, bm, ah, bh, an, bn = _hh_rates(-65.0)
    init = dict(v=-65 * b2.mV, m=am / (am + bm), h=ah / (ah + bh), n=an / (an + bn))
    spikes, tr = brian2_run(HH_EQS, ns, init, I * b2.uA / b2.cm**2, T, 0.01, "rk4", "v > 0*mV",
                            refractory="v > -20*mV", units=dict(v=b2.mV))
    assert spikes.sum() >= 3
    m, (s, v) = run(_hh_hysteresis(), np.broadcast_to(I, (T, 3)).copy())
    np.testing.assert_array_equal(s.numpy(), spikes)
    np.testing.assert_allclose(v.numpy(), tr["v"], rtol=1e-7, atol=1e-5)
    assert "_not_refractory" in m.state_seqs


# --------------------------------------------------------------------------- surrogate gradients
class _Spike(torch.autograd.Function):
    """heaviside(u) (`>=`, or `>` when strict) forward; S'(u) backward."""

    @staticmethod
    def forward(ctx, u, strict, sprime):
        ctx.save_for_backward(u)
        ctx.sprime = sprime
        return (u > 0).to(u.dtype) if strict else (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return g * ctx.sprime(u), None, None


def _sigmoid_prime(alpha):
    return lambda u: alpha * torch.sigmoid(alpha * u) * (1 - torch.sigmoid(alpha * u))


def _atan_prime(alpha):
    return lambda u: (alpha / 2) / (1 + (math.pi / 2 * alpha * u) ** 2)


DISCRETE_REFRACTORY = textwrap.dedent("""\
    neuron R:
        input x
        param tau = 2.0
        state v = 0.0
        refractory 3
        update:
            v = v + (x - v) / tau unless refractory
        spike when v >= 1.0 surrogate sigmoid(alpha=4.0)
        on spike:
            v = 0.0
        output spike, v
    """)


def _refractory_reference(x, tau=2.0, period=3):
    """Without `dt`, a period of 3 steps: refractory at the 2 steps after a spike (Brian2's
    `timestep(t - lastspike) >= timestep(period)`), v held and no spike meanwhile."""
    v = torch.zeros_like(x[0])
    last = torch.full_like(x[0], -1e9)
    spikes, vs = [], []
    for t in range(x.shape[0]):
        refractory = (t - last) < period
        v = torch.where(refractory, v, v + (x[t] - v) / tau)
        s = _Spike.apply(v - 1.0, False, _sigmoid_prime(4.0)) * (~refractory).to(x.dtype)
        v = s * 0.0 + (1 - s) * v
        last = torch.where(s > 0, torch.full_like(last, t), last)
        spikes.append(s)
        vs.append(v)
    return torch.stack(spikes), torch.stack(vs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_refractory_surrogate_gradient_matches_a_hand_written_reference(backend):
    """What the surrogate sees: d spike/d u = not_refractory * S'(u) (the gate has no gradient),
    and a held state passes its gradient through unchanged."""
    dtype = torch.float64 if backend == "torch" else torch.float32
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(40, 3, 4, generator=g, dtype=torch.float64) * 3).to(dtype)
    w1, w2 = torch.randn(2, 40, 3, 4, generator=g, dtype=torch.float64).to(dtype)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    s_ref, v_ref = _refractory_reference(xr)
    m = flexdsl.loads(DISCRETE_REFRACTORY, backend=backend)
    s_m, v_m = m(xm)
    assert 0.05 < s_ref.mean().item() < 0.4
    assert torch.equal(s_m.detach(), s_ref.detach())
    assert_close(v_m, v_ref, ops=scan_ops(DISCRETE_REFRACTORY, 40, backward=False))
    ((s_ref * w1).sum() + (v_ref * w2).sum()).backward()
    ((s_m * w1).sum() + (v_m * w2).sum()).backward()
    assert_close(xm.grad, xr.grad, ops=scan_ops(DISCRETE_REFRACTORY, 40))
    # steps held by refractoriness pass no gradient to their own input
    assert (xr.grad == 0).any()


CROSSING = textwrap.dedent("""\
    neuron C:
        input x
        param tau = 3.0
        state v = 0.0
        update:
            v = v + (x - v) / tau
        spike when v crosses 1.0 surrogate atan(alpha=2.0)
        output spike, v
    """)


def _crossing_reference(x, tau=3.0):
    v = torch.zeros_like(x[0])
    above = torch.zeros_like(x[0])
    spikes = []
    for t in range(x.shape[0]):
        v = v + (x[t] - v) / tau
        s = _Spike.apply(v - 1.0, True, _atan_prime(2.0)) * (1 - above)
        above = (v - 1.0 > 0).to(x.dtype)
        spikes.append(s)
    return torch.stack(spikes)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_crossing_fires_once_and_its_gradient_matches_a_reference(backend):
    """spike = (u > 0 now) and not (u > 0 at the previous step); d spike/d u = (1 - above_before) S'(u)."""
    dtype = torch.float64 if backend == "torch" else torch.float32
    g = torch.Generator().manual_seed(2)
    levels = torch.rand(6, 2, 5, generator=g, dtype=torch.float64) * 2.5
    x = levels.repeat_interleave(10, dim=0).to(dtype)  # plateaus: v stays above 1 for many steps
    w = torch.randn(60, 2, 5, generator=g, dtype=torch.float64).to(dtype)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    s_ref = _crossing_reference(xr)
    m = flexdsl.loads(CROSSING, backend=backend, store_state_seqs=True)
    s_m, v_m = m(xm)
    above = (v_m.detach() > 1.0)
    assert above.sum() > 3 * s_ref.sum() > 0, "v stays above the threshold for several steps after a crossing"
    assert torch.equal(s_m.detach(), s_ref.detach())
    prev = torch.cat([torch.zeros_like(above[:1]), above[:-1]])
    assert torch.equal(s_m.detach().bool(), above & ~prev)
    (s_ref * w).sum().backward()
    (s_m * w).sum().backward()
    assert_close(xm.grad, xr.grad, ops=scan_ops(CROSSING, 60))


def test_hidden_states_carry_over_between_calls():
    """Refractoriness and the crossing's memory continue across calls, like any state."""
    x = torch.full((300, 2), 3.0, dtype=torch.float64)
    for stem in ("lif_refractory", "hodgkin_huxley"):
        scale = 10.0 if stem == "hodgkin_huxley" else 1.0
        whole = flexdsl.load(stem, backend="torch")(x * scale)
        m = flexdsl.load(stem, backend="torch")
        parts = [m(x[:137] * scale), m(x[137:] * scale)]
        whole = whole[0] if isinstance(whole, tuple) else whole
        parts = [p[0] if isinstance(p, tuple) else p for p in parts]
        assert torch.equal(torch.cat(parts), whole), stem


# --------------------------------------------------------------------------- one spike per action potential
FHN = textwrap.dedent("""\
    neuron FitzHughNagumo:
        input I
        param dt = 0.1
        param a = 0.7
        param b = 0.8
        param tau = 12.5
        state v = -1.2
        state w = -0.6
        equations method rk4:
            dv/dt = v - v**3 / 3 - w + I
            dw/dt = (v + a - b * w) / tau
        spike when v {rule} 1.0 surrogate sigmoid(alpha=4.0)
        output spike, v
    """)


def _fhn_reference(I, T, dt=0.1):
    def f(t, y):
        v, w = y
        return [v - v**3 / 3 - w + I, (v + 0.7 - 0.8 * w) / 12.5]

    sol = solve_ivp(f, (0, T * dt), [-1.2, -0.6], method="DOP853", rtol=1e-11, atol=1e-12,
                    t_eval=dt * np.arange(1, T + 1))
    return sol.y[0]


def test_fitzhugh_nagumo_crossing_rule_fires_once_per_oscillation():
    T, I = 1200, 0.5
    v_ref = _fhn_reference(I, T)
    peaks, _ = find_peaks(v_ref, height=1.0)
    assert len(peaks) == 3, "three oscillations"
    x = np.full((T, 1), I)
    _, (above, _) = run(FHN.format(rule=">"), x)
    _, (s, v) = run(FHN.format(rule="crosses"), x)
    assert above.sum() > 100, "a threshold rule fires at every step of each excursion"
    np.testing.assert_allclose(v[:, 0].numpy(), v_ref, atol=1e-4)  # rk4 at dt = 0.1 against DOP853
    ref_steps = np.flatnonzero((np.r_[-np.inf, v_ref[:-1]] <= 1.0) & (v_ref > 1.0))
    assert np.flatnonzero(s[:, 0].numpy()).tolist() == ref_steps.tolist()
    assert all(a < p for a, p in zip(ref_steps, peaks))


def _morris_lecar_reference(I_of_step, T, dt=0.1):
    """Morris-Lecar written out with scipy (uA/cm**2, mS/cm**2, uF/cm**2, mV, ms)."""
    C, gL, gCa, gK, VL, VCa, VK, V1, V2, V3, V4, phi = 20, 2, 4.4, 8, -60, 120, -84, -1.2, 18, 2, 30, 0.04
    y = np.array([-60.0, 0.5 * (1 + np.tanh((-60 - V3) / V4))])
    out = np.zeros(T)
    for k in range(T):
        def f(t, z, I=I_of_step[k]):
            v, n = z
            m_inf = 0.5 * (1 + np.tanh((v - V1) / V2))
            n_inf = 0.5 * (1 + np.tanh((v - V3) / V4))
            return [(I - gL * (v - VL) - gCa * m_inf * (v - VCa) - gK * n * (v - VK)) / C,
                    phi * np.cosh((v - V3) / (2 * V4)) * (n_inf - n)]
        y = solve_ivp(f, (0, dt), y, method="DOP853", rtol=1e-10, atol=1e-10).y[:, -1]
        out[k] = y[0]
    return out


def test_morris_lecar_emits_one_spike_per_action_potential():
    T = 3500
    I = np.where(np.arange(T) < 500, 0.0, 100.0)  # rest, then a current in the oscillating range
    v_ref = _morris_lecar_reference(I, T)
    peaks, _ = find_peaks(v_ref, height=0.0)
    assert len(peaks) >= 3
    _, (s, v) = run("morris_lecar", I[:, None])
    np.testing.assert_allclose(v[:, 0].numpy(), v_ref, atol=1e-3)
    steps = np.flatnonzero(s[:, 0].numpy())
    assert len(steps) == len(peaks), "exactly one spike per action potential"
    troughs = np.r_[0, [np.argmin(v_ref[a:b]) + a for a, b in zip(peaks[:-1], peaks[1:])]]
    for k, p, lo in zip(steps, peaks, troughs):
        assert lo < k <= p and v_ref[k] > 0 >= v_ref[k - 1]  # on the upstroke of its own action potential


# --------------------------------------------------------------------------- located errors
LIF = textwrap.dedent("""\
    neuron L:
        input x
        param tau = 2.0
        state v = 0.0
        refractory 3
        update:
            v = v + (x - v) / tau unless refractory
        spike when v >= 1.0
        on spike:
            v = 0.0
        output spike
    """)


def _mut(old, new, base=LIF):
    assert old in base
    return base.replace(old, new, 1)


ERRORS = [
    ("held_without_refractory", _mut("    refractory 3\n", ""), "unless refractory", "v = v", "v",
     "without a `refractory`"),
    ("refractory_without_spike", _mut("    spike when v >= 1.0\n", "").replace(
        "    on spike:\n        v = 0.0\n", "").replace("output spike", "output v"), "refractory 3", "refractory",
     "refractory", "spike rule"),
    ("held_local", _mut("v = v + (x - v) / tau unless refractory",
                        "let y = x unless refractory\n        v = v + (y - v) / tau"), "let y", "unless", "unless",
     "unexpected"),
    ("held_local_assign", _mut("v = v + (x - v) / tau unless refractory",
                               "y = x unless refractory\n        v = v + (y - v) / tau"), "y = x", "y", "y",
     "not a state"),
    ("held_reset", _mut("        v = 0.0\n", "        v = 0.0 unless refractory\n"), "v = 0.0 unless", "v", "v",
     "on spike"),
    ("two_refractory", _mut("    refractory 3\n", "    refractory 3\n    refractory 4\n"), "refractory 4", "refractory",
     "refractory", "at most one"),
    ("period_uses_state", _mut("refractory 3", "refractory v"), "refractory v", "v", "v", "refractory period"),
    ("condition_uses_local", _mut("refractory 3", "refractory while y > 0").replace(
        "v = v + (x - v) / tau unless refractory", "y = x\n        v = v + (y - v) / tau unless refractory"),
     "refractory while", "y >", "y", "start of a step"),
    ("hidden_state_name", _mut("    state v = 0.0\n", "    state v = 0.0\n    state _above_threshold = 0.0\n"),
     "_above_threshold", "_above", "_above", "starts with `_`"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_refractoriness_errors_are_located(case):
    _, text, line_sub, token, _tok, sub = case
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.compile(text)
    lines = text.split("\n")
    line = next(i for i, ln in enumerate(lines) if line_sub in ln) + 1
    col = lines[line - 1].index(token) + 1
    assert (ei.value.line, ei.value.column) == (line, col), str(ei.value)
    assert sub in str(ei.value), str(ei.value)


@pytest.mark.parametrize("method", ["euler", "rk2", "exact"])
def test_float64_runs_stay_float64_with_refractoriness(method):
    """`unless refractory` multiplies by a 0/1 mask: in a float64 run that mask must not round
    `dt` (or a user's `where(c, 1, 0) * th`) to float32. Reference: the recurrence by hand."""
    m = flexdsl.loads(textwrap.dedent(f"""\
        neuron L:
            input I
            param dt = 0.1
            param tau = 10.0
            param th = 0.3
            state v = 0.0
            state w = 0.0
            refractory 2
            equations method {method}:
                dv/dt = (I - v) / tau unless refractory
            update:
                w = w + I - where(w > th, 1, 0) * th
            spike when v > 100 surrogate sigmoid(alpha=1.0)
        """), store_state_seqs=True).double()
    T = 40
    m(torch.ones(T, 1, dtype=torch.float64))
    v = w = 0.0
    vs, ws = [], []
    decay = math.exp(-0.1 / 10.0)
    for _ in range(T):
        v = (v + 0.1 * (1.0 - v) / 10.0 if method == "euler" else
             v + 0.1 * (1.0 - (v + 0.05 * (1.0 - v) / 10.0)) / 10.0 if method == "rk2" else
             1.0 + (v - 1.0) * decay)
        w = w + 1.0 - (1.0 if w > 0.3 else 0.0) * 0.3
        vs.append(v)
        ws.append(w)
    assert m.state_seqs["v"].dtype == torch.float64
    np.testing.assert_allclose(m.state_seqs["v"].flatten().numpy(), vs, rtol=1e-14, atol=0)
    np.testing.assert_allclose(m.state_seqs["w"].flatten().numpy(), ws, rtol=1e-14, atol=0)
