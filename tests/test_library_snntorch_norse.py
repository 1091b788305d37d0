"""snnTorch- and Norse-derived library models against the installed snnTorch and Norse 1.1.0.

snnTorch neurons are driven with init_hidden=False (explicit state passing); Norse through
its functional feed-forward steps. Spikes must be exactly equal, state traces and input
gradients within 1e-5 (float32) where the surrogates are the same.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

import flexdsl

from tolerances import assert_close, layer_ops, module_condition, scan_ops, tol

warnings.filterwarnings("ignore")
import snntorch as snn  # noqa: E402
from norse.torch.functional.leaky_integrator import LIParameters, LIState, li_feed_forward_step  # noqa: E402
from norse.torch.functional.lif import LIFFeedForwardState, LIFParameters, lif_feed_forward_step  # noqa: E402
from norse.torch.functional.lif_box import LIFBoxFeedForwardState, LIFBoxParameters, lif_box_feed_forward_step  # noqa: E402
from norse.torch.functional.threshold import threshold as norse_threshold  # noqa: E402
from snntorch import surrogate as snn_surrogate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NEURONS = ROOT / "neurons"

DTYPES = [torch.float32, torch.float64]


def text_of(stem: str) -> str:
    return (NEURONS / f"{stem}.neuron").read_text()


_SURROGATE_CLAUSE = re.compile(r"(^\s+spike\s+when\b.*?\bsurrogate\s+)\w+\s*\([^)]*\)", re.M)


def with_surrogate(text: str, clause: str, definition: str | None = None) -> str:
    new, n = _SURROGATE_CLAUSE.subn(lambda m: m.group(1) + clause, text)
    assert n == 1
    if definition is not None:  # a user-defined surrogate, declared after the input line
        new, n = re.subn(
            r"^(    input .*)$", lambda m: m.group(1) + "\n    " + definition, new, count=1, flags=re.M
        )
        assert n == 1
    return new


def assert_grads_close(mine: torch.Tensor, ref: torch.Tensor, text: str, make, x, w, precision=None, **options):
    """The input gradient within the bound of T steps of the model's forward and backward
    (tests/tolerances.py), relative to max|grad|, amplified by the problem's condition.

    The generated code may sum terms in another order than the reference (e.g. snnTorch's
    `beta*mem + syn - reset*threshold`), so float32 states differ in the last bits, and a steep
    surrogate (fast_sigmoid(slope=25)) turns that into larger gradient differences: the condition
    (`module_condition`, float64) measures that amplification."""
    cond = module_condition(make, x, w)
    assert_close(mine, ref.to(mine.dtype), ops=scan_ops(text, x.shape[0], **options), cond=cond, precision=precision,
                 what="x.grad")


def assert_states_close(mine: torch.Tensor, ref: torch.Tensor, text: str, T: int, **options):
    """A state after (at most) T steps: T forward steps' roundings."""
    assert_close(mine, ref.to(mine.dtype), ops=scan_ops(text, T, backward=False, **options), what="state")


def assert_same_spikes(mine: torch.Tensor, ref: torch.Tensor):
    assert mine.shape == ref.shape
    bad = (mine.to(ref.dtype) != ref).nonzero()
    assert bad.numel() == 0, f"{len(bad)} spikes differ, first at {bad[:3].tolist()}"
    rate = ref.double().mean().item()
    assert 0.03 < rate < 0.97, f"degenerate spike rate {rate}"


# ---------------------------------------------------------------------------------------------
# snnTorch
# ---------------------------------------------------------------------------------------------

SNN_SURROGATES = {
    # name: (snnTorch spike_grad factory or None for the default, .neuron clause)
    "default": (lambda: None, None),  # the file's own clause vs snnTorch's default (atan, alpha=2)
    "atan": (lambda: snn_surrogate.atan(alpha=2.0), "atan(alpha=2.0)"),
    "atan_alpha3": (lambda: snn_surrogate.atan(alpha=3.0), "atan(alpha=3.0)"),
    "fast_sigmoid": (lambda: snn_surrogate.fast_sigmoid(slope=25), "fast_sigmoid(slope=25.0)"),
    "sigmoid": (lambda: snn_surrogate.sigmoid(slope=5), "sigmoid(alpha=5.0)"),
}


