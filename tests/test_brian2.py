"""ODE models integrate like Brian2 with the same method (docs/language.md, section 4, item 1).

Per step Brian2 integrates, thresholds, then resets — the contract's order.
Brian2's StateMonitor records at the *start* of each step (before integration),
so Brian2's record at step t+1 equals flexdsl's post-reset `state_seqs[...][t]`.
SpikeMonitor times are the start of the step in which the threshold crossed,
i.e. step index round(t/dt) equals flexdsl's spike index.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

import flexdsl

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


LIF_ODE = textwrap.dedent("""\
    neuron LIF_ODE:
        input I
        param dt = 0.1      "step (ms)"
        param tau_m = 10.0  where tau_m > 0
        param v_rest = 0.0
        param v_threshold = 1.0
        state v = v_rest

        equations method exact:
            dv/dt = (v_rest - v + I) / tau_m

        spike when v > v_threshold surrogate atan(alpha=2.0)
        on spike:
            v = v_rest
        output spike
    """)

# AdEx, Brette & Gerstner 2005, in mV / ms / nS / pF / pA
# (nS*mV = pA, pA/pF = mV/ms).
ADEX = textwrap.dedent("""\
    neuron AdEx:
        \"\"\"Adaptive exponential integrate-and-fire (Brette & Gerstner 2005).\"\"\"
        input I                                  "pA"
        param dt = 0.1                           "ms"
        param C = 281.0      where C > 0         "pF"
        param g_L = 30.0                         "nS"
        param E_L = -70.6                        "mV"
        param V_T = -50.4                        "mV"
        param Delta_T = 2.0  where Delta_T > 0   "mV"
        param tau_w = 144.0  where tau_w > 0     "ms"
        param a = 4.0                            "nS"
        param b = 80.5                           "pA"
        param V_r = E_L
        param V_cut = V_T + 5 * Delta_T
        state V = E_L
        state w = 0.0

        equations method euler:
            dV/dt = (-g_L * (V - E_L) + g_L * Delta_T * exp((V - V_T) / Delta_T) - w + I) / C
            dw/dt = (a * (V - E_L) - w) / tau_w

        spike when V >= V_cut surrogate sigmoid(alpha=4.0)
        on spike:
            V = V_r
            w += b
        output spike
    """)


def _spike_pairs(spikes: np.ndarray) -> list[tuple[int, int]]:
    """[T, N] 0/1 array -> sorted (neuron, step)."""
    steps, neurons = np.nonzero(spikes)
    return sorted(zip(neurons.tolist(), steps.tolist()))


def _brian_spike_pairs(sp, dt) -> list[tuple[int, int]]:
    steps = np.round(np.asarray(sp.t / dt)).astype(int)
    return sorted(zip(np.asarray(sp.i).tolist(), steps.tolist()))


def _run_flexdsl(text, inputs: np.ndarray, **kw):
    m = flexdsl.loads(text, step_mode="m", backend="torch", store_state_seqs=True, **kw)
    m = m.double()
    x = torch.tensor(inputs, dtype=torch.float64)
    with torch.no_grad():
        s = m(x)
    seqs = {k: v.detach().cpu().numpy() for k, v in m.state_seqs.items()}
    return s.detach().cpu().numpy(), seqs


def _piecewise_inputs(T, n, seg, lo, hi, seed):
    rng = np.random.default_rng(seed)
    vals = rng.uniform(lo, hi, size=(T // seg + 1, n))
    return np.repeat(vals, seg, axis=0)[:T]


def test_lif_exact_matches_brian2():
    from brian2 import (
        NeuronGroup,
        SpikeMonitor,
        StateMonitor,
        TimedArray,
        defaultclock,
        ms,
        prefs,
        run,
        start_scope,
    )

    prefs.codegen.target = "numpy"
    start_scope()
    T, N = 2000, 5
    dt = 0.1 * ms
    defaultclock.dt = dt
    inputs = _piecewise_inputs(T, N, 37, 0.3, 2.5, seed=1)
    inputs[:, 0] = 1.2  # one constant-input neuron
    I_ta = TimedArray(inputs, dt=dt)
    G = NeuronGroup(
        N,
        """dv/dt = (v_rest - v + I) / tau_m : 1
              I = I_ta(t, i) : 1""",
        method="exact",
        threshold="v > v_threshold",
        reset="v = v_rest",
        namespace=dict(I_ta=I_ta, tau_m=10 * ms, v_rest=0.0, v_threshold=1.0),
    )
    mon = StateMonitor(G, "v", record=True)
    sp = SpikeMonitor(G)
    run((T + 1) * dt)

    s, seqs = _run_flexdsl(LIF_ODE, inputs)
    assert s.shape == (T, N)
    assert set(np.unique(s)) <= {0.0, 1.0}
    b2_pairs = [p for p in _brian_spike_pairs(sp, dt) if p[1] < T]
    assert len(b2_pairs) > 20
    assert _spike_pairs(s) == b2_pairs
    ref = np.asarray(mon.v)[:, 1 : T + 1].T  # [T, N]
    np.testing.assert_allclose(seqs["v"], ref, rtol=1e-7, atol=1e-12)


def test_lif_exact_matches_brian2_constant_inputs():
    from brian2 import NeuronGroup, SpikeMonitor, StateMonitor, defaultclock, ms, prefs, run, start_scope

    prefs.codegen.target = "numpy"
    start_scope()
    T = 1500
    dt = 0.1 * ms
    defaultclock.dt = dt
    Ic = np.array([0.5, 1.05, 1.5, 3.0])
    G = NeuronGroup(
        len(Ic),
        """dv/dt = (v_rest - v + I) / tau_m : 1
                               I : 1 (constant)""",
        method="exact",
        threshold="v > v_threshold",
        reset="v = v_rest",
        namespace=dict(tau_m=10 * ms, v_rest=0.0, v_threshold=1.0),
    )
    G.I = Ic
    mon = StateMonitor(G, "v", record=True)
    sp = SpikeMonitor(G)
    run((T + 1) * dt)
    inputs = np.broadcast_to(Ic, (T, len(Ic))).copy()
    s, seqs = _run_flexdsl(LIF_ODE, inputs)
    assert _spike_pairs(s) == [p for p in _brian_spike_pairs(sp, dt) if p[1] < T]
    assert s[:, 0].sum() == 0 and s[:, 3].sum() > 10
    np.testing.assert_allclose(seqs["v"], np.asarray(mon.v)[:, 1 : T + 1].T, rtol=1e-7, atol=1e-12)


def test_lif_exact_other_dt_and_tau_overrides():
    """Overrides of dt / tau_m go through the same exact discretisation."""
    from brian2 import (
        NeuronGroup,
        SpikeMonitor,
        StateMonitor,
        TimedArray,
        defaultclock,
        ms,
        prefs,
        run,
        start_scope,
    )

    prefs.codegen.target = "numpy"
    start_scope()
    T, N = 1000, 3
    dt = 0.25 * ms
    defaultclock.dt = dt
    inputs = _piecewise_inputs(T, N, 11, 0.0, 3.0, seed=2)
    I_ta = TimedArray(inputs, dt=dt)
    G = NeuronGroup(
        N,
        """dv/dt = (v_rest - v + I) / tau_m : 1
                         I = I_ta(t, i) : 1""",
        method="exact",
        threshold="v > v_threshold",
        reset="v = v_rest",
        namespace=dict(I_ta=I_ta, tau_m=4 * ms, v_rest=0.0, v_threshold=1.0),
    )
    mon = StateMonitor(G, "v", record=True)
    sp = SpikeMonitor(G)
    run((T + 1) * dt)
    s, seqs = _run_flexdsl(LIF_ODE, inputs, dt=0.25, tau_m=4.0)
    assert _spike_pairs(s) == [p for p in _brian_spike_pairs(sp, dt) if p[1] < T]
    np.testing.assert_allclose(seqs["v"], np.asarray(mon.v)[:, 1 : T + 1].T, rtol=1e-7, atol=1e-12)


def test_adex_euler_matches_brian2():
    from brian2 import (
        NeuronGroup,
        SpikeMonitor,
        StateMonitor,
        TimedArray,
        amp,
        defaultclock,
        ms,
        mV,
        nA,
        nS,
        pA,
        pF,
        prefs,
        run,
        start_scope,
    )

    prefs.codegen.target = "numpy"
    start_scope()
    T = 2000
    dt = 0.1 * ms
    defaultclock.dt = dt
    Ic = np.array([300.0, 600.0, 800.0, 1000.0, 1500.0])  # pA
    N = len(Ic)
    inputs = np.broadcast_to(Ic, (T, N)).copy()
    inputs[: T // 2, 4] = 0.0  # a step for the last one
    I_ta = TimedArray(inputs * pA, dt=dt)
    ns = dict(
        C=281 * pF,
        g_L=30 * nS,
        E_L=-70.6 * mV,
        V_T=-50.4 * mV,
        Delta_T=2 * mV,
        tau_w=144 * ms,
        a=4 * nS,
        b=0.0805 * nA,
        V_cut=-50.4 * mV + 5 * 2 * mV,
        I_ta=I_ta,
    )
    G = NeuronGroup(
        N,
        """dV/dt = (-g_L*(V - E_L) + g_L*Delta_T*exp((V - V_T)/Delta_T) - w + I)/C : volt
              dw/dt = (a*(V - E_L) - w)/tau_w : amp
              I = I_ta(t, i) : amp""",
        method="euler",
        threshold="V >= V_cut",
        reset="V = E_L; w += b",
        namespace=ns,
    )
    G.V = ns["E_L"]
    G.w = 0 * amp
    mon = StateMonitor(G, ["V", "w"], record=True)
    sp = SpikeMonitor(G)
    run((T + 1) * dt)

    s, seqs = _run_flexdsl(ADEX, inputs)
    b2_pairs = [p for p in _brian_spike_pairs(sp, dt) if p[1] < T]
    assert len(b2_pairs) > 10
    assert _spike_pairs(s) == b2_pairs
    refV = np.asarray(mon.V / mV)[:, 1 : T + 1].T
    refw = np.asarray(mon.w / pA)[:, 1 : T + 1].T
    np.testing.assert_allclose(seqs["V"], refV, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(seqs["w"], refw, rtol=1e-7, atol=1e-7)


def test_adex_auto_method_is_not_exact():
    """Without `method`, a nonlinear system is integrated with euler (same as Brian2 euler)."""
    text = ADEX.replace("equations method euler:", "equations:")
    T = 300
    inputs = np.full((T, 2), 900.0)
    s1, q1 = _run_flexdsl(ADEX, inputs)
    s2, q2 = _run_flexdsl(text, inputs)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_allclose(q1["V"], q2["V"], rtol=1e-12)


IZH = textwrap.dedent("""\
    neuron Izhikevich:
        input I
        param dt = 0.1
        param a = 0.02
        param b = 0.2
        param c = -65.0
        param d = 8.0
        state v = c
        state u = b * c

        equations method {method}:
            dv/dt = 0.04 * v**2 + 5 * v + 140 - u + I
            du/dt = a * (b * v - u)

        spike when v >= 30 surrogate sigmoid(alpha=4.0)
        on spike:
            v = c
            u += d
        output spike
    """)


# Not "heun": Brian2's `heun` is the stochastic (Stratonovich) Heun scheme, whose
# deterministic part is plain Euler (`x_new = x + dt*f(x,t) + noise terms`), whereas
# flexdsl's `heun` is the explicit trapezoidal rule (checked by hand in test_semantics).
@pytest.mark.parametrize("method", ["euler", "rk2", "rk4"])
def test_izhikevich_matches_brian2(method):
    from brian2 import NeuronGroup, SpikeMonitor, StateMonitor, defaultclock, ms, prefs, run, start_scope

    prefs.codegen.target = "numpy"
    start_scope()
    T = 2000
    dt = 0.1 * ms
    defaultclock.dt = dt
    Ic = np.array([4.0, 10.0, 15.0, 30.0])
    G = NeuronGroup(
        len(Ic),
        """dv/dt = (0.04*v**2 + 5*v + 140 - u + I)/ms : 1
                               du/dt = a*(b*v - u)/ms : 1
                               I : 1 (constant)""",
        method=method,
        threshold="v >= 30",
        reset="v = c; u += d",
        namespace=dict(a=0.02, b=0.2, c=-65.0, d=8.0),
    )
    G.v = -65.0
    G.u = 0.2 * -65.0
    G.I = Ic
    mon = StateMonitor(G, ["v", "u"], record=True)
    sp = SpikeMonitor(G)
    run((T + 1) * dt)
    s, seqs = _run_flexdsl(IZH.format(method=method), np.broadcast_to(Ic, (T, len(Ic))).copy())
    b2_pairs = [p for p in _brian_spike_pairs(sp, dt) if p[1] < T]
    assert len(b2_pairs) > 10
    assert _spike_pairs(s) == b2_pairs
    np.testing.assert_allclose(seqs["v"], np.asarray(mon.v)[:, 1 : T + 1].T, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(seqs["u"], np.asarray(mon.u)[:, 1 : T + 1].T, rtol=1e-7, atol=1e-9)


GATE = textwrap.dedent("""\
    neuron Gate:
        input I
        param dt = 0.1
        param tau = 3.0 where tau > 0
        state v = 0.5
        state g = 0.1
        equations method exponential_euler:
            dv/dt = (I - v) / tau - g * v
            dg/dt = sigmoid(v) * (1 - g) - 0.5 * g
        spike when v > 1.0 surrogate sigmoid(alpha=4.0)
        on spike:
            v = 0.0
            g += 0.2
        output spike
    """)


def test_exponential_euler_matches_brian2():
    from brian2 import (
        NeuronGroup,
        SpikeMonitor,
        StateMonitor,
        TimedArray,
        defaultclock,
        ms,
        prefs,
        run,
        start_scope,
    )

    prefs.codegen.target = "numpy"
    start_scope()
    T, N = 1500, 4
    dt = 0.1 * ms
    defaultclock.dt = dt
    inputs = _piecewise_inputs(T, N, 23, 0.5, 4.0, seed=3)
    I_ta = TimedArray(inputs, dt=dt)
    G = NeuronGroup(
        N,
        """dv/dt = ((I - v) / tau - g * v) / ms : 1
                         dg/dt = (1 / (1 + exp(-v)) * (1 - g) - 0.5 * g) / ms : 1
                         I = I_ta(t, i) : 1""",
        method="exponential_euler",
        threshold="v > 1.0",
        reset="v = 0.0; g += 0.2",
        namespace=dict(I_ta=I_ta, tau=3.0),
    )
    G.v = 0.5
    G.g = 0.1
    mon = StateMonitor(G, ["v", "g"], record=True)
    sp = SpikeMonitor(G)
    run((T + 1) * dt)
    s, seqs = _run_flexdsl(GATE, inputs)
    b2_pairs = [p for p in _brian_spike_pairs(sp, dt) if p[1] < T]
    assert len(b2_pairs) > 10
    assert _spike_pairs(s) == b2_pairs
    np.testing.assert_allclose(seqs["v"], np.asarray(mon.v)[:, 1 : T + 1].T, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(seqs["g"], np.asarray(mon.g)[:, 1 : T + 1].T, rtol=1e-7, atol=1e-9)
