"""e-prop (`flexdsl.recurrent(..., learning="eprop")`, issue 34): the weight updates equal

- Bellec et al.'s closed-form eligibility traces for LIF and ALIF, written here by hand (the
  forward simulated here too, float64, within 1e-10), and
- for every library model, the definition computed independently: autograd over a hand loop of
  the model's generated step in which the recurrent input `s[t-1] @ W_rec.T` is detached (each
  learning signal's dependence on other neurons' past cut), float64 within 1e-8;

streaming (calls cut anywhere, each with its own backward) adds up to one call; learnable params,
one-to-one and masked W_rec, random feedback, the derived equations (`flexdsl show --eprop`) and
the bad-input errors."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import flexdsl
from flexdsl import FlexDSLError, backends

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = sorted(p.stem for p in (ROOT / "neurons").glob("*.neuron"))
# the input scale at which a model's neurons are driven (its input unit: amperes for adex)
SCALE = {"adex": 3e-9, "alif": 60.0, "cuba_lif": 3.0, "hodgkin_huxley": 60.0, "morris_lecar": 200.0,
         "izhikevich": 20.0, "izhikevich_2003": 80.0, "lif_ode": 30.0, "resonate_fire": 100.0, "norse_lif": 300.0,
         "norse_lif_box": 300.0, "norse_lif_recurrent": 300.0, "lif_refractory": 300.0}
T, B, N_IN, H = 10, 2, 4, 3
RTOL = 1e-8  # float64: the issue's bound (the two computations agree to ~1e-15 here)


def layer(model: str, seed: int = 0, **kw) -> flexdsl.RecurrentModule:
    torch.manual_seed(seed)
    m = flexdsl.recurrent(model, N_IN, H, learning="eprop", **kw).double()
    sc = SCALE.get(model, 3.0)
    with torch.no_grad():
        m.W_in.copy_(torch.rand(H, N_IN) * sc / N_IN * 2)
        if m.connectivity == "all":
            m.W_rec.copy_(torch.randn(H, H) * sc * 0.3)
        else:
            m.W_rec.copy_(torch.randn(H) * sc * 0.3)
        if m.bias is not None:
            m.bias.copy_(torch.rand(H) * sc * 0.2)
    return m


def loss_of(outs, R):
    """A loss whose learning signal mixes the neurons (through a squared sum), as a readout's does."""
    return sum((o * r).sum() + 0.1 * (o.sum(-1) ** 2).sum() for o, r in zip(outs, R))


def as_tuple(o):
    return o if isinstance(o, tuple) else (o,)


def hand_loop(m, x: torch.Tensor, W_in, W_rec, bias, mask=None) -> list[torch.Tensor]:
    """The layer by hand with the model's generated step (`m.neuron.core`): the recurrent input
    detached (e-prop's definition), everything else differentiable."""
    neuron = m.neuron
    ck = neuron.compiled.checked
    init = neuron.initial_state(torch.zeros(x.shape[1], H, dtype=x.dtype))
    st = [init[s.name].expand(x.shape[1], H).to(x.dtype) for s in ck.states]
    names = [n for n, _ in ck.outputs]
    src = names.index(m.source)
    s = torch.zeros(x.shape[1], H, dtype=x.dtype)
    seq: list[list[torch.Tensor]] = [[] for _ in names]
    w = W_rec if mask is None else W_rec * mask
    for t in range(x.shape[0]):
        rec = s.detach() @ w.t() if w.dim() == 2 else s.detach() * w
        I = (x[t] @ W_in.t() if W_in is not None else x[t]) + (bias if bias is not None else 0) + rec
        res = neuron.core(I, *st)
        o, st = res[:len(names)], list(res[len(names):])
        for k, v in enumerate(o):
            seq[k].append(v)
        s = o[src]
    return [torch.stack(q) for q in seq]


def reference_grads(m, x, R, mask=None):
    ws = {n: (getattr(m, n).detach().clone().requires_grad_() if getattr(m, n) is not None else None)
          for n in ("W_in", "W_rec", "bias")}
    params = dict(m.neuron.named_parameters())
    for p in params.values():
        p.grad = None
    loss_of(hand_loop(m, x, ws["W_in"], ws["W_rec"], ws["bias"], mask), R).backward()
    out = {n: w.grad for n, w in ws.items() if w is not None}
    out.update({f"neuron.{k}": p.grad for k, p in params.items() if p.requires_grad})
    return out


def eprop_grads(m, x, R):
    m.reset()
    m.zero_grad()
    outs = as_tuple(m(x))
    loss_of(outs, R).backward()
    got = {n: getattr(m, n).grad for n in ("W_in", "W_rec", "bias") if getattr(m, n) is not None}
    got.update({f"neuron.{k}": p.grad.clone() for k, p in m.neuron.named_parameters() if p.requires_grad})
    return outs, got


def one_call_then_fresh(m, x, R):
    """The gradients of one call (copies), the layer then reset with no gradients: for calls in pieces."""
    _, whole = eprop_grads(m, x, R)
    whole = {k: v.clone() for k, v in whole.items()}
    m.reset()
    m.zero_grad()
    return whole


def assert_grads(got, want, rtol=RTOL):
    assert got.keys() == want.keys()
    for k in want:
        scale = float(want[k].abs().max())
        err = float((got[k] - want[k]).abs().max())
        assert err <= rtol * max(scale, 1e-300), f"{k}: {err:.3e} off, of {scale:.3e}"


