"""Semantics of one step (docs/language.md, sections 3–8), checked against values computed by
hand in plain Python/numpy, independently of flexdsl."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
import torch

import flexdsl

F64 = torch.float64


def mk(text, **kw):
    kw.setdefault("backend", "torch")
    return flexdsl.loads(textwrap.dedent(text), **kw)


def t64(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=F64)


def close(got, want, rtol=1e-12, atol=1e-12):
    got = torch.as_tensor(got).detach().to(F64).cpu()
    want = torch.as_tensor(np.asarray(want, dtype=np.float64))
    torch.testing.assert_close(got, want.expand_as(got) if want.dim() == 0 else want, rtol=rtol, atol=atol)


def sig(z):
    return 1.0 / (1.0 + np.exp(-z))


LIF = """\
    neuron LIF:
        input x
        param tau = 2.0 where tau > 1
        param v_threshold = 1.0
        param v_reset = 0.0
        state v = v_reset
        update:
            v = v + (x - (v - v_reset)) / tau
        spike when v >= v_threshold surrogate sigmoid(alpha=4.0)
        on spike:
            v = v_reset
        output spike
    """


def lif_ref(x, tau=2.0, th=1.0, vr=0.0):
    """Hand LIF (SpikingJelly hard reset, `>=`): returns spikes [T,...], v [T,...]."""
    x = np.asarray(x, dtype=np.float64)
    tau = np.asarray(tau, dtype=np.float64)
    v = np.full(x.shape[1:], vr, dtype=np.float64)
    S, V = [], []
    for xt in x:
        h = v + (xt - (v - vr)) / tau
        s = (h - th >= 0).astype(np.float64)
        v = s * vr + (1 - s) * h
        S.append(s)
        V.append(v.copy())
    return np.array(S), np.array(V)


RNG = np.random.default_rng(1234)


# --------------------------------------------------------------------------- #
# update: statements in order, augmented assignments, locals
# --------------------------------------------------------------------------- #
def test_update_statements_in_order_and_augassign():
    m = mk("""\
        neuron Order:
            input x
            param k = 2.0
            state a = 0.0
            state b = 0.0
            update:
                a = a + x
                b = a * k
                a += 1.0
                b -= x
                a *= 0.5
            output a, b
        """)
    x = RNG.normal(size=(7, 3))
    a = np.zeros(3)
    b = np.zeros(3)
    A, B = [], []
    for xt in x:
        a = a + xt
        b = a * 2.0
        a = a + 1.0
        b = b - xt
        a = a * 0.5
        A.append(a.copy())
        B.append(b.copy())
    ya, yb = m(t64(x))
    close(ya, A)
    close(yb, B)
    close(m.a, A[-1])
    close(m.b, B[-1])


def test_locals_let_and_bare():
    m = mk("""\
        neuron Locals:
            input x
            state a = 1.0
            update:
                let y = x * 2.0
                z = y + a
                a = z - 0.5 * a
                w = a + y
            output a, y, z, w
        """)
    x = RNG.normal(size=(6, 4))
    a = np.ones(4)
    out = {k: [] for k in "ayzw"}
    for xt in x:
        y = 2.0 * xt
        z = y + a
        a = z - 0.5 * a
        w = a + y
        for k, val in zip("ayzw", (a, y, z, w)):
            out[k].append(np.array(val, dtype=np.float64).copy())
    got = m(t64(x))
    assert isinstance(got, tuple) and len(got) == 4
    for g, k in zip(got, "ayzw"):
        close(g, out[k])


def test_previous_step_value_snntorch_delayed_reset():
    m = mk("""\
        neuron Leaky:
            input x
            param beta = 0.5
            param threshold = 1.0
            state mem = 0.0
            update:
                r = where(mem > threshold, 1, 0)
                mem = beta*mem + x - r*threshold
            spike when mem > threshold surrogate atan(alpha=2.0)
            output spike, mem
        """)
    x = RNG.uniform(0.0, 1.5, size=(30, 5))
    mem = np.zeros(5)
    S, M = [], []
    for xt in x:
        r = (mem > 1.0).astype(float)
        mem = 0.5 * mem + xt - r * 1.0
        S.append((mem > 1.0).astype(float))
        M.append(mem.copy())
    s, mm = m(t64(x))
    assert np.array(S).sum() > 5
    close(s, S)
    close(mm, M)


# --------------------------------------------------------------------------- #
# spike and on spike
# --------------------------------------------------------------------------- #
def test_on_spike_is_simultaneous():
    m = mk("""\
        neuron Swap:
            input x
            param th = 3.0
            state a = 1.0
            state b = 2.0
            state c = 0.0
            update:
                a = a + x
            spike when a >= th surrogate sigmoid(alpha=4.0)
            on spike:
                a = b
                b = a
                c += a + b
            output spike, a, b, c
        """)
    x = RNG.uniform(0.0, 2.0, size=(25, 4))
    a, b, c = np.ones(4), np.full(4, 2.0), np.zeros(4)
    S, A, B, C = [], [], [], []
    for xt in x:
        a = a + xt
        s = (a >= 3.0).astype(float)
        a, b, c = s * b + (1 - s) * a, s * a + (1 - s) * b, c + s * (a + b)
        S.append(s)
        A.append(a.copy())
        B.append(b.copy())
        C.append(c.copy())
    assert np.array(S).sum() > 3
    got = m(t64(x))
    for g, w in zip(got, (S, A, B, C)):
        close(g, w)


@pytest.mark.parametrize("op,expected", [(">=", [0, 1, 1, 1, 0]), (">", [0, 0, 1, 0, 0])])
def test_spike_at_equality(op, expected):
    m = mk(f"""\
        neuron Th:
            input x
            param th = 1.0
            state v = 0.0
            update:
                v = x
            spike when v {op} th surrogate sigmoid(alpha=4.0)
            output spike
        """)
    x = t64([0.5, 1.0, 1.5, 1.0, -1.0])
    close(m(x), expected)


def test_spiking_model_without_params():
    """A spiking model need not declare any param."""
    m = mk("""\
        neuron NoParams:
            input x
            state v = 0.0
            update:
                v = v + x
            spike when v >= 1.0 surrogate sigmoid(alpha=4.0)
            on spike:
                v = 0.0
            output spike, v
        """)
    x = t64([0.5, 0.5, 0.75, 0.5, 2.0])[:, None].requires_grad_(True)
    s, v = m(x)
    close(s[:, 0], [0, 1, 0, 1, 1])
    close(v[:, 0], [0.5, 0.0, 0.75, 0.0, 0.0])
    s.sum().backward()
    assert x.grad is not None


def test_spike_rule_with_expressions_both_sides():
    # heaviside(A - B): A = 2*v, B = th + 1
    m = mk("""\
        neuron Th2:
            input x
            param th = 1.0
            state v = 0.0
            update:
                v = x
            spike when 2 * v >= th + 1 surrogate sigmoid(alpha=4.0)
            output spike
        """)
    close(m(t64([0.5, 0.999, 1.0, 2.0])), [0, 0, 1, 1])
    # backward: d spike/d u = S'(u) with u = A - B = 2x - 2, so d spike/d x = 2 S'(u)
    xs = np.array([0.3, 0.9, 1.1, 1.6])
    x = t64(xs).requires_grad_(True)
    m.reset()
    m(x).sum().backward()
    close(x.grad, 2 * _sg_sigmoid(2 * xs - 2))


def test_soft_reset_and_hard_reset_values():
    m = mk("""\
        neuron Soft:
            input x
            param v_threshold = 1.0
            state v = 0.0
            update:
                v = v + x
            spike when v >= v_threshold surrogate sigmoid(alpha=4.0)
            on spike:
                v -= v_threshold
            output spike, v
        """)
    x = RNG.uniform(0.0, 0.9, size=(40, 3))
    v = np.zeros(3)
    S, V = [], []
    for xt in x:
        v = v + xt
        s = (v >= 1.0).astype(float)
        v = v - s * 1.0
        S.append(s)
        V.append(v.copy())
    s, vv = m(t64(x))
    close(s, S)
    close(vv, V)


# --------------------------------------------------------------------------- #
# expressions
# --------------------------------------------------------------------------- #
def test_builtin_functions_values():
    m = mk("""\
        neuron Fns:
            input x
            state s0 = 0.0
            update:
                s0 = x
                y1 = where(x > 0.5, x, -x)
                y2 = clip(x, -1, 1)
                y3 = min(x, 0.25)
                y4 = max(x, 0.25)
                y5 = heaviside(x)
                y6 = exp(x) + log(abs(x) + 1) + sqrt(abs(x))
                y7 = sin(x) * cos(x) + tanh(x)
                y8 = sigmoid(x) + relu(x) + pi
                y9 = where(x >= 0, 1, 0) + where(x <= 0, 10, 0) + where(x < 0, 100, 0)
                y10 = x ** 2 - -x / 4 + 2 ** x
                y11 = heaviside(x - 0.25) * 3
            output y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11
        """)
    xs = [-2.0, -0.5, 0.0, 0.25, 0.5, 0.75, 2.0]
    want = [[] for _ in range(11)]
    for x in xs:
        vals = [
            x if x > 0.5 else -x,
            min(max(x, -1.0), 1.0),
            min(x, 0.25),
            max(x, 0.25),
            1.0 if x >= 0 else 0.0,
            math.exp(x) + math.log(abs(x) + 1) + math.sqrt(abs(x)),
            math.sin(x) * math.cos(x) + math.tanh(x),
            1 / (1 + math.exp(-x)) + max(x, 0.0) + math.pi,
            (1 if x >= 0 else 0) + (10 if x <= 0 else 0) + (100 if x < 0 else 0),
            x**2 + x / 4 + 2**x,
            3.0 if x - 0.25 >= 0 else 0.0,
        ]
        for w, v in zip(want, vals):
            w.append(v)
    got = m(t64(xs)[:, None])
    assert len(got) == 11
    for g, w in zip(got, want):
        close(g[:, 0], w)


def test_multiple_inputs_in_call_order():
    text = """\
        neuron TwoIn:
            input a, b
            state v = 0.0
            update:
                v = a - 2.0 * b + 0.5 * v
            output v
        """
    m = mk(text)
    a = RNG.normal(size=(5, 2))
    b = RNG.normal(size=(5, 2))
    v = np.zeros(2)
    V = []
    for at, bt in zip(a, b):
        v = at - 2.0 * bt + 0.5 * v
        V.append(v.copy())
    close(m(t64(a), t64(b)), V)
    m.reset()
    # swapping the arguments swaps the roles
    v = np.zeros(2)
    V2 = []
    for at, bt in zip(a, b):
        v = bt - 2.0 * at + 0.5 * v
        V2.append(v.copy())
    close(m(t64(b), t64(a)), V2)


@pytest.mark.parametrize("order", [("v", "spike", "u"), ("u", "v"), ("spike",), ("v",)])
def test_multiple_outputs_in_output_order(order):
    m = mk(f"""\
        neuron Outs:
            input x
            param th = 1.0
            state v = 0.0
            update:
                v = v + x
                u = v * 3.0
            spike when v >= th surrogate sigmoid(alpha=4.0)
            on spike:
                v = 0.0
            output {", ".join(order)}
        """)
    x = RNG.uniform(0, 0.7, size=(12, 3))
    v = np.zeros(3)
    ref = {"v": [], "spike": [], "u": []}
    for xt in x:
        v = v + xt
        u = v * 3.0
        s = (v >= 1.0).astype(float)
        v = (1 - s) * v
        ref["v"].append(v.copy())
        ref["spike"].append(s)
        ref["u"].append(u.copy())
    got = m(t64(x))
    if len(order) == 1:
        assert isinstance(got, torch.Tensor)
        got = (got,)
    assert len(got) == len(order)
    for g, name in zip(got, order):
        close(g, ref[name])


# --------------------------------------------------------------------------- #
# module behaviour
# --------------------------------------------------------------------------- #
def test_lif_matches_hand_reference():
    m = mk(LIF)
    x = RNG.uniform(0, 2.5, size=(20, 3, 2))
    S, V = lif_ref(x)
    close(m(t64(x)), S)
    close(m.v, V[-1])


def test_step_mode_s_equals_m():
    x = RNG.uniform(0, 2.5, size=(15, 4))
    mm = mk(LIF, step_mode="m")
    ms = mk(LIF, step_mode="s")
    ym = mm(t64(x))
    ys = torch.stack([ms(t64(x[t])) for t in range(len(x))])
    close(ys, ym.numpy(), rtol=0, atol=0)
    close(ms.v, mm.v.numpy(), rtol=0, atol=0)
    assert ms(t64(x[0])).shape == (4,)


def test_core_single_step_function():
    m = mk(LIF)
    x = t64(RNG.uniform(0, 2.5, size=(5,)))
    v = t64(np.full(5, 0.3))
    out = m.core(x, v)
    s, v_new = out
    h = 0.3 + (x.numpy() - 0.3) / 2.0
    sr = (h >= 1.0).astype(float)
    close(s, sr)
    close(v_new, (1 - sr) * h)


def test_reset_restores_initial_states():
    m = mk(LIF, v_reset=-0.25)
    xn = RNG.uniform(0, 2.5, size=(9, 3))
    xn[-1] = 0.1  # no spike at the last step
    x = t64(xn)
    y1 = m(x)
    v_after = torch.as_tensor(m.v).clone()
    assert not torch.all(v_after == -0.25)
    m.reset()
    assert torch.all(torch.as_tensor(m.v) == -0.25)
    y2 = m(x)
    close(y2, y1.numpy(), rtol=0, atol=0)
    # without reset the state carries over: the same input gives the hand values
    S, _ = lif_ref(np.concatenate([x.numpy(), x.numpy()]), vr=-0.25)
    close(m(x), S[9:])


def test_spikingjelly_reset_net_and_set_step_mode():
    from spikingjelly.activation_based import functional as sj
    net = torch.nn.Sequential(mk(LIF))
    x = t64(RNG.uniform(0, 2.5, size=(9, 3)))
    y1 = net(x)
    sj.reset_net(net)
    close(net(x), y1.numpy(), rtol=0, atol=0)
    sj.reset_net(net)
    sj.set_step_mode(net, "s")
    ys = torch.stack([net(x[t]) for t in range(9)])
    close(ys, y1.numpy(), rtol=0, atol=0)


def test_state_init_expression_of_params():
    text = """\
        neuron Init:
            input x
            param v0 = 0.5
            param c = 0.25
            state v = v0 * 2 + c
            update:
                v = v + x
            output v
        """
    x = RNG.normal(size=(4, 2))
    close(mk(text)(t64(x)), 1.25 + np.cumsum(x, axis=0))
    close(mk(text, v0=1.5)(t64(x)), 3.25 + np.cumsum(x, axis=0))
    close(mk(text, v0=1.5, c=-1.0)(t64(x)), 2.0 + np.cumsum(x, axis=0))


def test_param_default_from_earlier_param_and_override():
    text = """\
        neuron P:
            input x
            param a = 2.0
            param b = a * 3 + pi
            state v = 0.0
            update:
                v = b * x
            output v
        """
    x = RNG.normal(size=(3, 2))
    close(mk(text)(t64(x)), (6 + math.pi) * x)
    # an override of `a` propagates to the default of `b`, an override of `b` wins
    close(mk(text, a=1.0)(t64(x)), (3 + math.pi) * x)
    close(mk(text, a=1.0, b=0.5)(t64(x)), 0.5 * x)


def test_param_overrides_at_load():
    x = RNG.uniform(0, 2.5, size=(20, 3))
    m = mk(LIF, tau=4.0, v_threshold=0.8, v_reset=-0.1)
    S, V = lif_ref(x, tau=4.0, th=0.8, vr=-0.1)
    close(m(t64(x)), S)
    close(m.v, V[-1])
    assert float(m.tau) == 4.0


def test_param_reassignment_without_recompiling():
    x = RNG.uniform(0, 2.5, size=(20, 3))
    m = mk(LIF)
    m.tau = 3.0
    m.v_threshold = 0.7
    S, _ = lif_ref(x, tau=3.0, th=0.7)
    close(m(t64(x)), S)


def test_param_shapes_per_channel():
    m = mk(LIF, param_shapes={"tau": (4, 1)})
    assert tuple(torch.as_tensor(m.tau).shape) == (4, 1)
    assert torch.all(torch.as_tensor(m.tau) == 2.0)
    taus = np.array([[1.5], [2.0], [3.0], [5.0]])
    m.tau = t64(taus)
    x = RNG.uniform(0, 2.5, size=(25, 4, 3))
    S, V = lif_ref(x, tau=taus)
    # and by hand, one channel at a time
    for ch in range(4):
        S_ch, _ = lif_ref(x[:, ch, :], tau=float(taus[ch, 0]))
        np.testing.assert_array_equal(S[:, ch, :], S_ch)
    close(m(t64(x)), S)
    close(m.v, V[-1])


def test_param_shapes_violating_where_per_element():
    m = mk(LIF, param_shapes={"tau": (3,)})
    with pytest.raises(flexdsl.FlexDSLError):
        m.tau = t64([2.0, 0.5, 3.0])


def test_param_shapes_learnable():
    text = LIF.replace("param tau = 2.0 where tau > 1", "param tau = 2.0 where tau > 1 learnable")
    m = mk(text, param_shapes={"tau": (3,)})
    m = m.double()
    # bounded (`tau > 1`): it trains as tau = 1 + softplus(raw_tau), raw_tau of the param's shape
    assert isinstance(m.raw_tau, torch.nn.Parameter) and tuple(m.raw_tau.shape) == (3,)
    m.tau = t64([1.5, 2.5, 4.0])
    close(m.tau, [1.5, 2.5, 4.0])
    x = RNG.uniform(0, 2.5, size=(10, 2, 3))
    S, _ = lif_ref(x, tau=np.array([1.5, 2.5, 4.0]))
    y = m(t64(x))
    close(y, S)
    y.sum().backward()
    assert m.raw_tau.grad is not None and m.raw_tau.grad.shape == (3,)


# --------------------------------------------------------------------------- #
# gradients
# --------------------------------------------------------------------------- #
LI = """\
    neuron LI:
        input x
        param tau = 2.0 where tau > 1 learnable
        param gain = 0.7 learnable
        state v = 0.0
        update:
            v = v + (gain * x - v) / tau
            y = v * v
        output y
    """


def test_learnable_params_are_parameters_with_gradients():
    m = mk(LI).double()
    m.tau = 2.0  # (exactly, in float64: the module was made in float32)
    names = {n for n, _ in m.named_parameters()}
    assert names == {"raw_tau", "gain"}  # bounded `tau > 1` trains as tau = 1 + softplus(raw_tau)
    x = t64(RNG.normal(size=(6, 3))).requires_grad_(True)
    w = t64(RNG.normal(size=(6, 3)))
    loss = (m(x) * w).sum()
    loss.backward()
    g_tau = float(m.raw_tau.grad / torch.sigmoid(m.raw_tau.detach()))  # d/dtau = d/draw_tau / softplus'
    g_gain, g_x = float(m.gain.grad), x.grad.clone()

    def L(tau=2.0, gain=0.7, xx=None):
        # learnable params are float32 Parameters until .double(): set exact values after
        mm = mk(LI).double()
        mm.tau = tau
        with torch.no_grad():
            mm.gain.fill_(gain)
            return float((mm(xx if xx is not None else x.detach()) * w).sum())

    eps = 1e-6
    fd_tau = (L(tau=2.0 + eps) - L(tau=2.0 - eps)) / (2 * eps)
    fd_gain = (L(gain=0.7 + eps) - L(gain=0.7 - eps)) / (2 * eps)
    assert g_tau == pytest.approx(fd_tau, rel=1e-6, abs=1e-9)
    assert g_gain == pytest.approx(fd_gain, rel=1e-6, abs=1e-9)
    for idx in [(0, 0), (2, 1), (5, 2)]:
        xp = x.detach().clone()
        xm = x.detach().clone()
        xp[idx] += eps
        xm[idx] -= eps
        fd = (L(xx=xp) - L(xx=xm)) / (2 * eps)
        assert float(g_x[idx]) == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_non_learnable_params_are_not_parameters():
    m = mk(LIF)
    assert list(m.parameters()) == []


def _sg_sigmoid(u, alpha=4.0):
    z = sig(alpha * u)
    return alpha * z * (1 - z)


@pytest.mark.parametrize("detach", [False, True])
def test_detach_reset_gradient_by_hand(detach):
    tau, th, vr = 2.0, 1.0, -0.2
    x1 = np.array([2.6, 1.8, 3.0, 2.35])
    x2 = np.array([1.0, 2.5, 0.4, 2.1])
    c1 = np.array([1.0, 0.5, -1.0, 2.0])
    c2 = np.array([0.3, 1.0, 2.0, -0.7])
    # forward by hand
    v0 = np.full(4, vr)
    h1 = v0 + (x1 - (v0 - vr)) / tau
    u1 = h1 - th
    s1 = (u1 >= 0).astype(float)
    v1 = s1 * vr + (1 - s1) * h1
    h2 = v1 + (x2 - (v1 - vr)) / tau
    u2 = h2 - th
    s2 = (u2 >= 0).astype(float)
    assert 0 < s1.sum() < 4  # both branches exercised
    # backward by hand (L = sum(c1*s1 + c2*s2))
    ds1_dh1 = 0.0 if detach else _sg_sigmoid(u1)
    dv1_dh1 = (1 - s1) + (vr - h1) * ds1_dh1
    dL_dh2 = c2 * _sg_sigmoid(u2)
    dL_dh1 = c1 * _sg_sigmoid(u1) + dL_dh2 * (1 - 1 / tau) * dv1_dh1
    want = np.stack([dL_dh1 / tau, dL_dh2 / tau])

    m = mk(LIF, v_reset=vr, detach_reset=detach)
    x = t64(np.stack([x1, x2])).requires_grad_(True)
    s = m(x)
    close(s, np.stack([s1, s2]))
    (s * t64(np.stack([c1, c2]))).sum().backward()
    close(x.grad, want)


def test_detach_reset_makes_a_difference():
    x = t64([[2.6, 2.2], [1.0, 1.9]])
    g = []
    for d in (False, True):
        m = mk(LIF, detach_reset=d)
        xx = x.clone().requires_grad_(True)
        m(xx).sum().backward()
        g.append(xx.grad.clone())
    assert torch.allclose(g[0][1], g[1][1])  # last step: same
    assert not torch.allclose(g[0][0], g[1][0])  # through the reset: differs


SURROGATES = {
    "sigmoid(alpha=4.0)": lambda u: 4 * sig(4 * u) * (1 - sig(4 * u)),
    "sigmoid(alpha=2.0)": lambda u: 2 * sig(2 * u) * (1 - sig(2 * u)),
    "atan(alpha=2.0)": lambda u: (2.0 / 2) / (1 + (math.pi / 2 * 2.0 * u) ** 2),
    "atan(alpha=3.0)": lambda u: (3.0 / 2) / (1 + (math.pi / 2 * 3.0 * u) ** 2),
    "piecewise_quadratic(alpha=1.0)": lambda u: np.where(np.abs(u) <= 1.0, 1.0 - np.abs(u), 0.0),
    "piecewise_exp(alpha=1.5)": lambda u: (1.5 / 2) * np.exp(-1.5 * np.abs(u)),
    "soft_sign(alpha=2.0)": lambda u: 1 / (2 * 2.0 * (1 / 2.0 + np.abs(u)) ** 2),
    "super_spike(alpha=1.0)": lambda u: 1.0 / (np.abs(u) + 1) ** 2,
    "erf(alpha=2.0)": lambda u: (2.0 / math.sqrt(math.pi)) * np.exp(-((2.0 * u) ** 2)),
    "fast_sigmoid(slope=25.0)": lambda u: 1 / (25.0 * np.abs(u) + 1) ** 2,
    "triangle(alpha=1.0)": lambda u: 1.0 * np.maximum(1 - 1.0 * np.abs(u), 0),
    "rect(alpha=1.0)": lambda u: np.where(np.abs(u) < 0.5, 1.0, 0.0),
    "straight_through()": lambda u: np.ones_like(u),
    "spike_rate_escape(beta=0.5, slope=3.0)": lambda u: 3.0 * np.exp(-0.5 * np.abs(u - 1)),
}


@pytest.mark.parametrize("surr", list(SURROGATES), ids=list(SURROGATES))
def test_surrogate_derivatives(surr):
    m = mk(f"""\
        neuron S:
            input x
            param th = 0.5
            state v = 0.0
            update:
                v = x
            spike when v >= th surrogate {surr}
            output spike
        """)
    u = np.array([-1.7, -0.8, -0.3, -0.05, 0.1, 0.35, 0.7, 1.3])
    x = t64(u + 0.5)[None].requires_grad_(True)
    m(x).sum().backward()
    close(x.grad[0], SURROGATES[surr](u), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "arg,inp", [("u", "x"), ("x", "I"), ("x", "x")], ids=["arg_u", "arg_x_input_I", "arg_x_input_x"]
)
def test_user_defined_surrogate(arg, inp):
    """Section 3: `surrogate name(x, k=v) = expr`, expr the derivative as a function of x and k.
    The argument is bound inside the definition, so naming it `x` in a model whose
    input is `x` (as in section 1's LIF) is the contract's literal form."""
    m = mk(f"""\
        neuron S:
            input {inp}
            surrogate bump({arg}, k=1.0) = k * exp(-{arg} * {arg})
            param th = 0.5
            state v = 0.0
            update:
                v = {inp}
            spike when v >= th surrogate bump(k=3.0)
            output spike
        """)
    u = np.array([-1.0, -0.2, 0.0, 0.4, 2.0])
    x = t64(u + 0.5)[None].requires_grad_(True)
    s = m(x)
    close(s[0], (u >= 0).astype(float))
    s.sum().backward()
    close(x.grad[0], 3.0 * np.exp(-u * u))


def test_user_defined_surrogate_default_keyword():
    m = mk("""\
        neuron S:
            input x
            surrogate tri(u, width=0.5) = relu(1 - abs(u) / width) / width
            param th = 0.0
            state v = 0.0
            update:
                v = x
            spike when v >= th surrogate tri()
            output spike
        """)
    u = np.array([-0.7, -0.2, 0.1, 0.3])
    x = t64(u)[None].requires_grad_(True)
    m(x).sum().backward()
    close(x.grad[0], np.maximum(1 - np.abs(u) / 0.5, 0) / 0.5)


def test_heaviside_in_expression_has_zero_gradient():
    m = mk("""\
        neuron H:
            input x
            state v = 0.0
            update:
                v = heaviside(x - 0.5) * x
            output v
        """)
    xs = np.array([-1.0, 0.2, 0.5, 0.9, 3.0])
    x = t64(xs)[None].requires_grad_(True)
    y = m(x)
    close(y[0], np.where(xs >= 0.5, xs, 0.0))
    y.sum().backward()
    close(x.grad[0], np.where(xs >= 0.5, 1.0, 0.0))


def test_where_gradient_follows_the_chosen_branch():
    m = mk("""\
        neuron W:
            input x
            state v = 0.0
            update:
                v = where(x > 0.5, x * x, 3 * x) + clip(x, -1, 1)
            output v
        """)
    xs = np.array([-2.0, 0.2, 0.7, 0.9, 3.0])
    x = t64(xs)[None].requires_grad_(True)
    y = m(x)
    close(y[0], np.where(xs > 0.5, xs * xs, 3 * xs) + np.clip(xs, -1, 1))
    y.sum().backward()
    close(x.grad[0], np.where(xs > 0.5, 2 * xs, 3.0) + np.where(np.abs(xs) < 1, 1.0, 0.0))


def test_compile_and_load_by_path_and_stem():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    for ref in ("lif", str(root / "neurons" / "lif.neuron")):
        c = flexdsl.compile(ref)
        assert "def " in c.torch_source
        assert c.step_equations and c.backward_equations
        assert "v" in str(c.step_equations)
    c = flexdsl.compile(textwrap.dedent(LIF))
    assert "tau" in c.torch_source or "tau" in str(c.step_equations)
    x = RNG.uniform(0, 2.5, size=(10, 2))
    S, _ = lif_ref(x)
    close(flexdsl.load(str(root / "neurons" / "lif.neuron"))(t64(x)), S)


def test_non_spiking_model_outputs_state():
    m = mk("""\
        neuron LeakyIntegrator:
            input x
            param tau = 4.0 where tau > 0
            state v = 0.5
            update:
                v = v + (x - v) / tau
            output v
        """)
    x = RNG.normal(size=(10, 3))
    v = np.full(3, 0.5)
    V = []
    for xt in x:
        v = v + (xt - v) / 4.0
        V.append(v.copy())
    y = m(t64(x))
    assert isinstance(y, torch.Tensor)
    close(y, V)


# --------------------------------------------------------------------------- #
# ODEs: the integration methods, by hand
# --------------------------------------------------------------------------- #
def ode_text(method, rhs="-v / tau + I", dt=0.5, tau=2.0, v0=1.0):
    head = f"equations method {method}:" if method else "equations:"
    return f"""\
        neuron Dec:
            input I
            param dt = {dt}
            param tau = {tau} where tau > 0
            state v = {v0}
            {head}
                dv/dt = {rhs}
            output v
        """


def step_method(method, f, v, dt):
    if method == "euler":
        return v + dt * f(v)
    if method == "rk2":
        return v + dt * f(v + dt / 2 * f(v))
    if method == "heun":
        return v + dt / 2 * (f(v) + f(v + dt * f(v)))
    if method == "rk4":
        k1 = f(v)
        k2 = f(v + dt / 2 * k1)
        k3 = f(v + dt / 2 * k2)
        k4 = f(v + dt * k3)
        return v + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    raise ValueError(method)


def LINEAR_EXACT(v, I, dt, tau):
    return v * math.exp(-dt / tau) + I * tau * (1 - math.exp(-dt / tau))


@pytest.mark.parametrize("method", ["euler", "rk2", "heun", "rk4", "exponential_euler", "exact"])
@pytest.mark.parametrize("T", [1, 25])
def test_linear_ode_methods(method, T):
    dt, tau = 0.5, 2.0
    m = mk(ode_text(method, dt=dt, tau=tau))
    I = RNG.uniform(-1, 2, size=(T, 3))
    v = np.full(3, 1.0)
    V = []
    for It in I:
        if method in ("exact", "exponential_euler"):
            v = LINEAR_EXACT(v, It, dt, tau)
        else:
            v = step_method(method, lambda vv, It=It: -vv / tau + It, v, dt)
        V.append(v.copy())
    close(m(t64(I)), V)


@pytest.mark.parametrize("method", ["euler", "rk2", "heun", "rk4"])
def test_nonlinear_ode_methods(method):
    dt, tau = 0.25, 2.0
    m = mk(ode_text(method, rhs="-v * v / tau + I + sin(v)", dt=dt, tau=tau))
    I = RNG.uniform(0, 1, size=(20, 3))
    v = np.full(3, 1.0)
    V = []
    for It in I:
        v = step_method(method, lambda vv, It=It: -vv * vv / tau + It + np.sin(vv), v, dt)
        V.append(v.copy())
    close(m(t64(I)), V)


def test_methods_differ_where_they_should():
    I = t64(np.full((3, 1), 1.0))
    outs = {
        meth: mk(ode_text(meth, rhs="-v * v / tau + I"))(I)[-1, 0].item()
        for meth in ("euler", "rk2", "heun", "rk4")
    }
    assert len(set(outs.values())) == 4, outs


def test_exact_closed_form_many_steps_and_dt_override():
    m = mk(ode_text("exact"), dt=0.1, tau=10.0)
    I = np.full((200, 1), 1.5)
    V = []
    v = 1.0
    for _ in range(200):
        v = v * math.exp(-0.1 / 10) + 1.5 * 10 * (1 - math.exp(-0.1 / 10))
        V.append([v])
    close(m(t64(I)), V)


def test_auto_method_linear_is_exact_nonlinear_is_euler():
    I = RNG.uniform(0, 1, size=(10, 2))
    # linear: exact
    m = mk(ode_text(None))
    v = np.ones(2)
    V = []
    for It in I:
        v = LINEAR_EXACT(v, It, 0.5, 2.0)
        V.append(v.copy())
    close(m(t64(I)), V)
    # nonlinear: euler
    m = mk(ode_text(None, rhs="-v * v / tau + I"))
    v = np.ones(2)
    V = []
    for It in I:
        v = v + 0.5 * (-v * v / 2.0 + It)
        V.append(v.copy())
    close(m(t64(I)), V)


def test_auto_method_is_reported_by_compile_or_show():
    import os
    import sys
    import tempfile

    lin = textwrap.dedent(ode_text(None))
    nonlin = textwrap.dedent(ode_text(None, rhs="-v * v / tau + I"))
    with tempfile.TemporaryDirectory() as d:
        for text, word in ((lin, "exact"), (nonlin, "euler")):
            c = flexdsl.compile(text)
            assert c.step_equations is not None
            p = os.path.join(d, f"{word}.neuron")
            with open(p, "w") as fh:
                fh.write(text)
            import contextlib
            import io
            import runpy

            out = io.StringIO()
            old, sys.argv = sys.argv, ["flexdsl", "show", p, "--equations"]
            code = 0
            try:
                with contextlib.redirect_stdout(out):
                    runpy.run_module("flexdsl", run_name="__main__", alter_sys=False)
            except SystemExit as e:
                code = e.code or 0
            finally:
                sys.argv = old
            assert code == 0
            assert word in out.getvalue().lower(), out.getvalue()


def test_exact_two_state_linear_system_then_update():
    """equations first (joint exact integration), then update (i += x)."""
    dt, ts, tm = 0.5, 1.0, 3.0
    m = mk(f"""\
        neuron Syn:
            input x
            param dt = {dt}
            param tau_s = {ts} where tau_s > 0
            param tau_m = {tm} where tau_m > 0
            state i = 0.0
            state v = 0.0
            equations method exact:
                di/dt = -i / tau_s
                dv/dt = (-v + i) / tau_m
            update:
                i += x
            output v, i
        """)
    x = RNG.uniform(0, 2, size=(15, 3))
    es, em = math.exp(-dt / ts), math.exp(-dt / tm)
    i = np.zeros(3)
    v = np.zeros(3)
    V, Iv = [], []
    for xt in x:
        C = i * ts / (ts - tm)
        v, i = v * em + C * (es - em), i * es
        i = i + xt
        V.append(v.copy())
        Iv.append(i.copy())
    vv, ii = m(t64(x))
    close(vv, V)
    close(ii, Iv)


SYN = """\
    neuron Syn:
        input x
        param dt = 0.5
        param tau_s = 1.0 where tau_s > 0
        param tau_m = 3.0 where tau_m > 0
        state i = 0.0
        state v = 0.0
        equations method exact:
            di/dt = -i / tau_s
            dv/dt = (-v + i) / tau_m
        update:
            i += x
        output v, i
    """


@pytest.mark.parametrize("how", ["override", "assignment"])
def test_exact_two_state_equal_time_constants(how):
    """`exact` must stay exact for every param value the constraints allow, including
    tau_s == tau_m (a defective matrix: v(dt) = exp(-dt/tau) * (v + i*dt/tau))."""
    dt, tau = 0.5, 2.0
    if how == "override":
        m = mk(SYN, tau_s=tau, tau_m=tau)
    else:
        m = mk(SYN)
        m.tau_s = tau
        m.tau_m = tau
    x = RNG.uniform(0, 2, size=(10, 3))
    e = math.exp(-dt / tau)
    i = np.zeros(3)
    v = np.zeros(3)
    V, Iv = [], []
    for xt in x:
        v, i = e * (v + i * dt / tau), i * e
        i = i + xt
        V.append(v.copy())
        Iv.append(i.copy())
    vv, ii = m(t64(x))
    close(ii, Iv)
    close(vv, V, rtol=1e-9, atol=1e-12)


def test_exact_two_state_nearly_equal_time_constants():
    """Close (not equal) time constants must not lose the result to cancellation."""
    import mpmath

    mpmath.mp.dps = 50
    dt, ts, tm = 0.5, 2.0, 2.0 + 1e-9
    m = mk(SYN, tau_s=ts, tau_m=tm)
    x = np.array([[1.0], [0.0], [0.0], [0.0]])
    es, em = mpmath.exp(-dt / mpmath.mpf(ts)), mpmath.exp(-dt / mpmath.mpf(tm))
    i, v = mpmath.mpf(0), mpmath.mpf(0)
    V = []
    for xt in x[:, 0]:
        C = i * ts / (mpmath.mpf(ts) - mpmath.mpf(tm))
        v, i = v * em + C * (es - em), i * es
        i = i + xt
        V.append([float(v)])
    vv, _ = m(t64(x))
    close(vv, V, rtol=1e-6, atol=1e-12)


def test_exact_with_input_dependent_coefficient():
    """Inputs are constant over the step, so `dv/dt = -v*I/tau` is linear with
    state-free coefficients: exact gives v*exp(-I*dt/tau)."""
    m = mk(ode_text(None, rhs="-v * I / tau"))
    I = RNG.uniform(0, 2, size=(6, 2))
    v = np.ones(2)
    V = []
    for It in I:
        v = v * np.exp(-It * 0.5 / 2.0)
        V.append(v.copy())
    close(m(t64(I)), V)


def test_exact_nilpotent_system():
    m = mk("""\
        neuron N:
            input x
            param dt = 0.5
            state p = 0.0
            state q = 1.0
            equations method exact:
                dp/dt = q
                dq/dt = x
            output p, q
        """)
    x = RNG.uniform(-1, 1, size=(5, 2))
    p, q = np.zeros(2), np.ones(2)
    P, Q = [], []
    for xt in x:
        p, q = p + q * 0.5 + xt * 0.5**2 / 2, q + xt * 0.5
        P.append(p.copy())
        Q.append(q.copy())
    pp, qq = m(t64(x))
    close(pp, P)
    close(qq, Q)


def test_equations_subexpression():
    m = mk("""\
        neuron Sub:
            input I
            param dt = 0.5
            param tau = 2.0 where tau > 0
            state v = 0.0
            equations method euler:
                I_tot = 2.0 * I - 0.5 * v
                dv/dt = (I_tot - v) / tau
            output v
        """)
    I = RNG.uniform(0, 1, size=(8, 2))
    v = np.zeros(2)
    V = []
    for It in I:
        v = v + 0.5 * ((2.0 * It - 0.5 * v) - v) / 2.0
        V.append(v.copy())
    close(m(t64(I)), V)


def test_ode_with_spike_and_reset():
    dt, tau = 0.1, 10.0
    m = mk("""\
        neuron LIF_ODE:
            input I
            param dt = 0.1
            param tau_m = 10.0 where tau_m > 0
            param v_rest = 0.0
            param v_threshold = 1.0
            state v = v_rest
            equations method exact:
                dv/dt = (v_rest - v + I) / tau_m
            spike when v > v_threshold surrogate atan(alpha=2.0)
            on spike:
                v = v_rest
            output spike, v
        """)
    I = np.full((400, 2), [1.2, 2.0])
    v = np.zeros(2)
    S, V = [], []
    e = math.exp(-dt / tau)
    for It in I:
        v = v * e + It * (1 - e)
        s = (v > 1.0).astype(float)
        v = (1 - s) * v
        S.append(s)
        V.append(v.copy())
    s, vv = m(t64(I))
    assert np.array(S).sum() > 5
    close(s, S)
    close(vv, V, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- #
# more of sections 2–8
# --------------------------------------------------------------------------- #
def test_number_literals():
    m = mk("""\
        neuron Nums:
            input x
            param a = 1
            param b = 1.0
            param c = .5
            param d = 1e-3
            param e = 2.5E+2
            param f = 3e2
            state v = 0.0
            update:
                v = a * x + b + c + d + e + f + 0.25e1
            output v
        """)
    rest = 1.0 + 0.5 + 1e-3 + 250.0 + 300.0 + 2.5
    close(m(t64([[0.0], [1.0]])), [[0.0 + rest], [1.0 + rest]])


def test_declarations_and_blocks_in_any_order():
    """Sections 2 and 3: declarations may appear in any order, before or between blocks."""
    text = """\
        neuron Shuffled:
            \"\"\"Blocks first, declarations after.\"\"\"
            output spike
            on spike:
                v = v_reset
            spike when v >= v_threshold surrogate sigmoid(alpha=4.0)
            update:
                v = v + (x - (v - v_reset)) / tau
            state v = v_reset
            param v_reset = 0.0
            param tau = 2.0 where tau > 1
            param v_threshold = 1.0
            input x
        """
    x = RNG.uniform(0, 2.5, size=(20, 3))
    S, V = lif_ref(x)
    m = mk(text)
    close(m(t64(x)), S)
    close(m.v, V[-1])


def test_reset_uses_exact_blend_form():
    """Section 4, item 4: `X = e` is computed as s*e + (1-s)*X (exact for s in {0, 1})."""
    m = mk("""\
        neuron Big:
            input x
            param v_reset = 0.25
            param v_threshold = 1.0
            state v = 0.0
            update:
                v = v + x
            spike when v >= v_threshold surrogate sigmoid(alpha=4.0)
            on spike:
                v = v_reset
            output v
        """)
    x = t64([[1e17, 0.5, 3e-17]])
    v = m(x)
    # s=1: exactly v_reset (X + s*(e - X) would give 0.0); s=0: X unchanged, bit for bit
    assert v[0, 0].item() == 0.25
    assert v[0, 1].item() == 0.5
    assert v[0, 2].item() == 3e-17


@pytest.mark.parametrize("detach", [False, True])
def test_soft_reset_gradient_by_hand(detach):
    """Soft reset `v -= th` is v - s*th: d v/d h = 1 - th*S'(u) (or 1 when detached)."""
    th = 1.0
    m = mk(
        """\
        neuron Soft:
            input x
            param v_threshold = 1.0
            state v = 0.0
            update:
                v = 0.5 * v + x
            spike when v >= v_threshold surrogate atan(alpha=2.0)
            on spike:
                v -= v_threshold
            output spike
        """,
        detach_reset=detach,
    )
    x1 = np.array([1.3, 0.4, 2.2])
    x2 = np.array([0.6, 0.9, 0.1])

    def sg(u):
        return (2.0 / 2) / (1 + (math.pi / 2 * 2.0 * u) ** 2)

    h1 = x1
    u1 = h1 - th
    s1 = (u1 >= 0).astype(float)
    v1 = h1 - s1 * th
    h2 = 0.5 * v1 + x2
    u2 = h2 - th
    dv1_dh1 = 1 - (0.0 if detach else th * sg(u1))
    g2 = sg(u2)  # dL/dh2 for L = sum(s1 + s2)
    g1 = sg(u1) + g2 * 0.5 * dv1_dh1
    x = t64(np.stack([x1, x2])).requires_grad_(True)
    m(x).sum().backward()
    close(x.grad, np.stack([g1, g2]))


def test_exponential_euler_conditionally_linear():
    """Brian2's exponential Euler: each x' = A + B*x with A, B taken at the old values."""
    dt, tau = 0.2, 3.0
    m = mk(f"""\
        neuron Gate:
            input I
            param dt = {dt}
            param tau = {tau} where tau > 0
            state v = 0.5
            state g = 0.1
            equations method exponential_euler:
                dv/dt = (I - v) / tau - g * v
                dg/dt = sigmoid(v) * (1 - g) - 0.5 * g
            output v, g
        """)
    I = RNG.uniform(0, 2, size=(12, 3))
    v = np.full(3, 0.5)
    g = np.full(3, 0.1)
    V, G = [], []
    for It in I:
        # v: A = I/tau, B = -(1/tau + g);  g: A = sig(v), B = -(sig(v) + 0.5)
        Av, Bv = It / tau, -(1 / tau + g)
        Ag, Bg = sig(v), -(sig(v) + 0.5)
        v, g = -Av / Bv + (v + Av / Bv) * np.exp(Bv * dt), -Ag / Bg + (g + Ag / Bg) * np.exp(Bg * dt)
        V.append(v.copy())
        G.append(g.copy())
    vv, gg = m(t64(I))
    close(vv, V, rtol=1e-10)
    close(gg, G, rtol=1e-10)


def test_state_seqs_and_dtypes():
    m = mk(LIF, store_state_seqs=True)
    x = RNG.uniform(0, 2.5, size=(11, 2, 3))
    S, V = lif_ref(x)
    close(m(t64(x)), S)
    assert tuple(m.state_seqs["v"].shape) == (11, 2, 3)
    close(m.state_seqs["v"], V)
    for dt_ in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        mm = mk(LIF)
        y = mm(torch.as_tensor(x, dtype=dt_))
        assert y.dtype == dt_


def test_chain_constraint_checked_on_load_and_assignment():
    text = """\
        neuron Chain:
            input x
            param p = 0.5 where 0 < p < 1
            state v = 0.0
            update:
                v = p * v + x
            output v
        """
    with pytest.raises(flexdsl.FlexDSLError):
        mk(text, p=1.0)
    with pytest.raises(flexdsl.FlexDSLError):
        mk(text, p=0.0)
    m = mk(text, p=0.25)
    with pytest.raises(flexdsl.FlexDSLError):
        m.p = 1.5
    m.p = 0.75
    close(m(t64([[1.0], [1.0]])), [[1.0], [1.75]])


def test_library_models():
    names = set(flexdsl.library())
    assert {"lif", "if"} <= names
    x = RNG.uniform(0, 2.5, size=(20, 3))
    S, _ = lif_ref(x)
    close(flexdsl.load("lif")(t64(x)), S)
    # IF (SpikingJelly IFNode): h = v + x, hard reset to 0, threshold 1, `>=`
    v = np.zeros(3)
    S_if = []
    for xt in x:
        h = v + xt
        s = (h >= 1.0).astype(float)
        v = (1 - s) * h
        S_if.append(s)
    close(flexdsl.load("if")(t64(x)), S_if)
