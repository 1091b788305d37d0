"""Continuous-time library models against Brian2 2.9.0 (same integration method), and the two models
Brian2 cannot integrate the same way against independent closed forms:

* adex (euler), izhikevich_2003 (euler), hodgkin_huxley (rk4, spike on an upward crossing),
  lif_ode (exact), lif_refractory (exact, refractory period): written with units, against Brian2 run with its units (SI),
  numpy target, float64, defaultclock.dt = the model's dt, piecewise-constant input set between runs
  (held constant within each step, as the contract's inputs are). Spike steps must be equal and
  traces within 1e-7 relative (flexdsl's states are in its base units: mV, pA, mV/ms).
* resonate_fire (exact): the complex closed form z <- e^{lambda dt} z + I (e^{lambda dt} - 1)/lambda
  (Brian2's `exact` refuses systems with complex eigenvalues).
* alif (discrete): the Bellec et al. equations written out in torch, with their pseudo-derivative.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import flexdsl

from tolerances import assert_close, scan_ops

warnings.filterwarnings("ignore")
import brian2 as b2  # noqa: E402


def piecewise_input(rng, n_seg, seg_steps, n, lo, hi):
    """[n_seg, n] levels and the [T, n] step input that holds each level for seg_steps steps."""
    levels = rng.uniform(lo, hi, size=(n_seg, n))
    return levels, np.repeat(levels, seg_steps, axis=0)


def brian2_run(
    eqs, namespace, init, levels, seg_steps, dt, method, threshold=None, reset=None, record=("v",),
    input_unit=1.0, trace_units=None, refractory=False,
):
    """Run a NeuronGroup with input variable I held at levels[k] * input_unit during segment k.
    Returns the [T, n] spike raster (by step index) and the [T, n] traces recorded after each step's
    reset, as numbers in trace_units[name] (a Brian2 unit; plain numbers where not given)."""
    b2.start_scope()
    b2.prefs.codegen.target = "numpy"
    b2.defaultclock.dt = dt * b2.ms
    n = levels.shape[1]
    kw = {}
    if threshold is not None:
        kw["threshold"] = threshold
    if reset is not None:
        kw["reset"] = reset
    if refractory is not False:
        kw["refractory"] = refractory
    G = b2.NeuronGroup(n, eqs, method=method, namespace=namespace, **kw)
    for k, v in init.items():
        setattr(G, k, v)
    M = b2.StateMonitor(G, list(record), record=True, when="end")
    S = b2.SpikeMonitor(G) if threshold is not None else None
    net = b2.Network(G, M, *([S] if S is not None else []))
    for level in levels:
        G.I = level * input_unit
        net.run(seg_steps * dt * b2.ms, namespace={})
    T = levels.shape[0] * seg_steps
    spikes = np.zeros((T, n))
    if S is not None:
        steps = np.round(np.asarray(S.t / b2.ms) / dt).astype(int)
        spikes[steps, np.asarray(S.i)] = 1.0
    units = trace_units or {}
    traces = {k: np.asarray(getattr(M, k) / units.get(k, 1.0)).T for k in record}
    assert traces[record[0]].shape == (T, n)
    return spikes, traces


def run_flexdsl(stem, x, **kw):
    m = flexdsl.load(stem, backend="torch", store_state_seqs=True, **kw)
    with torch.no_grad():
        out = m(torch.as_tensor(x, dtype=torch.float64))
    out = out if isinstance(out, tuple) else (out,)
    return m, out


def assert_spike_steps_equal(mine, ref):
    mine = np.asarray(mine)
    assert mine.shape == ref.shape
    bad = np.argwhere(mine != ref)
    assert bad.size == 0, (
        f"spike steps differ at (step, neuron) {bad[:5].tolist()}; counts {mine.sum(0)} vs {ref.sum(0)}"
    )


def assert_traces_close(mine, ref, scale):
    np.testing.assert_allclose(np.asarray(mine), ref, rtol=1e-7, atol=1e-7 * scale)


# ---------------------------------------------------------------------------------------------


# AdEx in Brian2 with its units: Brette & Gerstner 2005, Table 1
ADEX = dict(C=281 * b2.pF, g_L=30 * b2.nS, E_L=-70.6 * b2.mV, V_T=-50.4 * b2.mV, Delta_T=2 * b2.mV,
            tau_w=144 * b2.ms, a=4 * b2.nS, b=0.0805 * b2.nA)
ADEX_EQS = """
dv/dt = (-g_L*(v - E_L) + g_L*Delta_T*exp((v - V_T)/Delta_T) - w + I)/C : volt
dw/dt = (a*(v - E_L) - w)/tau_w : amp
I : amp
"""
ADEX_TRACES = dict(v=b2.mV, w=b2.pA)  # flexdsl's states are in mV and pA


def test_adex_matches_brian2_euler():
    dt, seg = 0.1, 400
    ns = dict(ADEX, V_r=ADEX["E_L"], V_peak=ADEX["V_T"] + 5 * ADEX["Delta_T"])
    levels, x = piecewise_input(np.random.default_rng(0), 5, seg, 4, 0.0, 1500.0)  # pA
    spikes, tr = brian2_run(
        ADEX_EQS,
        ns,
        dict(v=ADEX["E_L"], w=0 * b2.amp),
        levels,
        seg,
        dt,
        "euler",
        threshold="v > V_peak",
        reset="v = V_r; w += b",
        record=("v", "w"),
        input_unit=b2.pA,
        trace_units=ADEX_TRACES,
    )
    assert spikes.sum() >= 10, "the input must make the cells fire"
    m, (s,) = run_flexdsl("adex", x)
    assert_spike_steps_equal(s.numpy(), spikes)
    assert_traces_close(m.state_seqs["v"].numpy(), tr["v"], 100.0)
    assert_traces_close(m.state_seqs["w"].numpy(), tr["w"], 100.0)


def test_adex_params_override_matches_brian2():
    """Bursting-like variant (Naud et al. 2008 style: smaller tau_w, larger b, higher reset); the
    overrides are numbers in the declared units and strings with units."""
    dt, seg = 0.1, 400
    p = dict(ADEX, tau_w=40 * b2.ms, a=2 * b2.nS, b=120 * b2.pA)
    ns = dict(p, V_r=-48 * b2.mV, V_peak=p["V_T"] + 5 * p["Delta_T"])
    levels, x = piecewise_input(np.random.default_rng(1), 4, seg, 3, 300.0, 1500.0)
    spikes, tr = brian2_run(
        ADEX_EQS,
        ns,
        dict(v=p["E_L"], w=0 * b2.amp),
        levels,
        seg,
        dt,
        "euler",
        threshold="v > V_peak",
        reset="v = V_r; w += b",
        input_unit=b2.pA,
        trace_units=ADEX_TRACES,
    )
    assert spikes.sum() >= 10
    m, (s,) = run_flexdsl("adex", x, tau_w="0.04 second", a=2.0, b="0.12 nA", V_r="-48 mV")
    assert (m.tau_w, m.a, m.b, m.V_r) == (40.0, 2.0, 120.0, -48.0)  # read back in the declared units
    assert_spike_steps_equal(s.numpy(), spikes)
    assert_traces_close(m.state_seqs["v"].numpy(), tr["v"], 100.0)


# preset: (a, b, c, d), steps per segment. Forward Euler at dt = 0.5 ms is strongly expansive around
# spikes (the fast-spiking cell amplifies a 1e-8 rounding difference tenfold per spike cycle), so the
# horizon over which two correct float64 implementations agree to 1e-7 is limited for that preset.
IZH_PRESETS = {
    "regular_spiking": (dict(a=0.02, b=0.2, c=-65.0, d=8.0), 400),
    "chattering": (dict(a=0.02, b=0.2, c=-50.0, d=2.0), 400),
    "fast_spiking": (dict(a=0.1, b=0.2, c=-65.0, d=2.0), 125),
}


@pytest.mark.parametrize("preset", sorted(IZH_PRESETS))
def test_izhikevich_2003_matches_brian2_euler(preset):
    dt = 0.5
    p, seg = IZH_PRESETS[preset]
    ms, mV = b2.ms, b2.mV
    ns = dict(a=p["a"] / ms, b=p["b"] / ms, c=p["c"] * mV, d=p["d"] * mV / ms, k2=0.04 / mV / ms, k1=5 / ms,
              k0=140 * mV / ms, v_peak=30 * mV)
    eqs = """
    dv/dt = k2*v**2 + k1*v + k0 - u + I : volt
    du/dt = a*(b*v - u) : volt/second
    I : volt/second
    """
    levels, x = piecewise_input(np.random.default_rng(2), 4, seg, 4, 0.0, 15.0)  # mV/ms
    spikes, tr = brian2_run(
        eqs,
        ns,
        dict(v=-65 * mV, u=ns["b"] * -65 * mV),
        levels,
        seg,
        dt,
        "euler",
        threshold="v >= v_peak",
        reset="v = c; u += d",
        record=("v", "u"),
        input_unit=mV / ms,
        trace_units=dict(v=mV, u=mV / ms),
    )
    assert spikes.sum() >= 10
    overrides = {} if preset == "regular_spiking" else p
    m, (s,) = run_flexdsl("izhikevich_2003", x, **overrides)
    assert_spike_steps_equal(s.numpy(), spikes)
    assert_traces_close(m.state_seqs["v"].numpy(), tr["v"], 100.0)
    assert_traces_close(m.state_seqs["u"].numpy(), tr["u"], 10.0)


def _hh_rates(v):
    am = 0.1 * (v + 40) / (1 - np.exp(-(v + 40) / 10))
    bm = 4 * np.exp(-(v + 65) / 18)
    ah = 0.07 * np.exp(-(v + 65) / 20)
    bh = 1 / (1 + np.exp(-(v + 35) / 10))
    an = 0.01 * (v + 55) / (1 - np.exp(-(v + 55) / 10))
    bn = 0.125 * np.exp(-(v + 65) / 80)
    return am, bm, ah, bh, an, bn


HH_EQS = """
dv/dt = (I - g_Na*m**3*h*(v - E_Na) - g_K*n**4*(v - E_K) - g_L*(v - E_L))/C_m : volt
dm/dt = alpha_m*(1 - m) - beta_m*m : 1
dh/dt = alpha_h*(1 - h) - beta_h*h : 1
dn/dt = alpha_n*(1 - n) - beta_n*n : 1
alpha_m = 0.1/mV*(v + 40*mV)/(1 - exp(-(v + 40*mV)/(10*mV)))/ms : Hz
beta_m = 4*exp(-(v + 65*mV)/(18*mV))/ms : Hz
alpha_h = 0.07*exp(-(v + 65*mV)/(20*mV))/ms : Hz
beta_h = 1/(1 + exp(-(v + 35*mV)/(10*mV)))/ms : Hz
alpha_n = 0.01/mV*(v + 55*mV)/(1 - exp(-(v + 55*mV)/(10*mV)))/ms : Hz
beta_n = 0.125*exp(-(v + 65*mV)/(80*mV))/ms : Hz
I : amp/meter**2
"""


def test_hodgkin_huxley_matches_brian2_rk4():
    """One spike per action potential: flexdsl's `spike when v crosses v_spike` against Brian2's
    threshold `v > 0*mV` with `refractory='v > 0*mV'` (its way of detecting an upward crossing)."""
    dt, seg = 0.01, 500
    ucm2 = b2.uA / b2.cm**2
    ns = dict(g_Na=120 * b2.msiemens / b2.cm**2, g_K=36 * b2.msiemens / b2.cm**2, g_L=0.3 * b2.msiemens / b2.cm**2,
              E_Na=50 * b2.mV, E_K=-77 * b2.mV, E_L=-54.387 * b2.mV, C_m=1 * b2.uF / b2.cm**2)
    v0 = -65.0
    am, bm, ah, bh, an, bn = _hh_rates(v0)
    init = dict(v=v0 * b2.mV, m=am / (am + bm), h=ah / (ah + bh), n=an / (an + bn))
    levels = np.array([[0.0, 0.0, 0.0], [12.0, 4.0, 30.0], [20.0, 8.0, 15.0], [30.0, 0.0, 10.0]])  # uA/cm**2
    x = np.repeat(levels, seg, axis=0)
    spikes, tr = brian2_run(HH_EQS, ns, init, levels, seg, dt, "rk4", threshold="v > 0*mV",
                            refractory="v > 0*mV", record=("v", "m", "h", "n"), input_unit=ucm2,
                            trace_units=dict(v=b2.mV))
    assert spikes.sum() >= 4, "the input must elicit action potentials"
    assert spikes[:seg].sum() == 0, "no spike at rest"
    # one spike per action potential: Brian2's spikes are the upward crossings of its own trace
    v_b = tr["v"]
    prev = np.vstack([np.full((1, v_b.shape[1]), v0), v_b[:-1]])
    np.testing.assert_array_equal(spikes, ((prev <= 0) & (v_b > 0)).astype(float))
    m, (s, v_out) = run_flexdsl("hodgkin_huxley", x)
    assert_spike_steps_equal(s.numpy(), spikes)
    assert_traces_close(v_out.numpy(), v_b, 100.0)
    for k in ("v", "m", "h", "n"):
        assert_traces_close(m.state_seqs[k].numpy(), tr[k], 100.0 if k == "v" else 1.0)
    assert set(m.state_seqs) == {"v", "m", "h", "n", "_above_threshold"}  # no helper state in the model text


def test_hodgkin_huxley_initial_gates_are_steady_state():
    m = flexdsl.load("hodgkin_huxley", backend="torch", store_state_seqs=True)
    am, bm, ah, bh, an, bn = _hh_rates(-65.0)
    with torch.no_grad():
        m(torch.zeros(1, 1, dtype=torch.float64))
    # after one step at rest with I = 0 the gates barely move from their initial steady state
    np.testing.assert_allclose(m.state_seqs["m"][0, 0].item(), am / (am + bm), rtol=1e-3)
    np.testing.assert_allclose(m.state_seqs["h"][0, 0].item(), ah / (ah + bh), rtol=1e-3)
    np.testing.assert_allclose(m.state_seqs["n"][0, 0].item(), an / (an + bn), rtol=1e-3)


LIF_EQS = """
dv/dt = (v_rest - v + R*I)/tau_m : volt (unless refractory)
I : amp
"""


def test_lif_ode_matches_brian2_exact():
    dt, seg = 0.1, 300
    ns = dict(tau_m=10 * b2.ms, R=10 * b2.Mohm, v_rest=-65 * b2.mV, v_threshold=-50 * b2.mV, v_reset=-65 * b2.mV)
    eqs = """
    dv/dt = (v_rest - v + R*I)/tau_m : volt
    I : amp
    """
    levels, x = piecewise_input(np.random.default_rng(3), 5, seg, 4, 0.0, 3.0)  # nA
    spikes, tr = brian2_run(eqs, ns, dict(v=-65 * b2.mV), levels, seg, dt, "exact", threshold="v > v_threshold",
                            reset="v = v_reset", input_unit=b2.nA, trace_units=dict(v=b2.mV))
    assert spikes.sum() >= 10
    m, (s,) = run_flexdsl("lif_ode", x)
    assert_spike_steps_equal(s.numpy(), spikes)
    assert_traces_close(m.state_seqs["v"].numpy(), tr["v"], 100.0)


@pytest.mark.parametrize("t_ref", [2.0, 0.3, 0.0])
def test_lif_refractory_matches_brian2_exact_with_refractory_period(t_ref):
    """Brian2's `refractory=t_ref` with `(unless refractory)`: held and silent for the period
    (0.3 ms is 2.9999... steps of 0.1 ms in floating point: Brian2 rounds it to 3 steps)."""
    dt, seg = 0.1, 300
    ns = dict(tau_m=10 * b2.ms, R=10 * b2.Mohm, v_rest=-65 * b2.mV, v_threshold=-50 * b2.mV, v_reset=-65 * b2.mV)
    levels, x = piecewise_input(np.random.default_rng(3), 5, seg, 4, 0.0, 3.0)  # nA
    if t_ref > 0:
        x[:, 0] = levels[:, 0] = 6.0  # a strongly driven cell, whose rate the refractory period limits
    spikes, tr = brian2_run(
        LIF_EQS, ns, dict(v=-65 * b2.mV), levels, seg, dt, "exact", threshold="v > v_threshold",
        reset="v = v_reset", refractory=t_ref * b2.ms, input_unit=b2.nA, trace_units=dict(v=b2.mV),
    )
    assert spikes.sum() >= 10
    m, (s,) = run_flexdsl("lif_refractory", x, t_ref=t_ref)
    assert_spike_steps_equal(s.numpy(), spikes)
    assert_traces_close(m.state_seqs["v"].numpy(), tr["v"], 100.0)
    if t_ref > 0:  # the period matters: v stays at v_reset for round(t_ref/dt) steps from the spike, then moves
        n_ref = round(t_ref / dt)
        v = m.state_seqs["v"].numpy()[:, 0]
        for k in np.flatnonzero(spikes[:, 0])[:-1]:
            assert np.all(v[k: k + n_ref] == -65.0) and v[k + n_ref] > -65.0


# ---------------------------------------------------------------------------------------------


def test_resonate_fire_matches_closed_form():
    """Exact step of z' = (b + i omega) z + I with I constant over the step, in complex arithmetic."""
    dt, b, omega, a_thresh = 0.01, -1.0, 10.0, 1.0
    z_reset = 0.0 + 1.0j
    rng = np.random.default_rng(4)
    levels, x = piecewise_input(rng, 8, 250, 5, 0.0, 15.0)
    T, n = x.shape
    lam = complex(b, omega)
    e = np.exp(lam * dt)
    gain = (e - 1) / lam
    z = np.zeros(n, dtype=complex)
    spikes = np.zeros((T, n))
    xs, ys = np.zeros((T, n)), np.zeros((T, n))
    for t in range(T):
        z = e * z + gain * x[t]
        fired = z.imag >= a_thresh
        spikes[t] = fired
        z = np.where(fired, z_reset, z)
        xs[t], ys[t] = z.real, z.imag
    assert spikes.sum() >= 10
    m, (s,) = run_flexdsl("resonate_fire", x)
    assert_spike_steps_equal(s.numpy(), spikes)
    assert_traces_close(m.state_seqs["y"].numpy(), ys, 1.0)
    assert_traces_close(m.state_seqs["x"].numpy(), xs, 1.0)