def P(value, dtype):
    return torch.tensor(value, dtype=dtype)


def _snn_loop(neuron, x, n_states):
    states = [torch.zeros_like(x[0]) for _ in range(n_states)]
    spikes, traces = [], [[] for _ in range(n_states)]
    for t in range(x.shape[0]):
        spk, *states = neuron(x[t], *states)
        spikes.append(spk)
        for k, s in enumerate(states):
            traces[k].append(s)
    return torch.stack(spikes), [torch.stack(tr) for tr in traces]


SNN_CASES = {
    # id: (stem, snnTorch constructor(spike_grad), flexdsl overrides, number of states, input scale)
    # snnTorch stores its parameters as tensors of the dtype it is given (float32 for Python floats):
    # they are built in the test's dtype (P(value, dtype)) so that float64 runs compare float64 models.
    "leaky": (
        "snn_leaky",
        lambda sg, dt: snn.Leaky(beta=P(0.9, dt), threshold=P(1.0, dt), spike_grad=sg),
        {},
        1,
        0.5,
    ),
    "leaky_beta07_thr15": (
        "snn_leaky",
        lambda sg, dt: snn.Leaky(beta=P(0.7, dt), threshold=P(1.5, dt), spike_grad=sg),
        dict(beta=0.7, threshold=1.5),
        1,
        1.2,
    ),
    "synaptic": (
        "snn_synaptic",
        lambda sg, dt: snn.Synaptic(alpha=P(0.9, dt), beta=P(0.8, dt), threshold=P(1.0, dt), spike_grad=sg),
        {},
        2,
        0.25,
    ),
    "synaptic_a05_b095": (
        "snn_synaptic",
        lambda sg, dt: snn.Synaptic(alpha=P(0.5, dt), beta=P(0.95, dt), threshold=P(1.0, dt), spike_grad=sg),
        dict(alpha=0.5, beta=0.95),
        2,
        0.25,
    ),
    "leaky_zero": (
        "snn_leaky_zero",
        lambda sg, dt: snn.Leaky(
            beta=P(0.9, dt), threshold=P(1.0, dt), spike_grad=sg, reset_mechanism="zero"
        ),
        {},
        1,
        0.6,
    ),
    "lapicque": (
        "lapicque",
        lambda sg, dt: snn.Lapicque(
            R=P(1.0, dt), C=P(1.44, dt), time_step=P(1.0, dt), threshold=P(1.0, dt), spike_grad=sg
        ),
        {},
        1,
        3.0,
    ),
    "lapicque_tutorial": (
        "lapicque",
        lambda sg, dt: snn.Lapicque(
            R=P(5.1, dt), C=P(5e-3, dt), time_step=P(1e-3, dt), threshold=P(1.0, dt), spike_grad=sg
        ),
        dict(R=5.1, C=5e-3, time_step=1e-3),
        1,
        2.0,
    ),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("sg", sorted(SNN_SURROGATES))
@pytest.mark.parametrize("case", sorted(SNN_CASES))
def test_matches_snntorch(case, sg, dtype):
    stem, make, overrides, n_states, scale = SNN_CASES[case]
    snn_sg, clause = SNN_SURROGATES[sg]
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(32, 4, 8, generator=g, dtype=torch.float64) * scale).to(dtype)

    ref = make(snn_sg(), dtype)
    text = text_of(stem) if clause is None else with_surrogate(text_of(stem), clause)
    m = flexdsl.loads(text, step_mode="m", backend="torch", **overrides)

    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    s_ref, traces_ref = _snn_loop(ref, xr, n_states)
    out = m(xm)
    assert isinstance(out, tuple) and len(out) == 1 + n_states, "outputs: spike then the states, as snnTorch"
    s_m, traces_m = out[0], list(out[1:])

    assert_same_spikes(s_m, s_ref)
    for tm, tr in zip(traces_m, traces_ref):
        assert tm.dtype == dtype
        assert_states_close(tm, tr, text, x.shape[0])

    w = [torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(1 + n_states)]
    loss_ref = sum((a * b).sum() for a, b in zip([s_ref, *traces_ref], w))
    loss_m = sum((a * b).sum() for a, b in zip([s_m, *traces_m], w))
    loss_ref.backward()
    loss_m.backward()
    # snnTorch's spikes are float32 whatever the input dtype ((x > 0).float()), so the gradient reaching
    # its surrogate is rounded to float32: float64 runs are compared to float32 accuracy here.
    assert_grads_close(xm.grad, xr.grad, text, lambda **kw: flexdsl.loads(text, backend="torch", **{**overrides, **kw}), x, w,
                       precision=torch.float32)


