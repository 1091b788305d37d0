"""Recurrent layers (`flexdsl.recurrent`): equal to the peers' recurrent layers (snnTorch RLeaky,
Norse LIFRecurrent, SpikingJelly LinearRecurrentContainer) and to a hand-written LSNN loop, in
float64 (spikes exactly equal, gradients within 1e-5 relative); the Triton scan (interpreter)
equal to the torch scan; states, modes and the bad-input errors."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import flexdsl
from flexdsl import FlexDSLError, backends
from flexdsl.backends.cpu import CALLS

from tolerances import assert_close, condition, layer_ops, tol

TRITON = backends.get("triton").available()
needs_triton = pytest.mark.skipif(not TRITON, reason="needs the Triton backend (a GPU or TRITON_INTERPRET=1)")
needs_cpp = pytest.mark.skipif(not backends.get("cpu").available(), reason="needs a C++ compiler (the CPU kernels)")
# the scans: torch's loop, the CPU kernels' (C++ steps), the Triton kernels, and the NumPy backend of
# tests/numpy_backend (registered for every test here: a backend that is one folder and one registry line)
SCANS = ["torch", pytest.param("cpu", marks=needs_cpp), pytest.param("triton", marks=needs_triton), "numpy"]
pytestmark = pytest.mark.usefixtures("numpy_backend")

# snnTorch's RLeaky(reset_mechanism="zero") in the language: the reset of a membrane that crossed
# the threshold (strictly) at the last step zeroes the whole new value, the recurrent current
# included (snnTorch's delayed reset), and its surrogate is ATan(alpha=2).
RLEAKY_ZERO = """
neuron RLeakyZero:
    input x
    param beta = 0.5 where 0 <= beta <= 1
    param threshold = 1.0 where threshold > 0
    state mem = 0.0
    update:
        let reset = where(mem - threshold > 0, 1, 0)
        mem = (1 - reset) * (beta * mem + x)
    spike when mem > threshold surrogate atan(alpha=2.0)
    output spike, mem
"""


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def layer_condition(m, x: torch.Tensor, g: torch.Tensor) -> float:
    """The condition of a layer's outputs and gradients (W_in, W_rec, bias, x) at these weights
    and inputs (`tolerances.condition`, on a float64 copy of the layer on the torch backend):
    how much the recurrence amplifies a relative rounding."""
    mm = copy.deepcopy(m).double()
    mm.backend = "torch"
    names = [n for n in ("W_in", "W_rec", "bias") if getattr(mm, n, None) is not None]

    def run(xx, *ws):
        mm.reset()
        with torch.no_grad():
            for n, w in zip(names, ws):
                getattr(mm, n).copy_(w)
        mm.zero_grad()
        xx = xx.clone().requires_grad_()
        out = mm(xx)
        out = out if isinstance(out, tuple) else (out,)
        sum((o * g.double()).sum() for o in out).backward()
        return [o.detach() for o in out] + [getattr(mm, n).grad for n in names] + [xx.grad]

    return condition(run, x, *(getattr(m, n).detach() for n in names))


def grads_close(ours, theirs, ops: float, cond: float = 1.0):
    """Each gradient within the normwise bound of `ops` roundings amplified by `cond`
    (tests/tolerances.py)."""
    for name, a, b in ours_theirs(ours, theirs):
        assert b.abs().max() > 0, f"{name}: the reference gradient is zero (a test that cannot fail)"
        bound = tol(a.dtype, ops, cond, ref_dtype=b.dtype)
        assert rel(a, b) <= bound, f"{name}: relative error {rel(a, b):.2e} > {bound:.2e} ({ops} operations)"


def ours_theirs(ours, theirs):
    for (name, a), b in zip(ours, theirs):
        yield name, a, b


# ----------------------------------------------------------------------------- the peers
def test_equals_snntorch_rleaky_all_to_all_zero_reset():
    # in float32: snnTorch's spike functions return float32 whatever the membrane's dtype
    snn = pytest.importorskip("snntorch")
    torch.manual_seed(1)
    T, B, H = 25, 4, 12
    ref = snn.RLeaky(beta=0.5, linear_features=H, all_to_all=True, reset_mechanism="zero")
    with torch.no_grad():
        ref.recurrent.weight.mul_(4.0)
    fc = nn.Linear(6, H)
    x = torch.rand(T, B, 6) * 3
    xr = x.clone().requires_grad_()
    spk, mem = ref.init_rleaky()
    out, mems = [], []
    cur = fc(xr)
    for t in range(T):
        spk, mem = ref(cur[t], spk, mem)
        out.append(spk)
        mems.append(mem)
    out, mems = torch.stack(out), torch.stack(mems)
    g1, g2 = torch.randn_like(out), torch.randn_like(mems)
    ((out * g1).sum() + (mems * g2).sum()).backward()

    m = flexdsl.recurrent(RLEAKY_ZERO, 6, H, backend="torch")
    with torch.no_grad():
        m.W_in.copy_(fc.weight)
        m.bias.copy_(fc.bias + ref.recurrent.bias)  # RLeaky's recurrent bias is added every step
        m.W_rec.copy_(ref.recurrent.weight)
    xo = x.clone().requires_grad_()
    s, v = m(xo)
    assert 30 < int(out.sum()) < out.numel() * 0.6  # the layer really fires, and not always
    assert torch.equal(s, out)
    ops = layer_ops(RLEAKY_ZERO, T, B, 6, H)
    assert rel(v, mems) <= tol(torch.float32, ops)
    ((s * g1).sum() + (v * g2).sum()).backward()
    grads_close([("W_in", m.W_in.grad), ("W_rec", m.W_rec.grad), ("x", xo.grad), ("bias", m.bias.grad),
                 ("bias", m.bias.grad)],
                [fc.weight.grad, ref.recurrent.weight.grad, xr.grad, fc.bias.grad, ref.recurrent.bias.grad], ops)


def test_equals_norse_lif_recurrent_without_autapses():
    norse = pytest.importorskip("norse.torch")
    torch.manual_seed(2)
    T, B, I, H = 30, 3, 5, 10
    # Norse's LIFParameters are float32 tensors (dt * tau_mem_inv = float32(0.1)): in float64 here,
    # so that the two layers compute the same numbers
    from norse.torch.functional.lif import LIFParameters

    p = LIFParameters()
    p = p._replace(**{k: torch.as_tensor(getattr(p, k)).double()
                      for k in ("tau_syn_inv", "tau_mem_inv", "v_leak", "v_th", "v_reset", "alpha")})
    ref = norse.LIFRecurrent(I, H, p=p, autapses=False).double()
    with torch.no_grad():
        ref.input_weights.mul_(30.0)
        ref.recurrent_weights.mul_(30.0)
    x = torch.rand(T, B, I, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    out, _ = ref(xr)
    g = torch.randn_like(out)
    (out * g).sum().backward()

    # Norse: the spike enters the reset detached, the recurrent weights have no diagonal (a mask)
    m = flexdsl.recurrent("norse_lif", I, H, bias=False, detach_reset=True, mask=1 - torch.eye(H),
                          backend="torch").double()
    with torch.no_grad():
        m.W_in.copy_(ref.input_weights)
        m.W_rec.copy_(ref.recurrent_weights)
    xo = x.clone().requires_grad_()
    s = m(xo)
    assert 20 < int(out.sum()) < out.numel() * 0.6
    assert torch.equal(s, out)
    (s * g).sum().backward()
    assert torch.all(m.W_rec.grad.diagonal() == 0)
    grads_close([("W_in", m.W_in.grad), ("W_rec", m.W_rec.grad), ("x", xo.grad)],
                [ref.input_weights.grad, ref.recurrent_weights.grad, xr.grad],
                layer_ops("norse_lif", T, B, I, H, detach_reset=True), layer_condition(m, x, g))


def test_equals_spikingjelly_linear_recurrent_container():
    pytest.importorskip("spikingjelly")
    from spikingjelly.activation_based import functional, layer, neuron

    torch.manual_seed(3)
    T, B, H = 20, 4, 16
    ref = layer.LinearRecurrentContainer(neuron.LIFNode(tau=2.0), H, H, bias=True, step_mode="m").double()
    with torch.no_grad():
        ref.rc.weight.mul_(3.0)
    x = torch.rand(T, B, H, dtype=torch.float64) * 2
    xr = x.clone().requires_grad_()
    functional.reset_net(ref)
    out = ref(xr)
    g = torch.randn_like(out)
    (out * g).sum().backward()

    m = flexdsl.recurrent("lif", H, H, backend="torch").double()
    with torch.no_grad():
        m.W_in.copy_(ref.rc.weight[:, :H])
        m.W_rec.copy_(ref.rc.weight[:, H:])
        m.bias.copy_(ref.rc.bias)
    xo = x.clone().requires_grad_()
    s = m(xo)
    assert 20 < int(out.sum()) < out.numel() * 0.6
    assert torch.equal(s, out)
    (s * g).sum().backward()
    gw = ref.rc.weight.grad
    grads_close([("W_in", m.W_in.grad), ("W_rec", m.W_rec.grad), ("bias", m.bias.grad), ("x", xo.grad)],
                [gw[:, :H], gw[:, H:], ref.rc.bias.grad, xr.grad], layer_ops("lif", T, B, H, H))


class _PseudoDerivative(torch.autograd.Function):
    """Bellec et al.'s spike: H(v - A) forward, gamma max(0, 1 - |v - A| / v_th) backward."""

    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return g * 0.3 * torch.clamp(1 - u.abs() / 1.0, min=0)