class _PseudoDerivativeSpike(torch.autograd.Function):
    """heaviside(u) (u >= 0 fires) with Bellec et al.'s pseudo-derivative gamma * max(0, 1 - |u|)."""

    @staticmethod
    def forward(ctx, u, gamma):
        ctx.save_for_backward(u)
        ctx.gamma = gamma
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, grad):
        (u,) = ctx.saved_tensors
        return grad * ctx.gamma * torch.clamp(1 - u.abs(), min=0), None


def _alif_reference(x, dt=1.0, tau_m=20.0, tau_a=200.0, v_th=1.0, beta=1.8, gamma=0.3):
    alpha, rho = math.exp(-dt / tau_m), math.exp(-dt / tau_a)
    v = torch.zeros_like(x[0])
    a = torch.zeros_like(x[0])
    zs, vs, as_ = [], [], []
    for t in range(x.shape[0]):
        v = alpha * v + (1 - alpha) * x[t]
        a = rho * a
        z = _PseudoDerivativeSpike.apply(v - (v_th + beta * a), gamma)
        v = v - z * v_th
        a = a + z
        zs.append(z)
        vs.append(v)
        as_.append(a)
    return torch.stack(zs), torch.stack(vs), torch.stack(as_)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_alif_matches_bellec_equations(dtype):
    g = torch.Generator().manual_seed(5)
    x = (torch.rand(200, 4, 6, generator=g, dtype=torch.float64) * 12).to(dtype)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    z_ref, v_ref, a_ref = _alif_reference(xr)
    m = flexdsl.load("alif", backend="torch", store_state_seqs=True)
    z_m = m(xm)
    rate = z_ref.double().mean().item()
    assert 0.005 < rate < 0.5
    # adaptation must matter: the rate falls over time
    assert z_ref[:20].mean() > z_ref[-100:].mean()
    assert torch.equal(z_m.detach(), z_ref.detach())
    T = x.shape[0]
    assert_close(m.state_seqs["v"], v_ref, ops=scan_ops("alif", T, backward=False))
    assert_close(m.state_seqs["a"], a_ref, ops=scan_ops("alif", T, backward=False))
    w = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    (z_ref * w).sum().backward()
    (z_m * w).sum().backward()
    assert_close(xm.grad, xr.grad, ops=scan_ops("alif", T))


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_hodgkin_huxley_is_finite_where_its_rates_were_0_over_0(backend):
    """alpha_m and alpha_n were written (v + 40)/(1 - exp(-(v + 40)/10)) and (v + 55)/(...): 0/0 at
    v = -40 and -55 mV (NaN on every backend and dtype, reachable in float32). Written with exprel:
    finite there and continuous (the steps from v and from v + 1e-7 mV differ by about the slope times
    1e-7, float64)."""
    m = flexdsl.load("hodgkin_huxley", backend=backend).double()
    m.v = torch.tensor([-40.0, -40.0 + 1e-7, -55.0, -55.0 + 1e-7], dtype=torch.float64)
    m(torch.zeros(2, 4, dtype=torch.float64))
    for name in ("v", "m", "h", "n"):
        s = getattr(m, name)
        assert bool(torch.isfinite(s).all()), name
        assert float((s[0] - s[1]).abs()) < 1e-5 and float((s[2] - s[3]).abs()) < 1e-5, name