def test_snn_leaky_reset_is_delayed_and_detached():
    """A hand-made check of snnTorch's reset convention: the threshold is subtracted one step after
    the membrane exceeded it, and the spike-to-reset path carries no gradient."""
    x = torch.tensor([[1.5], [0.0], [0.0]])
    m = flexdsl.load("snn_leaky", beta=0.5, backend="torch")
    spk, mem = m(x)
    assert spk[:, 0].tolist() == [1.0, 0.0, 0.0]
    # mem: 1.5; then 0.5*1.5 + 0 - 1 (reset from step 0) = -0.25; then -0.125
    assert mem[:, 0].tolist() == [1.5, -0.25, -0.125]  # (exact in binary: every operation is exact)


# ---------------------------------------------------------------------------------------------
# Norse 1.1.0
# ---------------------------------------------------------------------------------------------


def test_norse_super_surrogate_ignores_alpha():
    """Guard on the reference fact the norse_lif file relies on: in Norse 1.1.0, threshold(x, "super",
    alpha) back-propagates 1/(|x| + 1)^2 whatever alpha is (so fast_sigmoid(slope=1), not slope=alpha)."""
    x = torch.linspace(-2, 2, 41, dtype=torch.float64, requires_grad=True)
    norse_threshold(x, "super", 100.0).sum().backward()
    assert_close(x.grad, 1 / (x.detach().abs() + 1) ** 2, ops=4)  # abs, add, square, divide


def _norse_lif(x, p, dt=1e-3):
    state = LIFFeedForwardState(v=torch.zeros_like(x[0]) + p.v_leak, i=torch.zeros_like(x[0]))
    zs, vs, is_ = [], [], []
    for t in range(x.shape[0]):
        z, state = lif_feed_forward_step(x[t], state, p, dt=dt)
        zs.append(z)
        vs.append(state.v)
        is_.append(state.i)
    return torch.stack(zs), torch.stack(vs), torch.stack(is_)


def _lif_params(dtype, **kw):
    """Norse LIFParameters with every tensor field in `dtype` (Norse's defaults are float32 tensors)."""
    fields = ("tau_syn_inv", "tau_mem_inv", "v_leak", "v_th", "v_reset", "alpha")
    p = LIFParameters(**{k: v for k, v in kw.items() if k not in fields})
    return p._replace(
        **{
            k: torch.tensor(kw[k], dtype=dtype) if k in kw else torch.as_tensor(getattr(p, k)).to(dtype)
            for k in fields
        }
    )