@pytest.mark.parametrize("model", LIBRARY)
def test_every_library_model_equals_the_definition(model):
    m = layer(model)
    x = torch.rand(T, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    R = [torch.randn(T, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2 + k))
         for k in range(len(m.neuron.compiled.checked.outputs))]
    outs, got = eprop_grads(m, x, R)
    want = reference_grads(m, x, R)
    assert max(float(g.abs().max()) for g in want.values()) > 0  # (a gradient to compare)
    assert_grads(got, want)


def test_most_library_models_spike_in_the_definition_test():
    """The definition test compares something: at least 20 library models fire there."""
    firing = 0
    for model in LIBRARY:
        m = layer(model)
        x = torch.rand(T, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            firing += float(as_tuple(m(x))[0].sum()) > 0
    assert firing >= 20


# ----------------------------------------------------------------------------- Bellec's closed forms
def _signal(z: torch.Tensor, Wout: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E = sum_t |Wout z_t - y*_t|^2 and its learning signal L_t = dE/dz_t = 2 (Wout z_t - y*_t) Wout."""
    err = z @ Wout.t() - target
    return (err ** 2).sum(), 2 * err @ Wout


def trained_once(model: str, seed: int, **kw):
    """A layer, an input, a readout and targets, and one e-prop call and backward of E (`_signal`)."""
    m = layer(model, **kw)
    x = torch.rand(T, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    Wout = torch.randn(2, H, dtype=torch.float64)
    target = torch.randn(T, B, 2, dtype=torch.float64)
    m.reset()
    z = m(x)
    _signal(z, Wout, target)[0].backward()
    return m, x, Wout, target, z


def pseudo(u, gamma=0.3, width=1.0):
    return gamma * torch.clamp(1 - (u / width).abs(), min=0)


def test_lif_equals_bellec_closed_form():
    """Bellec's LIF (soft reset, the reset's derivative ignored): e_t = psi_t * xbar_t with xbar the
    presynaptic activity filtered by alpha = 1 - 1/tau, times dv/dI = 1/tau (lif_soft's charge)."""
    tau, vth = 2.0, 1.0
    m, x, Wout, target, z_ours = trained_once("lif_soft", 3, detach_reset=True)
    W_in, W_rec, b = m.W_in.detach(), m.W_rec.detach(), m.bias.detach()
    # the forward, by hand
    v, s = torch.zeros(B, H, dtype=torch.float64), torch.zeros(B, H, dtype=torch.float64)
    zs, psis = [], []
    for t in range(T):
        v = v + (x[t] @ W_in.t() + b + s @ W_rec.t() - v) / tau
        z = (v >= vth).double()
        u = v - vth
        psis.append(4.0 * torch.sigmoid(4.0 * u) * (1 - torch.sigmoid(4.0 * u)))  # the sigmoid surrogate, alpha 4
        zs.append(z)
        v = v - z * vth
        s = z
    Z = torch.stack(zs)
    assert torch.equal(Z, z_ours.detach())
    _, L = _signal(Z, Wout, target)
    alpha = 1 - 1 / tau
    xbar_in, xbar_rec, xbar_b = (torch.zeros(B, N_IN, dtype=torch.float64), torch.zeros(B, H, dtype=torch.float64),
                                 torch.zeros(B, 1, dtype=torch.float64))
    dW_in, dW_rec, db = torch.zeros_like(W_in), torch.zeros_like(W_rec), torch.zeros_like(b)
    prev = torch.zeros(B, H, dtype=torch.float64)
    for t in range(T):
        xbar_in = alpha * xbar_in + x[t] / tau
        xbar_rec = alpha * xbar_rec + prev / tau
        xbar_b = alpha * xbar_b + 1 / tau
        Lpsi = L[t] * psis[t]
        dW_in += Lpsi.t() @ xbar_in
        dW_rec += Lpsi.t() @ xbar_rec
        db += (Lpsi * xbar_b).sum(0)
        prev = Z[t]
    for got, want in [(m.W_in.grad, dW_in), (m.W_rec.grad, dW_rec), (m.bias.grad, db)]:
        assert float((got - want).abs().max()) <= 1e-10 * float(want.abs().max())


def test_alif_equals_bellec_closed_form():
    """Bellec's ALIF (eqs. of the e-prop paper's Methods: the membrane's reset derivative ignored,
    the adaptation's kept: `detach_reset="v"`), in this model's timing (`a` decays, then the spike adds
    1): eps_v' = alpha eps_v + (1 - alpha) pre, eps_a' = rho psi eps_v + rho (1 - psi beta) eps_a,
    e = psi (eps_v - beta eps_a)."""
    dt, tau_m, tau_a, vth, beta = 1.0, 20.0, 200.0, 1.0, 1.8
    alpha, rho = math.exp(-dt / tau_m), math.exp(-dt / tau_a)
    m, x, Wout, target, z_ours = trained_once("alif", 4, detach_reset="v")
    W_in, W_rec, b = m.W_in.detach(), m.W_rec.detach(), m.bias.detach()
    v, a, s = (torch.zeros(B, H, dtype=torch.float64) for _ in range(3))
    zs, psis = [], []
    for t in range(T):
        v = alpha * v + (1 - alpha) * (x[t] @ W_in.t() + b + s @ W_rec.t())
        a = rho * a
        u = v - vth - beta * a
        z = (u >= 0).double()
        psis.append(pseudo(u))
        zs.append(z)
        v, a, s = v - z * vth, a + z, z
    Z = torch.stack(zs)
    assert torch.equal(Z, z_ours.detach()) and Z.sum() > 0
    _, L = _signal(Z, Wout, target)

    def grads(pres):  # pres[t]: [B, P] presynaptic values at step t
        P = pres[0].shape[-1]
        ev, ea = torch.zeros(B, H, P, dtype=torch.float64), torch.zeros(B, H, P, dtype=torch.float64)
        dW = torch.zeros(H, P, dtype=torch.float64)
        for t in range(T):
            ev_t = alpha * ev + (1 - alpha) * pres[t][:, None, :]
            ea_t = rho * psis[t - 1][:, :, None] * ev + rho * (1 - psis[t - 1][:, :, None] * beta) * ea if t else ea
            psi = psis[t][:, :, None]
            dW += (L[t][:, :, None] * psi * (ev_t - beta * ea_t)).sum(0)
            ev, ea = ev_t, ea_t
        return dW

    prev = torch.cat([torch.zeros(1, B, H, dtype=torch.float64), Z[:-1]])
    dW_in = grads(list(x))
    dW_rec = grads(list(prev))
    db = grads([torch.ones(B, 1, dtype=torch.float64)] * T)[:, 0]
    for got, want in [(m.W_in.grad, dW_in), (m.W_rec.grad, dW_rec), (m.bias.grad, db)]:
        assert float((got - want).abs().max()) <= 1e-10 * float(want.abs().max())


# ----------------------------------------------------------------------------- streaming, forms, params
def test_calls_cut_anywhere_add_up_to_one_call():
    """Online: a sequence cut into calls, each with its own loss and backward, gives the gradient of
    one call (the eligibility and the states carry over; a loss per step)."""
    m = layer("alif", detach_reset="v")
    x = torch.rand(12, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    R = [torch.randn(12, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(6))]
    whole = one_call_then_fresh(m, x, R)
    for a, b in [(0, 1), (1, 5), (5, 6), (6, 12)]:
        loss_of(as_tuple(m(x[a:b])), [R[0][a:b]]).backward()
    assert_grads({n: getattr(m, n).grad for n in ("W_in", "W_rec", "bias")}, whole, 1e-12)


def test_a_call_of_no_steps_changes_nothing():
    """A call of zero steps (as BPTT's layer) gives an empty output and leaves the states and the kept
    eligibility as they were: a stream with an empty chunk inside learns the same."""
    m = layer("alif", detach_reset="v")
    x = torch.rand(8, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    R = torch.randn(8, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(7))

    def stream(cuts):
        m.reset()
        m.zero_grad()
        outs = []
        for a, b in cuts:
            o = m(x[a:b])
            assert o.shape == (b - a, B, H)
            if b > a:
                (o * R[a:b]).sum().backward()
            outs.append(o.detach())
        return torch.cat(outs), {n: getattr(m, n).grad.clone() for n in ("W_in", "W_rec", "bias")}

    (o1, g1), (o2, g2) = stream([(0, 3), (3, 8)]), stream([(0, 3), (3, 3), (3, 8)])
    assert torch.equal(o1, o2)
    assert all(torch.equal(g1[k], g2[k]) for k in g1)


def test_single_step_mode_streams_too():
    m = layer("lif")
    x = torch.rand(6, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    R = [torch.randn(6, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(8))]
    whole = one_call_then_fresh(m, x, R)
    m.step_mode = "s"
    for t in range(6):  # (the loss couples the outputs within a step only: one backward per step)
        loss_of([m(x[t])[None]], [R[0][t:t + 1]]).backward()
    assert_grads({n: getattr(m, n).grad for n in ("W_in", "W_rec", "bias")}, whole, 1e-12)


def test_reset_clears_the_eligibility():
    m = layer("lif")
    x = torch.rand(5, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    R = [torch.randn(5, B, H, dtype=torch.float64)]
    _, first = eprop_grads(m, x, R)
    first = {k: v.clone() for k, v in first.items()}
    m(x).sum()  # (a call that leaves eligibility behind)
    _, again = eprop_grads(m, x, R)  # (eprop_grads resets first)
    assert_grads(again, first, 0.0)
    m.reset()
    m(x)
    assert "eligibility" in m._kept
    m.reset()
    assert "eligibility" not in m._kept


@pytest.mark.parametrize("form", ["one_to_one", "mask", "no_w_in", "no_bias"])
def test_layer_forms_equal_the_definition(form):
    kw = {"connectivity": "one_to_one"} if form == "one_to_one" else {}
    mask = (torch.rand(H, H, generator=torch.Generator().manual_seed(3)) > 0.4).double() if form == "mask" else None
    if mask is not None:
        kw["mask"] = mask
    if form == "no_bias":
        kw["bias"] = False
    if form == "no_w_in":
        torch.manual_seed(0)
        m = flexdsl.recurrent("lif", None, H, learning="eprop").double()
        x = torch.rand(T, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    else:
        m = layer("lif", **kw)
        x = torch.rand(T, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    R = [torch.randn(T, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))]
    _, got = eprop_grads(m, x, R)
    want = reference_grads(m, x, R, mask)
    assert_grads(got, want)


@pytest.mark.parametrize("model, learnable", [("plif", None), ("alif", ["tau_m", "beta"]), ("lif", ["tau"]),
                                              ("lif", ["v_reset"]), ("izhikevich", True)])
def test_learnable_params_get_their_eprop_gradient(model, learnable):
    """(`v_reset` and izhikevich's `w_rest` also set a state's initial value: their eligibility starts
    at dh0/dθ, not 0)"""
    kw = {"learnable": learnable} if learnable else {}
    if learnable == ["tau"]:
        kw["param_shapes"] = {"tau": (H,)}
    if learnable == ["v_reset"]:
        kw["v_reset"] = -0.3
    m = layer(model, **kw)
    assert any(p.requires_grad for p in m.neuron.parameters())
    x = torch.rand(T, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    R = [torch.randn(T, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))]
    _, got = eprop_grads(m, x, R)
    want = reference_grads(m, x, R)
    assert any(k.startswith("neuron.") for k in want)
    assert_grads(got, want)


def test_eval_mode_runs_the_plain_layer_and_keeps_no_eligibility():
    m = layer("lif")
    x = torch.rand(T, B, N_IN, dtype=torch.float64)
    z_train = m(x)
    m.reset()
    m.eval()
    z_eval = m(x)
    assert torch.equal(z_train.detach(), z_eval)
    assert "eligibility" not in m._kept


def test_random_feedback_sends_the_error_through_the_fixed_matrix():
    m = layer("lif", readout=2, feedback="random")
    assert isinstance(m.readout.linear, nn.Linear) and m.readout.feedback.shape == (2, H)
    Bm = m.readout.feedback
    x = torch.rand(T, B, N_IN, dtype=torch.float64)
    m.readout.double()
    z = m(x).detach().requires_grad_()
    y = m.readout(z)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    assert torch.allclose(z.grad, g @ Bm.double(), rtol=0, atol=1e-14)
    assert torch.allclose(m.readout.linear.weight.grad, g.reshape(-1, 2).t() @ z.detach().reshape(-1, H), atol=1e-12)
    # symmetric feedback: the readout's own weights
    s = layer("lif", readout=nn.Linear(H, 2).double())
    assert s.readout.feedback is None
    fixed = torch.randn(2, H, dtype=torch.float64)
    f = layer("lif", readout=2, feedback=fixed)
    assert torch.equal(f.readout.feedback, fixed)


@pytest.mark.parametrize("kw, words", [
    ({"learning": "e-prop"}, "learning must be"),
    ({"learning": "eprop", "feedback": "random"}, "needs the readout"),
    ({"learning": "eprop", "feedback": torch.zeros(2, H)}, "needs the readout"),
    ({"learning": "eprop", "readout": 2, "feedback": torch.zeros(3, H)}, "feedback matrix is (3, 3)"),
    ({"learning": "eprop", "readout": nn.Linear(5, 2)}, "readout's weight is (2, 5)"),
    ({"learning": "eprop", "readout": "ten"}, "readout must be"),
    ({"learning": "eprop", "feedback": "randm", "readout": 2}, "feedback must be"),
    ({"learning": "bptt", "readout": 2}, "belong to learning='eprop'"),
    ({"learning": "eprop", "readout": nn.Embedding(2, H)}, "an e-prop readout is an nn.Linear"),
    ({"learning": "eprop", "readout": 2, "feedback": torch.full((2, H), float("nan"))}, "not finite"),
    ({"learning": "eprop", "readout": 2, "feedback": torch.zeros(2, H, device="meta")}, "not finite"),
])
def test_bad_construction_is_a_located_error(kw, words):
    with pytest.raises(FlexDSLError) as e:
        flexdsl.recurrent("lif", N_IN, H, **kw)
    assert words in str(e.value) and "lif.neuron:" in str(e.value) and "^" in str(e.value)


NOISY = """
neuron Noisy:
    input x
    param tau = 10.0
    param sigma = 0.1
    param dt = 1.0
    state v = 0.0
    equations:
        dv/dt = (x - v) / tau + sigma * xi
    spike when v >= 1.0
    on spike:
        v = 0.0
    output spike
"""

UNREACHED = """
neuron Gate:
    input x
    input g
    state v = 0.0
    update:
        v = 0.5 * v + g
    spike when v >= 1.0
    on spike:
        v = 0.0
    output spike
"""


OUTPUT_UNREACHED = """
neuron Counter:
    input x
    state v = 0.0
    state c = 0.0
    update:
        v = v + (x - v) / 5.0
        c = c + 1
    spike when c >= 3
    on spike:
        c = 0.0
    output spike
"""


@pytest.mark.parametrize("text, kw, words, where", [
    (NOISY, {}, "noisy model", ":9:"),
    (UNREACHED, {"port": "x"}, "reaches neither a state nor an output", ":3:"),
    # (`x` moves `v`, but the spike reads only `c`: every e-prop gradient of the weights would be 0)
    (OUTPUT_UNREACHED, {}, "moves `v`, but no output", ":3:"),
])
def test_models_eprop_cannot_serve_are_located_errors(tmp_path, text, kw, words, where):
    p = tmp_path / "model.neuron"
    p.write_text(text)
    with pytest.raises(FlexDSLError) as e:
        flexdsl.recurrent(str(p), N_IN, H, learning="eprop", **kw)
    assert words in str(e.value) and where in str(e.value)


def test_a_second_derivative_through_eprop_is_a_located_error():
    m = layer("alif", detach_reset="v")
    x = torch.rand(T, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    R = [torch.randn(T, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))]
    loss = loss_of(as_tuple(m(x)), R)
    with pytest.raises(FlexDSLError, match="first derivatives only"):  # (was: wrong numbers, or a bare error)
        torch.autograd.grad(loss, m.W_in, create_graph=True)
    m.reset()
    loss_of(as_tuple(m(x)), R).backward()  # (a first derivative, as always)
    assert m.W_in.grad is not None


def test_feedforward_refuses_eprops_options():
    for kw in ({"readout": 2}, {"learning": "eprop", "readout": 2}, {"feedback": "random"}):
        with pytest.raises(FlexDSLError, match="e-prop learns recurrent layers"):
            flexdsl.feedforward("lif", N_IN, H, **kw)


def test_an_input_that_needs_a_gradient_is_a_located_error():
    m = layer("lif")
    x = torch.rand(T, B, N_IN, dtype=torch.float64, requires_grad=True)
    with pytest.raises(FlexDSLError, match="gives its inputs no gradient, but input `x`"):
        m(x)
    m(x.detach())  # (fine)


def test_a_batch_of_another_size_needs_a_reset():
    m = layer("lif")
    m(torch.rand(T, B, N_IN, dtype=torch.float64))
    with pytest.raises(FlexDSLError, match="reset"):
        m(torch.rand(T, B + 1, N_IN, dtype=torch.float64))


def test_show_eprop_prints_the_derived_eligibility():
    r = subprocess.run([sys.executable, "-m", "flexdsl", "show", "alif", "--eprop", "--detach-reset", "v"],
                       capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "eps = (eps_v, eps_a)" in out and "J[a,v] = _d_spike__v" in out and "J[v,v] = alpha_1" in out
    assert "J[v,a]" not in out  # (v's reset detached: no path from a to v)
    assert "kept per synapse" in out
    from flexdsl.ir.eprop import describe
    from flexdsl.runtime.compiler import compile_model

    c = compile_model("lif_soft", detach_reset=True)
    assert "one trace per presynaptic neuron" in describe(c.step, c.name, c.filename)
    r = subprocess.run([sys.executable, "-m", "flexdsl", "show", "alif", "--eprop", "--detach-reset", "w"],
                       capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "detach_reset names `w`" in r.stderr


TRITON = backends.get("triton").available()


@pytest.mark.skipif(not TRITON, reason="needs the Triton backend (a GPU or TRITON_INTERPRET=1)")
@pytest.mark.parametrize("model, kw", [("lif", {}), ("alif", {"detach_reset": "v"}), ("lif_soft", {"detach_reset": True}),
                                       ("hodgkin_huxley", {}), ("lif", {"bias": False})])
def test_the_kernel_of_the_traces_equals_torch(monkeypatch, model, kw):
    """The Triton kernel that keeps each synapse's traces in registers over the steps (the CUDA path;
    here in the interpreter) gives the torch operations' gradients and kept eligibility: float32,
    within the sums' rounding (T steps of d-term products, each gradient a sum over T * batch)."""
    from flexdsl.backends import eprop as programs
    from flexdsl.backends.triton.eprop import walk

    def run(kernel: bool):
        monkeypatch.setattr(programs, "walker", (lambda x: walk) if kernel else (lambda x: None))
        m = layer(model, **kw).float()
        x = torch.rand(T, B, N_IN, generator=torch.Generator().manual_seed(1))
        R = [torch.randn(T, B, H, generator=torch.Generator().manual_seed(2 + k))
             for k in range(len(m.neuron.compiled.checked.outputs))]
        grads = {}
        m.reset()
        for a, b in [(0, 4), (4, T)]:  # (two calls: the kept eligibility crosses them)
            loss_of(as_tuple(m(x[a:b])), [r[a:b] for r in R]).backward()
        for n in ("W_in", "W_rec", "bias"):
            if getattr(m, n) is not None:
                grads[n] = getattr(m, n).grad.double()
        return grads, m._kept["eligibility"].resolve().dense.double()

    (g_k, e_k), (g_t, e_t) = run(True), run(False)
    if e_t.dim() == 3:  # (torch kept a presynaptic trace: the kernel keeps it per synapse)
        e_t = e_t[:, None].expand_as(e_k)
    assert_grads(g_k, g_t, 1e-4)
    assert float((e_k - e_t).abs().max()) <= 1e-4 * max(float(e_t.abs().max()), 1.0)


@pytest.mark.skipif(not TRITON, reason="needs the Triton backend (a GPU or TRITON_INTERPRET=1)")
@pytest.mark.parametrize("D, zero", [(1, False), (2, False), (4, False), (2, True)])
def test_the_kernels_regrouped_sums_equal_the_recursion_step_by_step(D, zero):
    """The kernel sums a call's steps as per-neuron products over the steps and two matrix
    products (`backends/triton/eprop.py`); against the recursion run step by step in float64 on
    random factors (any J, not a model's): the same last eligibility and gradient within float32's
    rounding of T-step sums (J's entries up to 0.9 in size: no term grows)."""
    from flexdsl.backends.triton.eprop import walk

    g = torch.Generator().manual_seed(D + 10 * zero)
    Tn, F, Hn, NX, NS = 7, 3, 5, 6, 5
    P = NX + NS + 1
    r = lambda *sh: torch.rand(*sh, generator=g, dtype=torch.float64) * 2 - 1  # noqa: E731
    J = r(Tn, F, Hn, D, D) * 0.9 / D
    b, A, Lg = r(Tn, F, Hn, D), r(Tn, F, Hn, D), r(Tn, F, Hn)
    x, s = (r(Tn, F, NX) > 0).double(), (r(Tn, F, NS) > 0.3).double()
    e0 = torch.zeros(F, Hn, P, D, dtype=torch.float64) if zero else r(F, Hn, P, D)
    e, grad = e0.clone(), torch.zeros(Hn, P, dtype=torch.float64)
    for t in range(Tn):  # (the recursion of runtime/eprop.py, written out)
        pre = torch.cat([x[t], s[t], torch.ones(F, 1, dtype=torch.float64)], -1)  # [F, P]
        grad += torch.einsum("fik,fipk->ip", A[t], e) + Lg[t].t() @ pre
        e = torch.einsum("fikl,fipl->fipk", J[t], e) + b[t][:, :, None, :] * pre[:, None, :, None]
    f = torch.float32
    out, got = walk(e0.to(f), J.to(f), b.to(f), x.to(f), s.to(f), True, A.to(f), Lg.to(f), zero)
    eps32 = torch.finfo(f).eps
    tol = 8 * Tn * D * eps32 * (1 + P)  # (T steps of D-term products; a gradient sums T * F of them)
    assert float((out.double() - e).abs().max()) <= tol * max(float(e.abs().max()), 1.0)
    assert float((got.double() - grad).abs().max()) <= tol * F * max(float(grad.abs().max()), 1.0)
    out2, none = walk(e0.to(f), J.to(f), b.to(f), x.to(f), s.to(f), True, zero=zero)  # (no learning signal)
    assert none is None and torch.equal(out2, out)


@pytest.mark.parametrize("model, kw", [("lif", {}), ("alif", {"detach_reset": "v"}), ("snn_rsynaptic", {})])
def test_steps_by_the_layers_scan_equal_steps_one_by_one(monkeypatch, model, kw):
    """On CUDA a call's steps run on the layer's compiled scan, the states before each step on the
    neuron's kernels, and the factors of all steps in one call; here (the CPU's scan, float32) that
    path against the steps one by one: the same outputs and gradients."""
    from flexdsl.runtime import eprop as E

    def run(scanned: bool):
        monkeypatch.setattr(E, "SCAN_DEVICES", {"cpu"} if scanned else set())
        m = layer(model, **kw).float()
        x = torch.rand(T, B, N_IN, generator=torch.Generator().manual_seed(1))
        R = [torch.randn(T, B, H, generator=torch.Generator().manual_seed(2 + k))
             for k in range(len(m.neuron.compiled.checked.outputs))]
        m.reset()
        outs = []
        for a, b in [(0, 4), (4, T)]:
            o = as_tuple(m(x[a:b]))
            loss_of(o, [r[a:b] for r in R]).backward()
            outs.append(o[0].detach())
        return torch.cat(outs), {n: getattr(m, n).grad.double() for n in ("W_in", "W_rec", "bias")}

    calls = []
    orig = E._from_scan
    def counted(*a):
        got = orig(*a)
        calls.append(got is not None)  # (None: it fell back to the steps one by one)
        return got

    monkeypatch.setattr(E, "_from_scan", counted)
    (o1, g1), (o2, g2) = run(True), run(False)
    assert calls == [True, True] and torch.equal(o1, o2) and o1.sum() > 0
    assert_grads(g1, g2, 1e-5)


def _flipping(orig):
    """`EPropLearning._scanned` with the scan's first spike flipped (and the next step's presynaptic
    value with it: the traces would read it), as a current at the threshold within rounding would."""

    def flipped(self, *a):
        run = orig(self, *a)

        def run2():
            outs, S, cur, hs, fins = run()
            outs = [o.clone() for o in outs]
            outs[0][0, 0, 0] = 1 - outs[0][0, 0, 0]
            S = S.clone()
            S[1, 0, 0] = outs[0][0, 0, 0]
            return outs, S, cur, hs, fins
        return run2
    return flipped


def test_a_spike_the_scan_and_the_eprop_step_disagree_on_falls_back_to_the_steps(monkeypatch):
    """Where the scan's spikes and the e-prop step's (on the states the neuron's kernels give) differ
    (a current at the threshold within rounding; forced here by flipping one of the scan's spikes),
    the traces follow the steps one by one: the gradients are those of that path."""
    from flexdsl.runtime import eprop as E
    from flexdsl.runtime.eprop_layer import EPropLearning

    orig = EPropLearning._scanned
    flipped = _flipping(orig)

    def grads(scanned: bool):
        monkeypatch.setattr(E, "SCAN_DEVICES", {"cpu"} if scanned else set())
        monkeypatch.setattr(EPropLearning, "_scanned", flipped if scanned else orig)
        m = layer("lif").float()
        x = torch.rand(T, B, N_IN, generator=torch.Generator().manual_seed(1))
        R = torch.randn(T, B, H, generator=torch.Generator().manual_seed(2))
        m.reset()
        (m(x) * R).sum().backward()  # (a linear loss: the learning signal R whatever the spikes)
        return {n: getattr(m, n).grad.double() for n in ("W_in", "W_rec", "bias")}

    assert_grads(grads(True), grads(False), 1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA path (the scan, the pinned flag, the kernel)")
@pytest.mark.parametrize("flip", [False, True])
def test_on_cuda_the_scans_path_and_its_fallback_equal_the_steps(monkeypatch, flip):
    """On CUDA a call runs on the layer's scan and the traces on the backend's kernel; whether the scan
    and the e-prop step agreed is read from a pinned copy of a device flag (`eprop.Flag`). With one of
    the scan's spikes flipped (`flip`: the flag says they disagreed) the traces follow the steps one by
    one: the gradients equal those of the steps one by one (float32, within the sums' rounding)."""
    from flexdsl.runtime import eprop as E
    from flexdsl.runtime.eprop_layer import EPropLearning

    orig = EPropLearning._scanned
    flipped = _flipping(orig)
    flags = []

    orig_flag = E.Flag

    def recorded(t):
        f = orig_flag(t)
        flags.append(f)
        return f

    def grads(scanned: bool):
        monkeypatch.setattr(E, "SCAN_DEVICES", {"cuda"} if scanned else set())
        monkeypatch.setattr(EPropLearning, "_scanned", flipped if (scanned and flip) else orig)
        monkeypatch.setattr(E, "Flag", recorded)
        m = layer("lif").float().cuda()
        x = torch.rand(T, B, N_IN, generator=torch.Generator().manual_seed(1)).cuda()
        R = torch.randn(T, B, H, generator=torch.Generator().manual_seed(2)).cuda()
        m.reset()
        (m(x) * R).sum().backward()
        return {n: getattr(m, n).grad.double().cpu() for n in ("W_in", "W_rec", "bias")}

    got = grads(True)
    assert len(flags) == 1 and flags[0].event is not None and bool(flags[0]) == flip
    assert_grads(got, grads(False), 1e-5)


def test_a_models_page_shows_its_derived_eligibility(tmp_path):
    """`flexdsl doc`: the e-prop factors beside the derived backward, as equations (HTML and Markdown)."""
    from flexdsl.docs.content import describe
    from flexdsl.runtime.compiler import compile_model

    d = describe(compile_model("alif", detach_reset="v"), sources=False)
    names = [st.lhs.text for st in d.eprop]
    assert {"J[v,v]", "J[a,v]", "J[a,a]", "b[v]", "b[a]", "c[spike,v]", "c[spike,a]", "g[spike]"} <= set(names)
    assert "J[v,a]" not in names and "kept per synapse" in d.eprop_note
    r = subprocess.run([sys.executable, "-m", "flexdsl", "doc", "lif_soft", "-o", str(tmp_path), "--no-plots"],
                       capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "lif_soft.html").read_text()
    assert "e-prop&#x27;s eligibility" in page or "e-prop's eligibility" in page
    md = (tmp_path / "lif_soft.md").read_text()
    assert "J_{v,v} &=" in md and r"\frac{\partial v_{1}}{\partial x}" in md


def test_an_eprop_layer_pickles_mid_stream_and_goes_on_the_same():
    import copy
    import pickle

    m = layer("alif", detach_reset="v", readout=2, feedback="random")
    x = torch.rand(8, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    m.readout.double()
    m(x[:4])  # (its eligibility pending: no backward yet)
    clone = pickle.loads(pickle.dumps(m))
    twin = copy.deepcopy(m)
    assert set(m.state_dict()) == set(clone.state_dict()) and "readout.feedback" in clone.state_dict()
    assert torch.equal(clone.readout.feedback, m.readout.feedback)
    grads = []
    for net in (m, clone, twin):
        net.zero_grad()
        net.readout(net(x[4:])).sum().backward()
        grads.append(net.W_rec.grad.clone())
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2]) and grads[0].abs().sum() > 0


def test_an_eprop_layer_inside_torch_compile_runs_as_it_is():
    m = layer("lif")
    x = torch.rand(T, B, N_IN, dtype=torch.float64)
    R = torch.randn(T, B, H, dtype=torch.float64)
    m.reset()
    (m(x) * R).sum().backward()
    want = m.W_in.grad.clone()
    m.reset()
    m.zero_grad()
    f = torch.compile(lambda x: (m(x) * R).sum(), backend="eager")
    f(x).backward()
    assert torch.equal(m.W_in.grad, want)


def test_eprop_of_a_feedforward_layer_is_a_located_error_and_layer_files_take_it():
    with pytest.raises(FlexDSLError) as e:
        flexdsl.feedforward("lif", N_IN, H, learning="eprop")
    assert "e-prop learns recurrent layers" in str(e.value) and "lif.neuron:" in str(e.value)
    with pytest.raises(FlexDSLError, match="e-prop learns recurrent layers"):
        flexdsl.load("ff_lif.layer", hidden=H, in_features=N_IN, learning="eprop")
    r = flexdsl.load("rlif.layer", hidden=H, in_features=N_IN, learning="eprop", readout=2, feedback="random")
    assert r.learning == "eprop" and r.readout.feedback.shape == (2, H)


@pytest.mark.parametrize("model", ["lif", "alif", "izhikevich"])
@pytest.mark.parametrize("batch", [1, 2])
def test_one_lane_calls_equal_bptt_without_recurrent_weights(model, batch):
    """A layer of one neuron on a batch of one (a single stream): its per-step factors have one element
    each and were taken for constants (step 0's reused at every step: gradients 50-200 % off). With
    W_rec = 0 e-prop is BPTT exactly (no recurrent path to cut): float64, to rounding."""
    def grads(learning: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        m = flexdsl.recurrent(model, 3, 1, learning=learning).double()
        with torch.no_grad():
            m.W_in.copy_(torch.tensor([[1.5, 1.0, 2.0]]) * (10 if model == "izhikevich" else 1))
            m.W_rec.zero_()
            m.bias.fill_(0.2)
        x = torch.rand(6, batch, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        r = torch.randn(6, batch, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        out = m(x)
        (out[0] if isinstance(out, tuple) else out).mul(r).sum().backward()
        return [m.W_in.grad, m.bias.grad]
    for a, b in zip(grads("bptt"), grads("eprop")):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model, kw", [("lif", dict(learnable=["v_reset"], v_reset=-0.3)),
                                       ("izhikevich", dict(learnable=True)), ("cuba_lif", dict(learnable=True)),
                                       ("lif", dict(learnable=["v_reset"], v_reset=-0.3, connectivity="one_to_one"))])
def test_a_stream_in_calls_gives_a_learnable_initial_values_gradient_of_one_call(model, kw):
    """A param that sets a state's initial value (`v = v_reset`) reaches every later state through the
    steps' Jacobians: its dE/dh0 was taken from the first call's learning signal only (a stream cut into
    calls: 12x off for izhikevich's w_rest). The dependence is carried by the eligibility; equal to one
    call, which equals the definition (float64 autograd over the hand loop)."""
    m = layer(model, **kw)
    x = torch.rand(12, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    n_out = len(m.neuron.compiled.checked.outputs)
    R = [torch.randn(12, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(6 + k)) for k in range(n_out)]
    assert_grads(eprop_grads(m, x, R)[1], reference_grads(m, x, R), 1e-10)
    whole = one_call_then_fresh(m, x, R)
    for a, b in [(0, 1), (1, 5), (5, 6), (6, 12)]:
        loss_of(as_tuple(m(x[a:b])), [r[a:b] for r in R]).backward()
    got = {n: getattr(m, n).grad for n in ("W_in", "W_rec", "bias") if getattr(m, n) is not None}
    got.update({f"neuron.{k}": p.grad for k, p in m.neuron.named_parameters() if p.requires_grad})
    assert_grads(got, whole, 1e-10)


def test_an_input_buffer_reused_between_calls_does_not_change_pending_traces():
    """The first call has no loss (its traces run at the next call); its input written into a buffer the
    next chunk overwrites gave the traces the next chunk's values (W_in's gradient 10 % off)."""
    def stream(reuse: bool) -> torch.Tensor:
        m = layer("alif", detach_reset="v")
        x = torch.rand(16, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        R = torch.randn(8, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        buf = torch.empty(8, B, N_IN, dtype=torch.float64)
        for k in range(2):
            chunk = x[8 * k:8 * (k + 1)]
            out = as_tuple(m(buf.copy_(chunk) if reuse else chunk.clone()))[0]
            if k == 1:
                (out * R).sum().backward()
        return m.W_in.grad
    assert torch.equal(stream(True), stream(False))


def test_an_eval_call_drops_the_kept_eligibility():
    """Eval mode runs the plain layer, keeping no eligibility: the eligibility of the training call
    before it was kept, and the next training call continued from it (states moved by the eval call).
    Against a twin whose first call ran in eval mode too (the same states, no eligibility ever)."""
    x = torch.rand(18, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    R = torch.randn(6, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    grads = []
    for first_in_eval in (False, True):
        m = layer("lif")
        m.train(not first_in_eval)
        m(x[:6])
        m.eval()
        m(x[6:12])
        m.detach()  # (the eval call's states carry its graph, as a plain layer's: cut here in both)
        m.train()
        (as_tuple(m(x[12:]))[0] * R).sum().backward()
        grads.append(m.W_in.grad)
    assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-14)


def test_a_call_of_no_steps_backpropagates_zeros_as_bptt():
    m = layer("lif")
    m(torch.zeros(0, B, N_IN, dtype=torch.float64)).pow(2).sum().backward()
    assert m.W_in.grad is not None and not m.W_in.grad.any() and not m.W_rec.grad.any()


def test_a_layer_cast_mid_stream_casts_its_eligibility():
    m = layer("alif", detach_reset="v")
    x = torch.rand(10, B, N_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    as_tuple(m(x[:5]))[0].sum().backward()
    m.detach()
    m.float()
    as_tuple(m(x[5:].float()))[0].sum().backward()
    assert m.W_in.grad.dtype == torch.float32 and torch.isfinite(m.W_in.grad).all()


@pytest.mark.parametrize("kw, words", [(dict(readout="lazy"), "lazy"), (dict(readout=10 ** 30), "could not be made"),
                                       (dict(readout=2, feedback="sparse"), "sparse")])
def test_readouts_and_feedback_that_cannot_serve_are_located_errors_at_build(kw, words):
    kw = dict(kw)
    if kw["readout"] == "lazy":
        kw["readout"] = torch.nn.LazyLinear(2)
    if kw.get("feedback") == "sparse":
        kw["feedback"] = torch.randn(2, H).to_sparse()
    with pytest.raises(FlexDSLError, match=words) as e:
        flexdsl.recurrent("lif", N_IN, H, learning="eprop", **kw)
    assert e.value.line > 0


def test_call_time_errors_point_into_the_model_file():
    m = layer("alif", readout=2)
    x = torch.rand(4, B, N_IN, dtype=torch.float64)
    out = as_tuple(m(x))[0]
    with pytest.raises(FlexDSLError, match="first derivatives") as e:
        torch.autograd.grad(out.sum(), m.W_in, create_graph=True)
    assert e.value.filename.endswith("alif.neuron") and e.value.line > 0
    m.readout.to("meta")
    with pytest.raises(FlexDSLError, match="readout") as e:
        m.readout(out)
    assert e.value.filename.endswith("alif.neuron") and e.value.line > 0