def lsnn_loop(x, W_in, W_rec, b, tau_m=20.0, tau_a=200.0, beta=1.8, v_th=1.0):
    """A recurrent ALIF (LSNN) layer by hand: alpha = exp(-1/tau_m), rho = exp(-1/tau_a);
    v = alpha v + (1 - alpha) I, a = rho a; z = H(v - v_th - beta a); v -= z v_th; a += z, with
    I = W_in x + W_rec z[t-1] + b (flexdsl's alif: the reset in the step that fires)."""
    import math

    alpha, rho = math.exp(-1 / tau_m), math.exp(-1 / tau_a)
    T, B = x.shape[:2]
    H = W_rec.shape[0]
    v = x.new_zeros(B, H)
    a = x.new_zeros(B, H)
    z = x.new_zeros(B, H)
    out = []
    for t in range(T):
        i = x[t] @ W_in.T + z @ W_rec.T + b
        v = alpha * v + (1 - alpha) * i
        a = rho * a
        z = _PseudoDerivative.apply(v - (v_th + beta * a))
        v = v - z * v_th
        a = a + z
        out.append(z)
    return torch.stack(out), v, a


@pytest.mark.parametrize("backend", SCANS)
def test_recurrent_alif_equals_hand_written_lsnn_loop(backend):
    torch.manual_seed(4)
    T, B, I, H = 40, 3, 6, 12
    m = flexdsl.recurrent("alif", I, H, backend=backend)
    dtype = torch.float64 if backend != "triton" else torch.float32
    m = m.to(dtype)
    with torch.no_grad():
        m.W_in.mul_(40.0)
        m.W_rec.mul_(10.0)
    x = torch.rand(T, B, I, dtype=dtype)
    W = [p.detach().clone().requires_grad_() for p in (m.W_in, m.W_rec, m.bias)]
    xr = x.clone().requires_grad_()
    out, v, a = lsnn_loop(xr, *W)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    xo = x.clone().requires_grad_()
    s = m(xo)
    assert 20 < int(out.sum()) < out.numel() * 0.5
    assert torch.equal(s, out)
    ops = layer_ops("alif", T, B, I, H)
    assert rel(m.neuron.v, v) <= tol(dtype, ops) and rel(m.neuron.a, a) <= tol(dtype, ops)
    (s * g).sum().backward()
    grads_close([("W_in", m.W_in.grad), ("W_rec", m.W_rec.grad), ("bias", m.bias.grad), ("x", xo.grad)],
                [W[0].grad, W[1].grad, W[2].grad, xr.grad], ops)


# ----------------------------------------------------------------------------- Triton == torch
CASES = [
    # model, options, input scale
    ("lif", {}, 3.0),
    ("alif", {}, 60.0),
    ("izhikevich", {}, 30.0),
    ("norse_lif", {"detach_reset": True}, 300.0),
    (RLEAKY_ZERO, {}, 2.0),
    ("lif_refractory", {"dt": 1.0}, 300.0),
    ("plif", {}, 3.0),
    ("lif", {"connectivity": "one_to_one"}, 3.0),
    ("lif", {"param_shapes": {"tau": (9,)}}, 3.0),
    ("lif", {"in_features": None}, 3.0),
    ("lif", {"mask": torch.rand(9, 9) > 0.5}, 3.0),
    ("li", {}, 3.0),  # a non-spiking model: its output (not binary) is fed back
    (RLEAKY_ZERO, {"source": "mem"}, 1.0),
]


def _run(m, x, w):
    m.reset()
    m.zero_grad()
    xx = x.clone().requires_grad_()
    out = m(xx)
    out = out if isinstance(out, tuple) else (out,)
    (sum((o * w).sum() for o in out)).backward()
    params = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return [o.detach() for o in out], params, xx.grad, {k: getattr(m.neuron, k).detach() for k in m.neuron.state_names}