NORSE_LIF_CASES = {
    "defaults": ({}, {}, 1e-3, 0.8),
    "custom": (
        dict(tau_syn_inv=100.0, tau_mem_inv=50.0, v_leak=0.1, v_th=0.8, v_reset=-0.2),
        dict(tau_syn_inv=100.0, tau_mem_inv=50.0, v_leak=0.1, v_th=0.8, v_reset=-0.2),
        2e-3,
        0.6,
    ),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", sorted(NORSE_LIF_CASES))
def test_norse_lif_matches_norse(case, dtype):
    kw, overrides, dt, scale = NORSE_LIF_CASES[case]
    p = _lif_params(dtype, **kw)
    g = torch.Generator().manual_seed(12)
    x = (torch.rand(40, 4, 8, generator=g, dtype=torch.float64) * scale).to(dtype)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    z_ref, v_ref, i_ref = _norse_lif(xr, p, dt)
    m = flexdsl.load("norse_lif", dt=dt, backend="torch", store_state_seqs=True, **overrides)
    z_m = m(xm)
    assert_same_spikes(z_m, z_ref)
    for mine, ref in ((m.state_seqs["v"], v_ref), (m.state_seqs["i"], i_ref), (m.v, v_ref[-1])):
        assert_states_close(mine, ref, "norse_lif", x.shape[0])
    w = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    (z_ref * w).sum().backward()
    (z_m * w).sum().backward()
    assert_grads_close(xm.grad, xr.grad, "norse_lif", lambda **kw: flexdsl.load("norse_lif", backend="torch", **{"dt": dt, **overrides, **kw}), x, w)


@pytest.mark.parametrize(
    "method,alpha,clause,definition",
    [
        (
            "triangle",
            0.3,
            "norse_triangle(alpha=0.3)",
            "surrogate norse_triangle(u, alpha=0.3) = alpha * relu(1 - abs(u))",
        ),
        ("tanh", 2.0, "norse_tanh(k=2.0)", "surrogate norse_tanh(u, k=2.0) = 1 - tanh(k * u)**2"),
    ],
)
@pytest.mark.parametrize("form", ["builtin", "user"])
def test_norse_lif_other_norse_surrogates(method, alpha, clause, definition, form):
    """Norse's other surrogates: flexdsl's built-ins `norse_triangle`/`norse_tanh`, and the same
    formulas written as user surrogates (`surrogate name(u, ...) = S'(u)`)."""
    if form == "builtin":
        definition = None
    p = _lif_params(torch.float32, method=method, alpha=alpha)
    g = torch.Generator().manual_seed(13)
    x = torch.rand(40, 4, 8, generator=g) * 0.8
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    z_ref, _, _ = _norse_lif(xr, p)
    m = flexdsl.loads(with_surrogate(text_of("norse_lif"), clause, definition), backend="torch")
    z_m = m(xm)
    assert_same_spikes(z_m, z_ref)
    w = torch.randn(x.shape, generator=g)
    (z_ref * w).sum().backward()
    (z_m * w).sum().backward()
    text = with_surrogate(text_of("norse_lif"), clause, definition)
    assert_grads_close(xm.grad, xr.grad, text, lambda **kw: flexdsl.loads(text, backend="torch", **kw), x, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_li_matches_norse(dtype):
    p = LIParameters(*(torch.as_tensor(f).to(dtype) for f in LIParameters()))
    g = torch.Generator().manual_seed(14)
    x = (torch.randn(40, 4, 8, generator=g, dtype=torch.float64)).to(dtype)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    state = LIState(v=torch.zeros_like(x[0]), i=torch.zeros_like(x[0]))
    vs = []
    for t in range(x.shape[0]):
        v, state = li_feed_forward_step(xr[t], state, p, dt=1e-3)
        vs.append(v)
    v_ref = torch.stack(vs)
    m = flexdsl.load("li", backend="torch")
    v_m = m(xm)
    assert v_m.dtype == dtype
    assert_states_close(v_m, v_ref, "li", x.shape[0])
    assert_states_close(m.i, state.i, "li", x.shape[0])
    w = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    (v_ref * w).sum().backward()
    (v_m * w).sum().backward()
    assert_grads_close(xm.grad, xr.grad, "li", lambda **kw: flexdsl.load("li", backend="torch", **kw), x, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_norse_lif_box_matches_norse(dtype):
    p = LIFBoxParameters()
    p = p._replace(
        **{k: torch.as_tensor(getattr(p, k)).to(dtype) for k in ("tau_mem_inv", "v_leak", "v_th", "v_reset")}
    )
    g = torch.Generator().manual_seed(15)
    x = (torch.rand(40, 4, 8, generator=g, dtype=torch.float64) * 3).to(dtype)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    state = LIFBoxFeedForwardState(v=torch.zeros_like(x[0]))
    zs, vs = [], []
    for t in range(x.shape[0]):
        z, state = lif_box_feed_forward_step(xr[t], state, p, dt=1e-3)
        zs.append(z)
        vs.append(state.v)
    z_ref, v_ref = torch.stack(zs), torch.stack(vs)
    m = flexdsl.load("norse_lif_box", backend="torch", store_state_seqs=True)
    z_m = m(xm)
    assert_same_spikes(z_m, z_ref)
    assert_states_close(m.state_seqs["v"], v_ref, "norse_lif_box", x.shape[0])
    w = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    (z_ref * w).sum().backward()
    (z_m * w).sum().backward()
    assert_grads_close(xm.grad, xr.grad, "norse_lif_box", lambda **kw: flexdsl.load("norse_lif_box", backend="torch", **kw), x, w)


# ---------------------------------------------------------------------------------------------
# Recurrent layers (issue 37): the library models of snnTorch's RLeaky/RSynaptic and Norse's
# LIFRecurrent, as `flexdsl.recurrent(model, in_features, hidden)`, against the layers themselves
# ---------------------------------------------------------------------------------------------


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


R_SNN_CASES = {
    # id: (stem, snnTorch layer(hidden, spike_grad), number of states, input scale, recurrent gain)
    "rleaky": ("snn_rleaky", lambda H, sg: snn.RLeaky(beta=0.9, linear_features=H, spike_grad=sg), 1, 1.0, 2.0),
    "rleaky_zero": ("snn_rleaky_zero", lambda H, sg: snn.RLeaky(beta=0.9, linear_features=H, spike_grad=sg,
                                                                 reset_mechanism="zero"), 1, 1.0, 2.0),
    "rsynaptic": ("snn_rsynaptic", lambda H, sg: snn.RSynaptic(alpha=0.9, beta=0.8, linear_features=H, spike_grad=sg),
                  2, 0.4, 1.0),
}


@pytest.mark.parametrize("sg", ["default", "fast_sigmoid"])
@pytest.mark.parametrize("case", sorted(R_SNN_CASES))
def test_recurrent_library_models_equal_snntorch_layers(case, sg):
    """`flexdsl.recurrent("snn_rleaky", I, H)` (and `snn_rleaky_zero`, `snn_rsynaptic`) with the same
    weights equals snnTorch's RLeaky(all_to_all=True, linear_features=H) (RSynaptic) fed by a Linear:
    spikes exactly, the states and the gradients of W_in, W_rec, the bias and x to the bound of
    summing in another order (float32: snnTorch's spikes are float32 whatever the dtype)."""
    stem, make, n_states, scale, gain = R_SNN_CASES[case]
    spike_grad = None if sg == "default" else snn_surrogate.fast_sigmoid(slope=5)
    torch.manual_seed(21)
    T, B, I, H = 25, 4, 6, 12
    ref = make(H, spike_grad)
    with torch.no_grad():
        ref.recurrent.weight.mul_(gain)
    fc = torch.nn.Linear(I, H)
    x = torch.rand(T, B, I) * scale
    xr = x.clone().requires_grad_()
    cur = fc(xr)
    states, outs = ref.reset_mem(), []
    for t in range(T):
        states = ref(cur[t], *states)
        outs.append(states)
    ref_outs = [torch.stack([o[k] for o in outs]) for k in range(1 + n_states)]

    m = flexdsl.recurrent(stem, I, H, backend="torch", surrogate=spike_grad)
    with torch.no_grad():
        m.W_in.copy_(fc.weight)
        m.bias.copy_(fc.bias + ref.recurrent.bias)  # snnTorch adds its recurrent Linear's bias every step
        m.W_rec.copy_(ref.recurrent.weight)
    xo = x.clone().requires_grad_()
    mine = m(xo)
    assert isinstance(mine, tuple) and len(mine) == 1 + n_states
    assert_same_spikes(mine[0], ref_outs[0])
    bound = tol(torch.float32, layer_ops(stem, T, B, I, H))  # (tests/tolerances.py)
    for a, b in zip(mine[1:], ref_outs[1:]):
        assert _rel(a.detach(), b.detach()) < bound
    g = [torch.randn_like(o) for o in ref_outs]
    sum((o * w).sum() for o, w in zip(ref_outs, g)).backward()
    sum((o * w).sum() for o, w in zip(mine, g)).backward()
    for name, a, b in [("W_in", m.W_in.grad, fc.weight.grad), ("W_rec", m.W_rec.grad, ref.recurrent.weight.grad),
                       ("bias", m.bias.grad, fc.bias.grad), ("bias", m.bias.grad, ref.recurrent.bias.grad),
                       ("x", xo.grad, xr.grad)]:
        assert b.abs().max() > 0, f"{name}: the reference gradient is zero (a test that cannot fail)"
        assert _rel(a, b) < bound, f"{name}: relative error {_rel(a, b):.2e} (bound {bound:.1e})"


@pytest.mark.parametrize("autapses", [False, True])
def test_norse_lif_recurrent_equals_norse_lif_recurrent(autapses):
    """`flexdsl.recurrent("norse_lif_recurrent", I, H, bias=False, mask=1 - eye)` equals Norse's
    LIFRecurrent(I, H) with the same weights (float64): spikes exactly, final states and the
    gradients of the weights and the input to the bound of summing in another order; with
    autapses=True, no mask. `norse_lif`, whose reset is not detached, does not (the gradients
    differ): the model's `where` reset is what makes it Norse's."""
    from norse.torch import LIFRecurrent

    torch.manual_seed(22)
    T, B, I, H = 30, 3, 5, 10
    # (Norse's default LIFParameters are float32 tensors: dt * tau_mem_inv would be rounded to float32)
    ref = LIFRecurrent(I, H, p=_lif_params(torch.float64), autapses=autapses).double()
    with torch.no_grad():
        ref.input_weights.mul_(30.0)
        ref.recurrent_weights.mul_(30.0)
    x = torch.rand(T, B, I, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    z_ref, state = ref(xr)
    g = torch.randn_like(z_ref)
    (z_ref * g).sum().backward()
    mask = None if autapses else 1 - torch.eye(H)
    bound = tol(torch.float64, layer_ops("norse_lif_recurrent", T, B, I, H))

    def run(stem):
        m = flexdsl.recurrent(stem, I, H, bias=False, mask=mask, backend="torch").double()
        with torch.no_grad():
            m.W_in.copy_(ref.input_weights)
            m.W_rec.copy_(ref.recurrent_weights)
        xo = x.clone().requires_grad_()
        z = m(xo)
        (z * g).sum().backward()
        return m, z, xo

    m, z, xo = run("norse_lif_recurrent")
    assert_same_spikes(z, z_ref)
    assert _rel(m.neuron.v.detach(), state.v.detach()) < bound and _rel(m.neuron.i.detach(), state.i.detach()) < bound
    assert torch.equal(m.feedback, state.z)
    if not autapses:
        assert torch.all(m.W_rec.grad.diagonal() == 0)
    for name, a, b in [("W_in", m.W_in.grad, ref.input_weights.grad), ("W_rec", m.W_rec.grad, ref.recurrent_weights.grad),
                       ("x", xo.grad, xr.grad)]:
        assert b.abs().max() > 0, f"{name}: the reference gradient is zero (a test that cannot fail)"
        assert _rel(a, b) < bound, f"{name}: relative error {_rel(a, b):.2e} (bound {bound:.1e})"
    other, z2, _ = run("norse_lif")
    assert torch.equal(z2, z_ref) and _rel(other.W_rec.grad, ref.recurrent_weights.grad) > 1e3 * bound