@needs_triton
@pytest.mark.parametrize("model, opts, scale", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_triton_scan_equals_torch_scan(model, opts, scale):
    torch.manual_seed(5)
    T, B, I, H = 10, 3, 5, 9
    opts = dict(opts)
    in_f = opts.pop("in_features", I)
    m = flexdsl.recurrent(model, in_f, H, backend="torch", **opts)
    with torch.no_grad():
        m.W_rec.mul_(4.0 if m.connectivity == "all" else 1.0)
        if m.W_in is not None:
            m.W_in.mul_(scale)
        if m.neuron._parameters:
            for p in m.neuron.parameters():
                p.add_(0.1 * torch.rand_like(p))
    x = torch.rand(T, B, in_f if in_f is not None else H) * (scale if in_f is None else 1.0)
    w = torch.randn(T, B, H)
    ref = _run(m, x, w)
    m.backend = "triton"
    got = _run(m, x, w)
    assert any(int((o != 0).sum()) > 5 for o in ref[0])
    neuron_opts = {k: v for k, v in opts.items() if k == "detach_reset"}
    ops = layer_ops(model, T, B, in_f, H, **neuron_opts)
    for a, b in zip(got[0], ref[0]):
        assert_close(a, b, ops=ops, what="output")
    assert set(got[1]) == set(ref[1])
    for k in ref[1]:
        assert rel(got[1][k], ref[1][k]) <= tol(torch.float32, ops), k
    assert rel(got[2], ref[2]) <= tol(torch.float32, ops)
    for k in ref[3]:
        assert_close(got[3][k], ref[3][k], ops=ops, what=k)


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("model, opts, scale", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_cpu_scan_equals_torch_scan(model, opts, scale, dtype):
    """The CPU kernels' scan (the model's C++ step per step, torch's products) against the torch
    scan (the generated torch step): outputs, every gradient and the kept states. The two differ
    only in rounding: the recurrent gradient enters the step as addmm(g, gI, W) there and g + gI @ W
    here (one rounding of the H-term sum more or less), and the C++ exp/sigmoid are within ~1 ulp
    of torch's; over T = 10 steps of ~20 operations each, with the layer's products of H = 9 terms,
    that is ~10 * (20 + 9) * u relative (u = 2^-53 in float64: ~3e-14; 2^-24 in float32: ~2e-5),
    bounded with a margin of ~30 in float64, where spikes must be equal, and of ~2 in float32."""
    torch.manual_seed(5)
    T, B, I, H = 10, 3, 5, 9
    opts = dict(opts)
    in_f = opts.pop("in_features", I)
    m = flexdsl.recurrent(model, in_f, H, backend="torch", **opts).to(dtype)
    with torch.no_grad():
        m.W_rec.mul_(4.0 if m.connectivity == "all" else 1.0)
        if m.W_in is not None:
            m.W_in.mul_(scale)
        if m.neuron._parameters:
            for p in m.neuron.parameters():
                p.add_(0.1 * torch.rand_like(p))
    x = (torch.rand(T, B, in_f if in_f is not None else H) * (scale if in_f is None else 1.0)).to(dtype)
    w = torch.randn(T, B, H, dtype=dtype)
    ref = _run(m, x, w)
    m.backend = "cpu"
    calls = dict(CALLS)
    got = _run(m, x, w)
    assert CALLS["fwd"] == calls["fwd"] + T and CALLS["bwd"] == calls["bwd"] + T  # (one kernel call per step)
    assert any(int((o != 0).sum()) > 5 for o in ref[0])
    tol = 1e-12 if dtype == torch.float64 else 4e-5
    for a, b in zip(got[0], ref[0]):
        if dtype == torch.float64:
            assert torch.equal(a != 0, b != 0)  # (the same spikes)
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert set(got[1]) == set(ref[1])
    for k in ref[1]:
        assert rel(got[1][k], ref[1][k]) < tol, k
    assert rel(got[2], ref[2]) < tol
    for k in ref[3]:
        torch.testing.assert_close(got[3][k], ref[3][k], rtol=tol, atol=tol)


@pytest.mark.parametrize("model, opts, scale", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_numpy_scan_equals_torch_scan(model, opts, scale):
    """The NumPy backend's scan (tests/numpy_backend: its own printed step and derived backward, the
    loop in NumPy) against the torch scan in float64: the same spikes, outputs, gradients and kept
    states up to float64 roundings."""
    torch.manual_seed(5)
    T, B, I, H = 10, 3, 5, 9
    opts = dict(opts)
    in_f = opts.pop("in_features", I)
    m = flexdsl.recurrent(model, in_f, H, backend="torch", **opts).double()
    with torch.no_grad():
        m.W_rec.mul_(4.0 if m.connectivity == "all" else 1.0)
        if m.W_in is not None:
            m.W_in.mul_(scale)
    x = (torch.rand(T, B, in_f if in_f is not None else H) * (scale if in_f is None else 1.0)).double()
    w = torch.randn(T, B, H, dtype=torch.float64)
    ref = _run(m, x, w)
    m.backend = "numpy"
    got = _run(m, x, w)
    assert any(int((o != 0).sum()) > 5 for o in ref[0])
    for a, b in zip(got[0], ref[0]):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
    assert set(got[1]) == set(ref[1])
    for k in ref[1]:
        assert rel(got[1][k], ref[1][k]) < 1e-11, k
    assert rel(got[2], ref[2]) < 1e-11
    for k in ref[3]:
        torch.testing.assert_close(got[3][k], ref[3][k], rtol=1e-11, atol=1e-11)


@needs_triton
def test_triton_scan_bfloat16_follows_float32():
    torch.manual_seed(6)
    T, B, I, H = 12, 2, 4, 20
    m = flexdsl.recurrent("lif", I, H, backend="torch")
    x = torch.rand(T, B, I) * 3
    w = torch.randn(T, B, H)
    ref = _run(m, x, w)
    mb = copy.deepcopy(m).to(torch.bfloat16)
    mb.backend = "triton"
    got = _run(mb, x.bfloat16(), w.bfloat16())
    assert got[0][0].dtype == torch.bfloat16
    agree = (got[0][0].float() == ref[0][0]).float().mean()
    assert agree > 0.95
    assert rel(got[1]["W_in"].float(), ref[1]["W_in"]) < 0.15


# ----------------------------------------------------------------------------- states and modes
@pytest.mark.parametrize("backend", SCANS)
def test_calls_continue_a_sequence_and_single_steps_equal_multi_step(backend):
    torch.manual_seed(7)
    T, B, I, H = 12, 2, 3, 8
    m = flexdsl.recurrent("alif", I, H, backend=backend)
    with torch.no_grad():
        m.W_in.mul_(60.0)
        m.W_rec.mul_(5.0)
    x = torch.rand(T, B, I)
    whole = m(x)
    v_whole = m.neuron.v.clone()
    assert whole.sum() > 5
    m.reset()
    halves = torch.cat([m(x[:5]), m(x[5:])])
    assert torch.equal(halves, whole)
    m.reset()
    m.step_mode = "s"
    steps = torch.stack([m(x[t]) for t in range(T)])
    assert torch.equal(steps, whole)
    # the same step's operations in another grouping (chunks, single steps): T steps' roundings
    assert_close(m.neuron.v, v_whole, ops=layer_ops("alif", T, B, I, H))
    assert torch.equal(m.feedback, whole[-1])


def test_reset_clears_feedback_and_neuron_states_and_reset_net_too():
    pytest.importorskip("spikingjelly")
    from spikingjelly.activation_based import functional

    torch.manual_seed(8)
    m = flexdsl.recurrent("lif", 3, 6)
    with torch.no_grad():
        m.W_in.mul_(10.0)
    x = torch.rand(6, 2, 3)
    first = m(x)
    assert m.feedback is not None and m.neuron.v.shape == (2, 6)
    m.reset()
    assert m.feedback is None
    assert torch.equal(m(x), first)
    net = nn.Sequential(m, nn.Linear(6, 2))
    functional.reset_net(net)
    assert m.feedback is None
    assert torch.equal(m(x), first)
    # given initial spikes change the first step's recurrent current
    m.reset()
    m.feedback = torch.ones(2, 6)
    assert not torch.equal(m(x), first)


def test_initial_feedback_gets_its_gradient_and_detach_cuts_it():
    torch.manual_seed(9)
    m = flexdsl.recurrent("lif", 3, 5, backend="torch").double()
    x = torch.rand(4, 2, 3, dtype=torch.float64) * 4
    s0 = torch.rand(2, 5, dtype=torch.float64, requires_grad=True)
    m.feedback = s0
    out = m(x)
    out.sum().backward()
    assert s0.grad is not None and s0.grad.abs().sum() > 0
    # the same by finite differences of the first step's membrane through W_rec: d out/d s0 via autograd
    # of the torch loop written out
    m2 = copy.deepcopy(m)
    m2.reset()
    m2.feedback = s0.detach()
    y1 = m2(x)
    m.detach()
    assert not m.feedback.requires_grad
    y2 = m(x)
    y2.sum().backward()  # no error: the graph of the first call is cut
    assert y1.shape == y2.shape


def test_pickle_and_state_dict_round_trip():
    torch.manual_seed(10)
    m = flexdsl.recurrent("alif", 4, 6, tau_m=15.0)
    x = torch.rand(5, 2, 4) * 50
    y = m(x)
    m2 = pickle.loads(pickle.dumps(m))
    m2.reset()
    m.reset()
    assert torch.equal(m2(x), m(x))
    m3 = flexdsl.recurrent("alif", 4, 6, tau_m=15.0)
    m3.load_state_dict(m.state_dict())
    m.reset()
    assert torch.equal(m3(x), y)
    assert {"W_in", "W_rec", "bias"} <= {n for n, _ in m.named_parameters()}


def test_learnable_neuron_params_train_with_the_weights():
    torch.manual_seed(11)
    m = flexdsl.recurrent("plif", 3, 5, backend="torch").double()
    x = torch.rand(8, 2, 3, dtype=torch.float64) * 4
    m(x).sum().backward()
    assert m.neuron.w.grad is not None and m.neuron.w.grad != 0


@pytest.mark.parametrize("backend", ["torch", pytest.param("cpu", marks=needs_cpp), "numpy"])
def test_other_inputs_of_a_model_are_passed_after_x(backend):
    text = """
neuron TwoPort:
    input x
    input drive
    param tau = 2.0 where tau > 1
    state v = 0.0
    update:
        v = v + (x + 2 * drive - v) / tau
    spike when v >= 1.0
    on spike:
        v = 0.0
    output spike
"""
    torch.manual_seed(12)
    m = flexdsl.recurrent(text, 3, 4, port="drive", backend=backend).double()
    x = torch.rand(6, 2, 3, dtype=torch.float64)
    other = torch.rand(6, 2, 4, dtype=torch.float64, requires_grad=True)
    out = m(x, other)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    assert other.grad is not None and other.grad.abs().sum() > 0
    if backend != "torch":  # the other input's gradient, as the torch scan gives it (float64: 6 steps of ~20
        # operations, exp/sigmoid within an ulp of torch's, ~1e-14 relative; gradients of order 1)
        ref_m = copy.deepcopy(m)
        ref_m.backend = "torch"
        ref_m.reset()
        o2 = other.detach().clone().requires_grad_()
        r = ref_m(x, o2)
        (r * torch.linspace(-1, 1, r.numel(), dtype=r.dtype).reshape(r.shape)).sum().backward()
        torch.testing.assert_close(other.grad, o2.grad, rtol=1e-12, atol=1e-12)
    # by hand: drive receives the recurrent current, x the other input
    v = torch.zeros(2, 4, dtype=torch.float64)
    s = torch.zeros(2, 4, dtype=torch.float64)
    ref = []
    for t in range(6):
        drive = x[t] @ m.W_in.detach().T + m.bias.detach() + s @ m.W_rec.detach().T
        v = v + (other.detach()[t] + 2 * drive - v) / 2.0
        s = (v >= 1.0).double()
        v = v * (1 - s)
        ref.append(s)
    assert torch.equal(out, torch.stack(ref))
    with pytest.raises(TypeError, match="takes 2 inputs"):
        m(x)


# ----------------------------------------------------------------------------- bad input
def test_bad_construction_is_a_located_error():
    with pytest.raises(FlexDSLError, match=r"lif\.neuron:\d+:\d+: error: `LIF` has no input `y`") as e:
        flexdsl.recurrent("lif", 3, 4, port="y")
    assert "its inputs: x" in str(e.value) or "did you mean" in str(e.value)
    with pytest.raises(FlexDSLError, match=r"recurrent source must be an output of `LIF`; `v` is not one") as e:
        flexdsl.recurrent("lif", 3, 4, source="v")
    assert "output spike, v" in str(e.value)
    with pytest.raises(FlexDSLError, match="has no output `spik`") as e:
        flexdsl.recurrent("lif", 3, 4, source="spik")
    assert "did you mean `spike`" in str(e.value)
    with pytest.raises(FlexDSLError, match=r"`mask` has shape \(3, 3\), but hidden=4"):
        flexdsl.recurrent("lif", 3, 4, mask=torch.ones(3, 3))
    with pytest.raises(FlexDSLError, match="0/1"):
        flexdsl.recurrent("lif", 3, 4, mask=torch.full((4, 4), 0.5))
    with pytest.raises(FlexDSLError, match="connectivity must be"):
        flexdsl.recurrent("lif", 3, 4, connectivity="sparse")
    with pytest.raises(FlexDSLError, match="hidden must be a positive int"):
        flexdsl.recurrent("lif", 3, 0)
    with pytest.raises(FlexDSLError, match="in_features must be a positive int"):
        flexdsl.recurrent("lif", 2.5, 4)
    with pytest.raises(FlexDSLError, match="has no param `tua`"):
        flexdsl.recurrent("lif", 3, 4, tua=3.0)


def test_bad_calls_are_located_errors_before_anything_is_computed():
    m = flexdsl.recurrent("lif", 3, 4)
    with pytest.raises(FlexDSLError, match=r"lif\.neuron:\d+:\d+: error: the layer's input has 5 features") as e:
        m(torch.rand(4, 2, 5))
    assert "in_features=3" in str(e.value)
    with pytest.raises(FlexDSLError, match="the input is torch.float64 but the layer's weights are torch.float32"):
        m(torch.rand(4, 2, 3, dtype=torch.float64))
    with pytest.raises(FlexDSLError, match="floating point"):
        m(torch.ones(4, 2, 3, dtype=torch.int64))
    with pytest.raises(FlexDSLError, match=r"\[T, \*batch, features\]"):
        m(torch.rand(3))
    m(torch.rand(4, 2, 3))
    with pytest.raises(FlexDSLError, match="call m.reset()"):
        m(torch.rand(4, 5, 3))
    assert m.feedback.shape == (2, 4)  # nothing was computed on the bad call


def test_spike_inputs_take_exact_bfloat16_products(monkeypatch):
    """On CUDA in float32, an input exact in bfloat16 (spikes) is multiplied by W_in's three
    bfloat16 parts (exact products, float32 sums), and the weight gradients of spikes likewise:
    here on the CPU with the products done in float64, the results equal the float32 path's."""

    torch.manual_seed(13)
    m = flexdsl.recurrent("lif", 6, 8, backend="torch")
    with torch.no_grad():
        m.W_in.mul_(3.0)
        m.W_rec.mul_(3.0)
    g = torch.randn(10, 3, 8)

    def run(x):
        m.reset()
        m.zero_grad()
        out = m(x)
        (out * g).sum().backward()
        return out.detach(), [p.grad.clone() for p in (m.W_in, m.W_rec, m.bias)]

    spikes = (torch.rand(10, 3, 6) < 0.4).float() * 8
    ref = run(spikes)
    calls = []

    def products(pairs, init=None):
        calls.append(len(pairs))
        out = sum(a.double() @ b.double() for a, b in pairs)
        return (out if init is None else out + init.double()).float()

    from flexdsl.backends import layercall

    monkeypatch.setattr(layercall, "bf16_products", products)
    monkeypatch.setattr(layercall, "fast_products", lambda t: t.dtype == torch.float32)
    got = run(spikes)
    assert calls[:1] == [3] and len(calls) == 3  # the input product, dW_in, dW_rec
    assert ref[0].sum() > 10 and torch.equal(got[0], ref[0])
    for a, b in zip(got[1], ref[1]):  # the same gradients but for the products' roundings
        assert rel(a, b) <= tol(torch.float32, layer_ops("lif", 10, 3, 6, 8))
    calls.clear()
    run(torch.rand(10, 3, 6))  # not exact in bfloat16: the float32 product
    assert calls == [3]  # only dW_rec, of the spikes


@needs_triton
def test_triton_input_product_kernels_are_exact():
    """The fused input product of the GPU path (`backends/triton/products.py`, here in Triton's
    interpreter): the one-pass bfloat16 conversion refuses values it would change (and infinities,
    whose product with a zero part of a weight would be NaN), and the product of spikes with W_in's
    three bfloat16 parts equals the exact float64 product: bit for bit on a dyadic grid (every sum
    exact in float32), within float32 rounding otherwise; tiles with tails in M, N and K."""
    from flexdsl.backends.triton import products

    torch.manual_seed(3)
    x = (torch.rand(37, 70) < 0.3).float() * 8
    xb = products.to_bf16_exact(x)
    assert xb is not None and xb.dtype == torch.bfloat16 and torch.equal(xb.float(), x)
    for bad in (1e-3, float("inf"), float("nan")):
        y = x.clone()
        y[5, 7] = bad if bad != 1e-3 else 1 + bad
        assert products.to_bf16_exact(y) is None, bad
    assert products.to_bf16_exact(torch.empty(0, 5)).shape == (0, 5)
    for M, N, K in ((37, 45, 70), (5, 3, 1), (64, 32, 33)):
        x = (torch.rand(M, K) < 0.3).float() * 8
        xb = products.to_bf16_exact(x)
        grid_w = torch.randint(-64, 65, (N, K)) / 128.0
        grid_b = torch.randint(-64, 65, (N,)) / 128.0
        got = products.split3_mm(xb, grid_w, grid_b)
        assert torch.equal(got.double(), x.double() @ grid_w.double().t() + grid_b.double())
        w, b = torch.randn(N, K), torch.randn(N)
        exact = x.double() @ w.double().t() + b.double()
        got = products.split3_mm(xb, w, b)
        bound = 2 * K * 2.0 ** -24 * (x.double().abs() @ w.double().abs().t() + b.double().abs())
        assert ((got.double() - exact).abs() <= bound).all()
        got = products.split3_mm(xb, grid_w, None)  # (no bias)
        assert torch.equal(got.double(), x.double() @ grid_w.double().t())
    assert products.split3_mm(torch.empty(0, 4, dtype=torch.bfloat16), torch.zeros(2, 4), None).shape == (0, 2)
    w = torch.randn(7, 13) * torch.logspace(-20, 20, 13)  # (magnitudes far apart)
    parts = products.split3(w)
    assert parts.shape == (3, 7, 13) and parts.dtype == torch.bfloat16
    assert torch.equal(parts.double().sum(0), w.double())  # (the three parts hold every float32 bit)
    padded = products.split3(w, 64)
    assert padded.shape == (3, 7, 64) and torch.equal(padded[:, :, :13], parts) and not padded[:, :, 13:].any()


def run_on(m, x, g, s0):
    """The float32 Triton layer `m` (a copy) on x, from the feedback s0: (spikes, weight gradients)."""
    mm = copy.deepcopy(m)
    mm.backend = "triton"
    if s0 is not None:
        mm.feedback = s0
    out = mm(x)
    (out * g.float()).sum().backward()
    return out.detach(), [p.grad.clone() for p in (mm.W_in, mm.W_rec, mm.bias)]


@needs_triton
@pytest.mark.parametrize("name, value", [("FLEXDSL_PRODUCT_TILE", "128x128"), ("FLEXDSL_PRODUCT_TILE", "8x32x32"),
                                         ("FLEXDSL_PRODUCT_WARPS", "3"), ("FLEXDSL_PRODUCT_STAGES", "-1")])
def test_bad_product_settings_are_clear_errors(monkeypatch, name, value):
    from flexdsl.backends.triton import products

    monkeypatch.setenv(name, value)
    xb = torch.ones(4, 3, dtype=torch.bfloat16)
    with pytest.raises(FlexDSLError, match=f"the environment variable {name}"):
        products.split3_mm(xb, torch.ones(2, 3), None)


@needs_triton
def test_layer_on_the_fused_input_product_equals_the_float64_scan(monkeypatch):
    """The layer wired to the GPU path's fused kernels (forced here on CPU tensors, in the
    interpreter): spike inputs go through the one-pass conversion and the fused product, other
    inputs through the float32 product; spikes equal the float64 torch scan's, gradients close."""
    from flexdsl.backends import recurrent as scans
    from flexdsl.backends.triton import products

    torch.manual_seed(5)
    m = flexdsl.recurrent("lif", 12, 10)
    with torch.no_grad():
        m.W_in.copy_(torch.randint(-40, 41, m.W_in.shape) / 128.0)
        m.W_rec.copy_(torch.randint(-40, 41, m.W_rec.shape) / 128.0)
        m.bias.copy_(torch.randint(-20, 21, m.bias.shape) / 128.0)
    g = torch.randn(9, 4, 10, dtype=torch.float64)
    spikes = (torch.rand(9, 4, 12) < 0.4).float() * 8

    def run(dtype, backend):
        mm = copy.deepcopy(m).to(dtype)
        mm.backend = backend
        out = mm(spikes.to(dtype))
        (out * g.to(dtype)).sum().backward()
        return out.detach().double(), [p.grad.double() for p in (mm.W_in, mm.W_rec, mm.bias)]

    ref = run(torch.float64, "torch")
    used = []

    def spy(t, prog):
        used.append(t.shape)
        return products

    analog = torch.rand(9, 4, 12) * 3
    plain = run_on(m, analog, g, None)  # (the float32 product, nothing forced)
    plain_s0 = run_on(m, spikes, g, torch.full((4, 10), 0.3))

    from flexdsl.backends import exact, layercall

    monkeypatch.setattr(scans, "fused_products", spy)
    monkeypatch.setattr(layercall, "fused_products", spy)
    monkeypatch.setattr(exact, "fused_products", spy)
    monkeypatch.setattr(layercall, "fast_products", lambda t: t.dtype == torch.float32)
    got = run(torch.float32, "triton")
    assert used, "the fused kernels were not used"
    assert ref[0].sum() > 10 and torch.equal(got[0], ref[0])
    for a, b in zip(got[1], ref[1]):  # float32 against float64: one side's roundings
        assert rel(a, b) <= tol(torch.float32, layer_ops("lif", 9, 4, 12, 10), ref_dtype=torch.float64)
    # launched as if exact, found not to be (an analog input; feedback set by hand): run again,
    # checked first, with the same results as without the fused path
    from flexdsl.backends.triton.recurrent import TritonRecurrentProgram

    progs = [p for p in scans._PROGRAMS.values() if isinstance(p, TritonRecurrentProgram)]
    for x, s0, want in ((analog, None, plain), (spikes, torch.full((4, 10), 0.3), plain_s0)):
        for p in progs:
            monkeypatch.setattr(p, "check_first", False, raising=False)
        res = run_on(m, x, g, s0)
        assert any(p.check_first for p in progs)  # (from now on the program checks first: one run, not two)
        assert torch.equal(res[0], want[0]) and all(torch.equal(a, b) for a, b in zip(res[1], want[1]))


# ----------------------------------------------------------------------------- NIR
def test_snntorch_rleaky_nir_graph_loads_as_one_compiled_layer():
    """snnTorch exports RLeaky as a LIF node and its recurrent Affine in a cycle; flexdsl.nir.load
    makes the pair one recurrent layer (no step-by-step execution) with snnTorch's spikes."""
    pytest.importorskip("nir")
    snn = pytest.importorskip("snntorch")
    from snntorch import utils as snn_utils
    from snntorch.export_nir import export_to_nir

    from flexdsl.runtime.recurrent import RecurrentModule

    torch.manual_seed(14)
    net = nn.Sequential(nn.Linear(5, 6), snn.RLeaky(beta=torch.full((6,), 0.5), threshold=torch.ones(6),
                                                     init_hidden=True, reset_mechanism="zero", reset_delay=False,
                                                     linear_features=6, output=True))
    with torch.no_grad():
        net[0].weight.mul_(4.0)
        net[0].bias.add_(0.3)
        net[1].recurrent.weight.mul_(2.0)
    x = torch.rand(40, 2, 5) * 3
    with warnings_off():
        g = export_to_nir(net, x[0, 0])
    mine = flexdsl.nir.load(g, dt=1e-4)
    assert mine.recurrent and not mine.stepwise
    layers = [m for m in mine.nodes.values() if isinstance(m, RecurrentModule)]
    assert len(layers) == 1 and layers[0].connectivity == "all" and layers[0].bias is not None
    assert any("recurrent through" in k for k in mine.node_kinds.values())
    snn_utils.reset(net)
    with torch.no_grad():
        ref = torch.stack([net(x[t])[0] for t in range(x.shape[0])])
        out = mine(x)
    assert ref.sum() > 10
    assert torch.equal(out, ref)
    # one step per call: the same, the layer's states kept between calls
    stepwise = flexdsl.nir.load(g, dt=1e-4, step_mode="s")
    with torch.no_grad():
        assert torch.equal(torch.stack([stepwise(x[t]) for t in range(x.shape[0])]), ref)


def warnings_off():
    import contextlib
    import io
    import warnings

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    return stack


@pytest.mark.parametrize("opts", [{}, {"mask": torch.rand(6, 6) > 0.4}, {"connectivity": "one_to_one"},
                                  {"bias": False}])
def test_recurrent_layer_exports_a_cycle_and_loads_back(tmp_path, opts):
    nir = pytest.importorskip("nir")
    from flexdsl.runtime.recurrent import RecurrentModule

    torch.manual_seed(15)
    net = nn.Sequential(flexdsl.recurrent("lif", 5, 6, tau=4.0, **opts), nn.Linear(6, 3))
    with torch.no_grad():
        net[0].W_in.mul_(6.0)
        net[0].W_rec.mul_(3.0)
    x = torch.rand(30, 2, 5)
    g = flexdsl.nir.export(net, x, dt=1e-3)
    kinds = {k: type(v).__name__ for k, v in g.nodes.items()}
    rec = next(k for k in kinds if k.endswith("_rec"))
    neuron = next(k for k, v in kinds.items() if v == "LIF")
    assert (neuron, rec) in g.edges and (rec, neuron) in g.edges  # the cycle
    assert kinds[rec] == ("Scale" if opts.get("connectivity") else "Linear")
    nir.write(str(tmp_path / "rnn.nir"), g)
    back = flexdsl.nir.load(str(tmp_path / "rnn.nir"))
    assert back.recurrent and not back.stepwise
    assert any(isinstance(m, RecurrentModule) for m in back.nodes.values())
    net[0].reset()
    with torch.no_grad():
        ref = net(x)
        assert net[0](x).sum() > 10
        net[0].reset()
        assert torch.equal(back(x), ref)
    # and once more from the loaded network
    g2 = flexdsl.nir.export(back, x, dt=1e-3)
    back.reset()
    again = flexdsl.nir.load(g2)
    with torch.no_grad():
        assert torch.equal(again(x), ref)


def test_a_layer_fed_back_from_another_output_has_no_nir_form():
    pytest.importorskip("nir")
    m = flexdsl.recurrent("li", 3, 4)  # a leaky integrator: its output is its state, not a spike
    with pytest.raises(FlexDSLError, match="feeds back `v`; NIR neurons output their spikes"):
        flexdsl.nir.export(nn.Sequential(m, nn.Linear(4, 2)), torch.rand(5, 2, 3), dt=1e-3)


@pytest.mark.parametrize("backend", SCANS)
def test_empty_sequences_batches_and_several_batch_dims(backend):
    torch.manual_seed(16)
    m = flexdsl.recurrent("lif", 3, 4, backend=backend)
    with torch.no_grad():
        m.W_in.mul_(8.0)
    x = torch.rand(0, 2, 3, requires_grad=True)
    y = m(x)
    y.sum().backward()
    assert y.shape == (0, 2, 4) and x.grad.shape == x.shape and m.feedback is None
    y = m(torch.rand(5, 0, 3))
    assert y.shape == (5, 0, 4)
    m.reset()
    x4 = torch.rand(3, 5, 2, 4).permute(1, 0, 2, 3)[..., :3]  # [T=5, 3, 2, 3], not contiguous
    y4 = m(x4)
    assert y4.shape == (5, 3, 2, 4) and m.neuron.v.shape == (3, 2, 4) and y4.sum() > 0
    m.reset()
    flat = m(x4.reshape(5, 6, 3))  # the batch dims are independent rows
    assert torch.equal(flat.reshape(5, 3, 2, 4), y4)


def test_second_derivatives_are_an_error_not_zeros():
    m = flexdsl.recurrent("lif", 3, 4)
    x = torch.rand(6, 2, 3, requires_grad=True)
    with pytest.raises(FlexDSLError, match="second derivatives through a recurrent layer"):
        torch.autograd.grad(m(x).sum(), x, create_graph=True)


def test_bench_smoke_runs_on_the_cpu():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "bench" / "recurrent_gpu.py"), "--smoke", "--models", "lif",
                        "--modes", "train", "--dtypes", "fp32"], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "lif  fp32 train H=   16 T=   4 B=   2  hand" in r.stdout and "flexdsl" in r.stdout


@needs_triton
@pytest.mark.parametrize("name, value", [("FLEXDSL_RECURRENT_TILE", "3x3"), ("FLEXDSL_RECURRENT_TILE", "8x32x32"),
                                         ("FLEXDSL_RECURRENT_WARPS", "3"), ("FLEXDSL_RECURRENT_BK", "-64"),
                                         ("FLEXDSL_RECURRENT_PRODUCTS", "tf32"), ("FLEXDSL_RECURRENT_FIXED", "yes"),
                                         ("FLEXDSL_RECURRENT_RESIDENT", "2")])
def test_bad_launch_settings_are_clear_errors(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    m = flexdsl.recurrent("lif", 3, 4, backend="triton")
    with pytest.raises(FlexDSLError, match=f"the environment variable {name}"):
        m(torch.rand(3, 2, 3, requires_grad=True)).sum().backward()


# ----------------------------------------------------------------------------- replayed calls
def test_replay_key_holds_what_a_captured_call_depends_on(monkeypatch):
    """A CUDA graph replays the kernels of the call it captured, reading the weights and tensor
    params in place and the call's own tensors from copies: its key must change with anything else
    the launches depend on (shapes, dtypes, float values to the bit, the weights' addresses and
    layouts, the settings, known-zero feedback) and must not change with the copied values."""
    from flexdsl.backends.replay import graph_key

    T, B, F, H = 5, 3, 4, 6
    x, s0 = torch.rand(T, B, F), torch.zeros(B, H)
    w_in, b, w, tau = torch.rand(H, F), torch.rand(H), torch.rand(H, H), torch.rand(H)

    def key(**kw):
        a = dict(x=x, w_in=w_in, b=b, w=w, s0=s0, s0_zero=True, inputs=[None], states=[0.0], params=[tau, 2.0],
                 dense=True)
        a.update(kw)
        return graph_key(**a)

    base = key()
    assert key(x=torch.rand(T, B, F), s0=torch.ones(B, H)) == base  # (copied: values do not matter)
    assert key(params=[tau.view(H), 2.0]) == base  # (a view of the same memory reads the same)
    changed = {
        "another input shape": key(x=torch.rand(T + 1, B, F)),
        "another dtype": key(x=x.double()),
        "a new weight tensor": key(w=w.clone()),
        "a transposed weight": key(w=w.t()),
        "a new param tensor": key(params=[tau.clone(), 2.0]),
        "another float param": key(params=[tau, 2.5]),
        "-0.0 for 0.0": key(states=[-0.0]),
        "a state tensor for a float": key(states=[torch.zeros(B, H)]),
        "given feedback": key(s0_zero=False),
        "one-to-one": key(dense=False),
        "no bias": key(b=None),
    }
    for what, k in changed.items():
        assert k != base, what
    with torch.inference_mode():
        assert key() != base
    monkeypatch.setenv("FLEXDSL_RECURRENT_TILE", "32x32x32")
    assert key() != base
    monkeypatch.setenv("FLEXDSL_RECURRENT_TILE", "")
    monkeypatch.setenv("FLEXDSL_PRODUCT_STAGES", "2")
    assert key() != base


def test_replay_policy_eager_first_then_graph_and_back_to_eager_on_a_failed_check(monkeypatch):
    """The replay policy (graphs faked, CPU): a key's first call runs eagerly (it compiles the
    kernels), the second captures, later ones replay; a verdict "not exact" drops the graph and
    makes the program check first (as eagerly); keys that keep changing stop capturing after
    CAPTURES; at most KEEP graphs are held."""
    from flexdsl.backends import replay

    made, runs = [], []

    class Fake:
        def __init__(self, ok=True):
            self.ok = ok

        def run(self, x, s0, inputs, states):
            runs.append(x)
            return [x * 2] if self.ok else None

    verdict = [True]

    def capture(*a):
        made.append(a[0])
        return Fake(verdict[0])

    monkeypatch.setattr(replay, "_capture", capture)

    class Prog:
        pass

    prog = Prog()
    x = torch.ones(2)

    def call(key):
        return replay.replay(prog, key, x, x, True, [], [], True, None, None)

    assert call("a") is None and not made  # first sight: eagerly
    assert torch.equal(call("a")[0], x * 2) and len(made) == 1  # captured and run
    assert torch.equal(call("a")[0], x * 2) and len(made) == 1 and len(runs) == 2  # replayed
    verdict[0] = False
    assert call("b") is None and call("b") is None  # captured; its check failed: eagerly
    assert getattr(prog, "check_first", False) and "b" not in prog._graphs
    for k in range(3 * replay.CAPTURES):
        call(f"k{k}")
        call(f"k{k}")
    assert len(made) <= replay.CAPTURES and getattr(prog, "graphs_off", False)
    assert len(prog._graphs) <= replay.KEEP


def test_replay_is_only_for_small_gradient_free_cuda_calls():
    """No graph for CPU tensors, for the torch scan, when a gradient is wanted, for noisy models,
    or when turned off (FLEXDSL_RECURRENT_GRAPHS=0, checked like every setting)."""
    from flexdsl.backends.replay import eligible

    class Prog:
        fused_products = True

    x = torch.rand(4, 2, 3)
    assert not eligible(Prog(), x, [x], None, 5)  # (CPU)
    assert not eligible(object(), x, [x], None, 5)


@pytest.mark.parametrize("value", ["2", "yes"])
def test_bad_graph_setting_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("FLEXDSL_RECURRENT_GRAPHS", value)
    from flexdsl.settings import env_choice

    with pytest.raises(FlexDSLError, match="FLEXDSL_RECURRENT_GRAPHS"):
        env_choice("FLEXDSL_RECURRENT_GRAPHS")


@pytest.mark.parametrize("backend", SCANS)
def test_a_retained_graph_backpropagates_twice(backend):
    """Two losses of one forward (`retain_graph=True`), a Jacobian: each backward through the layer
    gets its own gradients (the sum of two backwards equals one backward of the summed losses);
    a second backward without a retained graph is PyTorch's error, not silent zeros."""
    torch.manual_seed(0)
    dtype = torch.float64 if backend != "triton" else torch.float32
    m = flexdsl.recurrent("lif", 3, 4, backend=backend).to(dtype)
    x = (2 * torch.randn(6, 2, 3)).to(dtype).requires_grad_()
    weights = torch.arange(4.0, dtype=dtype)

    def losses():
        m.reset()
        out = m(x)
        return out.sum(), (out * weights).sum()

    l1, l2 = losses()
    (l1 + l2).backward()
    want = (m.W_rec.grad.clone(), m.W_in.grad.clone(), x.grad.clone())
    assert want[0].abs().sum() > 0
    m.zero_grad()
    x.grad = None
    l1, l2 = losses()
    l1.backward(retain_graph=True)
    l2.backward()
    for a, b in zip((m.W_rec.grad, m.W_in.grad, x.grad), want):
        # two backwards summed against one backward of the sum: the same products in another
        # order, and one more addition per gradient
        assert_close(a, b, ops=layer_ops("lif", 6, 2, 3, 4) + 1)
    l1, _ = losses()
    l1.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        l1.backward()


# ----------------------------------------------------------------------------- what users change
@pytest.mark.parametrize("backend", SCANS)
def test_outputs_and_feedback_never_share_memory(backend):
    """Editing the returned spikes does not change the layer's next step, setting `feedback` does
    not rewrite outputs already returned, and with gradients an in-place op on the output works
    (as on any module's output) and backpropagates like its out-of-place form."""
    torch.manual_seed(2)
    r = flexdsl.recurrent("lif", None, 2, bias=False, backend=backend)
    with torch.no_grad():
        r.W_rec.copy_(torch.tensor([[0.0, 0.0], [5.0, 0.0]]))
    x, z = torch.tensor([[[3.0, 0.0]]]), torch.zeros(1, 1, 2)
    with torch.no_grad():
        r(x)
        assert r(z).tolist() == [[[0.0, 1.0]]]  # (neuron 0's spike reaches neuron 1)
        r.reset()
        y = r(x)
        y.zero_()
        assert r.feedback.tolist() == [[1.0, 0.0]] and r(z).tolist() == [[[0.0, 1.0]]]
        r.reset()
        y = r(x)
        r.feedback.fill_(7.0)
        assert y.tolist() == [[[1.0, 0.0]]]
    m = flexdsl.recurrent("lif", 3, 4, backend=backend)
    xx = torch.randn(5, 2, 3) * 3
    grads = []
    for inplace in (False, True):
        m.reset()
        m.zero_grad()
        out = m(xx)
        out = torch.nn.functional.relu(out * 2 - 1, inplace=inplace) if not inplace else out.mul_(2).sub_(1).relu_()
        out.sum().backward()
        grads.append(m.W_rec.grad.clone())
    assert_close(grads[0], grads[1], ops=layer_ops("lif", 5, 2, 3, 4))


@pytest.mark.parametrize("backend", SCANS)
def test_weights_replaced_by_another_shape_are_located_errors(backend):
    """A weight, bias or mask replaced after construction (`.data =`, a new Parameter, written in
    place) is checked at the call: a located error naming it and the shape the layer needs, before
    anything is computed (a kernel would read a smaller W_rec out of bounds; torch would broadcast)."""
    x = torch.randn(4, 2, 3)
    cases = [("one_to_one", "W_rec", lambda r: setattr(r.W_rec, "data", torch.tensor([5.0]))),
             ("all", "W_rec", lambda r: setattr(r, "W_rec", nn.Parameter(torch.randn(5, 5)))),
             ("all", "W_in", lambda r: setattr(r.W_in, "data", torch.randn(4, 2))),
             ("all", "bias", lambda r: setattr(r.bias, "data", torch.randn(4, 1, 4))),
             ("all", "mask", lambda r: setattr(r, "mask", torch.ones(3, 3))),
             ("all", "mask", lambda r: setattr(r, "mask", torch.full((4, 4), 0.5)))]
    for conn, name, change in cases:
        r = flexdsl.recurrent("lif", 3, 4, connectivity=conn, backend=backend,
                              mask=torch.ones(4, 4) if name == "mask" else None)
        r(x)
        with pytest.raises(FlexDSLError, match=f"`{name}`") as e:  # (a mask is refused when assigned)
            with torch.no_grad():
                change(r)
            r(x)
        assert ":" in str(e.value).splitlines()[0] and "^" in str(e.value), str(e.value)
    r = flexdsl.recurrent("lif", 3, 4, backend=backend, mask=torch.ones(4, 4))
    assert r.mask.dtype == torch.bool  # (no in-place write can make a mask rescale W_rec: it holds bools)
    with torch.no_grad():
        r.mask.fill_(0.5)
    assert bool(r.mask.all())


def test_autocast_with_float64_weights_is_a_located_error():
    for in_f in (4, None):
        r = flexdsl.recurrent("lif", in_f, 4).double()
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(FlexDSLError, match="float64"):
            r(torch.randn(5, 2, 4))
    r = flexdsl.recurrent("lif", 4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert r(torch.randn(5, 2, 4)).dtype == torch.bfloat16


def test_kept_feedback_of_another_batch_points_at_the_fed_back_output():
    r = flexdsl.recurrent("lif", 3, 4)
    r(torch.rand(2, 2, 3))
    with pytest.raises(FlexDSLError) as e:
        r(torch.rand(2, 3, 3))
    text = str(e.value)
    assert "lif.neuron:" in text and "output spike" in text and "reset()" in text


def test_generated_recurrent_code_quotes_the_right_lines():
    """A docstring holding characters `str.splitlines` splits at (U+2028, a form feed) does not shift
    the `# line N:` comments of the generated recurrent scans (torch, Triton) and CPU kernels."""
    from flexdsl.backends.cpu.emit import emit as emit_cpu
    from flexdsl.backends.torch.recurrent import emit_recurrent as emit_torch
    from flexdsl.backends.triton.recurrent import emit_recurrent as emit_triton

    src = ('neuron L:\n    """a\u2028b\x0cc"""\n    input x\n    param tau = 2.0 where tau > 1\n    state v = 0.0\n'
           '    update:\n        v = v + (x - v) / tau\n    spike when v >= 1.0 surrogate sigmoid(alpha=4.0)\n'
           '    on spike:\n        v = 0.0\n    output spike\n')
    c = flexdsl.recurrent(src, 3, 4)._view.compiled
    for code, mark in ((emit_torch(c)[0], "#"), (emit_triton(c, 0, 0)[0], "#"), (emit_cpu(c)[0], "//")):
        quoted = [ln.strip() for ln in code.split("\n") if "x - v" in ln and f"{mark} line" in ln]
        assert quoted and all(q.startswith(f"{mark} line 7: ") for q in quoted), quoted


# ----------------------------------------------------------------------------- fixed point, resident tiles
@needs_triton
def test_fixed_point_weights_recombine_within_the_stated_bound():
    """`split_fixed`: each row as four balanced int8 digits of a 31-bit integer of the row's binary
    range; the value they give is within half a unit of that range (2^-31 of 2^e, e the row's
    exponent, max|w| < 2^e) of the float32 weight, checked in float64 from the digits alone."""
    from flexdsl.backends.triton.products import split_fixed

    torch.manual_seed(3)
    w = torch.randn(9, 70) * torch.logspace(-30, 30, 9)[:, None]
    w[2] = 0.0
    w[3] = torch.randint(-64, 65, (70,)) / 128  # on a grid the fixed point holds exactly
    w[4, 5] = float("nan")
    w[5, 6] = float("inf")
    w[6] = 1e-41  # subnormal
    d, sc = split_fixed(w)
    assert d.dtype == torch.int8 and d.shape == (4, 9, 70) and sc.dtype == torch.float64
    q = sum(d[p].long() * 256 ** p for p in range(4))
    assert int(d[3].abs().max()) <= 64  # |q| <= 2^30: the top digit never overflows
    back = q.double() * sc[:, None]
    fin = torch.isfinite(w).all(1)
    assert fin.tolist() == [True] * 4 + [False] * 2 + [True] * 3
    assert torch.isnan(sc[~fin]).all()
    top = w.double().abs().amax(1)
    for r in torch.nonzero(fin & (top > 0)).flatten().tolist():
        e = int(torch.frexp(top[r]).exponent)  # top < 2^e
        assert (back[r] - w[r].double()).abs().max() <= 2.0 ** (e - 31), r
    assert torch.equal(back[3].float(), w[3]) and torch.equal(back[2], torch.zeros(70, dtype=torch.float64))


@needs_triton
def test_small_integer_check_flags_what_int8_cannot_hold():
    from flexdsl.backends.triton.products import to_bf16_exact

    assert to_bf16_exact(torch.tensor([0.0, 1.0, -127.0, 127.0, 3.0]), ints=True) is not None
    for bad in (0.5, 128.0, -128.5, float("inf"), float("nan"), 1e30):
        assert to_bf16_exact(torch.tensor([1.0, bad]), ints=True) is None, bad
    assert to_bf16_exact(torch.tensor([0.5, 2.0 ** 100]), ints=False) is not None  # (bfloat16 holds them)


def _spy_fixed(monkeypatch) -> list:
    import flexdsl.backends.triton.recurrent as tr

    calls: list = []
    real = tr.split_fixed
    monkeypatch.setattr(tr, "split_fixed", lambda w, *a: (calls.append(tuple(w.shape)), real(w, *a))[1])
    return calls


@needs_triton
@pytest.mark.parametrize("model, H, B, gain", [("if", 16, 1, 1), ("if", 40, 7, 1), ("alif", 24, 5, 32)])
def test_fixed_point_scan_equals_the_float64_scan(monkeypatch, model, H, B, gain):
    """The fixed-point recurrent products (FLEXDSL_RECURRENT_FIXED=1; the default on CUDA): with
    weights on a grid of 2^-7 every current of IF is exact in float32, so the spikes must equal
    the float64 torch scan's at every step (and the gradients within 1e-5) — the integer sums are
    exact, not merely close. ALIF (two states, a leak) likewise on this short sequence."""
    monkeypatch.setenv("FLEXDSL_RECURRENT_FIXED", "1")
    calls = _spy_fixed(monkeypatch)
    torch.manual_seed(11)
    T, IN = 25, 12
    m = flexdsl.recurrent(model, IN, H, backend="torch")
    with torch.no_grad():
        m.W_in.copy_(torch.randint(-16, 17, m.W_in.shape) / 128 * gain)
        m.W_rec.copy_(torch.randint(-24, 25, m.W_rec.shape) / 128 * gain)
        m.bias.copy_(torch.randint(-8, 9, m.bias.shape) / 128)
    x = (torch.rand(T, B, IN) < 0.3).float() * 4
    w = torch.randn(T, B, H)
    ref = _run(m.double(), x.double(), w.double())
    m = m.float()
    m.backend = "triton"
    got = _run(m, x, w)
    assert calls and calls[0] == (H, H)  # (the fixed-point path ran)
    ops = layer_ops(model, T, B, IN, H)  # float32 against float64: one side's roundings count twice
    assert int(ref[0][0].sum()) > 10
    for a, b in zip(got[0], ref[0]):
        assert torch.equal(a.double(), b) if a is got[0][0] else rel(a.double(), b) <= tol(torch.float32, ops)
    for k in ref[1]:
        assert rel(got[1][k].double(), ref[1][k]) <= tol(torch.float32, ops), k


@needs_triton
def test_fixed_point_scan_takes_the_float_path_for_fractional_feedback(monkeypatch):
    """Feedback given by hand with values int8 cannot hold (0.5) is not multiplied in fixed point:
    the scan takes the float32 path and still equals the float64 scan."""
    monkeypatch.setenv("FLEXDSL_RECURRENT_FIXED", "1")
    calls = _spy_fixed(monkeypatch)
    torch.manual_seed(12)
    T, B, IN, H = 10, 3, 6, 20
    m = flexdsl.recurrent("if", IN, H, backend="torch")
    with torch.no_grad():
        m.W_in.copy_(torch.randint(-16, 17, m.W_in.shape) / 128)
        m.W_rec.copy_(torch.randint(-24, 25, m.W_rec.shape) / 128)
    x = (torch.rand(T, B, IN) < 0.3).float() * 4
    s0 = (torch.rand(B, H) < 0.5).float() * 0.5
    md = copy.deepcopy(m).double()
    md.feedback = s0.double()
    ref = md(x.double())
    m.backend = "triton"
    m.feedback = s0.clone()
    got = m(x)
    assert calls == []
    assert torch.equal(got.double(), ref) and int(ref.sum()) > 5


@needs_triton
@pytest.mark.parametrize("fixed", ["0", "1"])
def test_resident_tile_equals_the_tile_loop_bit_for_bit(monkeypatch, fixed):
    """A program owning one tile keeps its states in registers and loads its input a step ahead
    (FLEXDSL_RECURRENT_RESIDENT, on by default): the same bits as loading and storing them every
    step, outputs and final states (ALIF: two states), forward and gradients."""
    monkeypatch.setenv("FLEXDSL_RECURRENT_FIXED", fixed)
    torch.manual_seed(13)
    T, B, IN, H = 15, 4, 7, 30
    m = flexdsl.recurrent("alif", IN, H, backend="triton")
    with torch.no_grad():
        m.W_in.mul_(6.0)
        m.W_rec.mul_(3.0)
    x = (torch.rand(T, B, IN) < 0.4).float()
    w = torch.randn(T, B, H)
    res = {}
    for resident in ("1", "0"):
        monkeypatch.setenv("FLEXDSL_RECURRENT_RESIDENT", resident)
        m.reset()
        res[resident] = _run(m, x, w)
    assert int(res["1"][0][0].sum()) > 5
    for a, b in zip(res["1"][0], res["0"][0]):
        assert torch.equal(a, b)
    for k in res["0"][1]:
        assert torch.equal(res["1"][1][k], res["0"][1][k]), k
    for k in res["0"][3]:
        assert torch.equal(res["1"][3][k], res["0"][3][k]), k


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("backend", SCANS)
def test_calls_leave_no_tensors_in_reference_cycles(backend):
    """A call's buffers are freed when the last reference goes, not when Python's cycle collector
    happens to run: no tensor of a call (training or not) ends in a reference cycle. (Such a cycle
    kept every call's activations alive on the GPU and made each call allocate afresh.)"""
    import gc

    m = flexdsl.recurrent("lif", 6, 16, backend=backend)
    x = (torch.rand(9, 3, 6) < 0.4).float()
    m(x).sum().backward()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    # Every object alive now is held until the end, so the garbage found below is made by this test's
    # calls alone (an earlier test's cycles, e.g. torch.compile's, may be dropped by a cache later).
    older = gc.get_objects()
    try:
        for grad in (False, True):
            m.reset()
            with torch.set_grad_enabled(grad):
                out = m(x)
                if grad:
                    out.sum().backward()
            del out
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            leaked = [tuple(o.shape) for o in gc.garbage if isinstance(o, torch.Tensor)]
            gc.garbage.clear()
            gc.set_debug(0)
            assert leaked == [], f"grad={grad}: tensors in reference cycles {leaked}"
    finally:
        gc.set_debug(0)
        del older
        if was:
            gc.enable()


@pytest.mark.parametrize("backend", SCANS)
def test_calls_without_gradients_keep_nothing_for_a_backward(monkeypatch, backend):
    """Under no_grad or inference_mode the scan runs its forward alone (an autograd Function would
    still see the weights needing gradients and save every step's state for nothing)."""
    from flexdsl.backends import layercall

    seen = []
    real = layercall.forward

    def spy(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, save, *rest):
        seen.append(save)
        return real(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, save, *rest)

    monkeypatch.setattr(layercall, "forward", spy)
    m = flexdsl.recurrent("alif", 5, 12, backend=backend)
    x = torch.rand(7, 2, 5) * 3
    with torch.no_grad():
        a = m(x)
    m.reset()
    with torch.inference_mode():
        b = m(x)
    m.reset()
    c = m(x)
    assert seen == [False, False, True]
    assert torch.equal(a, b) and torch.equal(a, c.detach())


@needs_triton
def test_bfloat16_input_product_kernel_is_autocasts_product():
    """`products.mm_bf16` (the layer's `W_in x + b` under autocast to bfloat16 on CUDA, without
    gradients): bfloat16 operands, float32 sums, one rounding to bfloat16 at the end — against the
    float64 product of the same bfloat16 operands, within one bfloat16 unit of the result (Triton's
    interpreter truncates where the GPU rounds to nearest) plus float32 summation; padding, no bias,
    empty shapes."""
    from flexdsl.backends.triton.products import mm_bf16

    torch.manual_seed(21)
    for M, K, N, bias in ((70, 700, 40, True), (33, 100, 17, False), (5, 3, 7, True), (64, 64, 32, True)):
        x = torch.randn(M, K).bfloat16().float()
        w = torch.randn(N, K).bfloat16().float()
        b = torch.randn(N).bfloat16().float() if bias else None
        got = mm_bf16(x, w, b)
        assert got.dtype == torch.bfloat16 and got.shape == (M, N)
        ref = x.double() @ w.double().T + (b.double() if bias else 0.0)
        bound = ref.abs() * 2.0 ** -7 + (x.abs().double() @ w.abs().double().T) * 2.0 ** -22
        assert ((got.double() - ref).abs() <= bound).all(), (M, K, N)
    assert mm_bf16(torch.zeros(0, 5), torch.zeros(3, 5), None).shape == (0, 3)
    assert torch.equal(mm_bf16(torch.zeros(2, 0), torch.zeros(3, 0), torch.tensor([1.0, 2.0, 3.0])).float(),
                       torch.tensor([[1.0, 2.0, 3.0]] * 2))
