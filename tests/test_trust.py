"""Issue 18, "no silent wrong numbers": every class of failure found by an attacker's and a
numerical analyst's audit, each pinned by a test that fails without its fix. Caches may change
speed, never results; a refused change changes nothing; every user error is a located
`FlexDSLError`. (Triton runs through its interpreter here, as in CI.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import flexdsl
from flexdsl import backends

from tolerances import assert_close, scan_ops

ROOT = Path(__file__).resolve().parent.parent

TWO_INPUTS = """neuron TwoIn:
    input x, y
    param a = 0.5
    state v = 0.0
    update:
        v = a * v + x - 2 * y
    output v
"""

TWO_OUTPUTS = """neuron TwoOut:
    input x
    param tau = 2.0
    state v = 0.0
    update:
        v = v + (x - v) / tau
    spike when v >= 0.6 surrogate sigmoid(alpha=4.0)
    on spike:
        v = 0.0
    output spike, v
"""


def _pair(text: str, **kw):
    return flexdsl.loads(text, backend="triton", **kw), flexdsl.loads(text, backend="torch", **kw)


# ---------------------------------------------------------------- caches: keyed on what determines them
def test_a_call_with_one_tensor_in_two_input_slots_does_not_poison_later_calls():
    """The launch plan recorded by m(a, a) must not answer m(a, b) with f(b, b), in this module
    or in another module of the same model text."""
    tri, ref = _pair(TWO_INPUTS)
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(5, 8, generator=g), torch.rand(5, 8, generator=g)
    ops = scan_ops(TWO_INPUTS, 5, backward=False)
    assert_close(tri(a, a), ref(a, a), ops=ops)
    for m in (tri, flexdsl.loads(TWO_INPUTS, backend="triton")):
        m.reset()
        ref.reset()
        assert_close(m(a, b), ref(a, b), ops=ops)
        m.reset()
        ref.reset()
        assert_close(m(b, a), ref(b, a), ops=ops)


def test_one_gradient_tensor_for_two_outputs_does_not_poison_later_backwards():
    """Autograd hands one gradient tensor to both outputs for ((s + v) * c).sum(); a later,
    different loss must get its own input gradients."""
    g = torch.Generator().manual_seed(1)
    x0 = torch.rand(6, 16, generator=g) * 1.5
    c = torch.rand(6, 16, generator=g)
    c1, c2 = torch.rand(6, 16, generator=g), torch.rand(6, 16, generator=g)
    grads = {}
    for backend in ("triton", "torch"):
        m = flexdsl.loads(TWO_OUTPUTS, backend=backend)
        out = []
        for loss in (lambda s, v: ((s + v) * c).sum(), lambda s, v: (s * c1 + v * c2).sum(),
                     lambda s, v: (v * c2).sum()):
            x = x0.clone().requires_grad_()
            m.reset()
            s, v = m(x)
            loss(s, v).backward()
            out.append(x.grad)
        grads[backend] = out
    for t, r in zip(grads["triton"], grads["torch"]):
        assert_close(t, r, ops=scan_ops(TWO_OUTPUTS, 6))


def test_caches_tell_zero_from_negative_zero():
    """A signed zero is a different value: cached initial values, derived params and launch
    plans keyed by float equality would answer -0.0 with what 0.0 gave."""
    text = """neuron Z:
    input x
    param c = 0.0
    state v = c
    update:
        v = v * 2 + x
    output v
"""
    x = torch.full((3, 4), -0.0)  # (-0.0 + -0.0 is -0.0; 0.0 + -0.0 is 0.0)
    for backend in ("torch", "triton"):
        m = flexdsl.loads(text, backend=backend)
        assert not torch.signbit(m(x)).any()
        for c in (-0.0, 0.0, -0.0):
            m.reset()
            m.c = c
            assert bool(torch.signbit(m(x)).all()) == (str(c) == "-0.0"), (backend, c)


# ---------------------------------------------------------------- gradients: correct, or a clear error
LEARNABLE = """neuron P:
    input x
    param tau = 2.0 where tau > 1 learnable
    param dt = 1.0
    state v = 0.0
    equations method exponential_euler:
        dv/dt = (x - v) / tau - x * x * v
    spike when v >= 0.8 surrogate sigmoid(alpha=4.0)
    on spike:
        v = 0.0
    output spike, v
"""


SMOOTH = LEARNABLE.replace("neuron P:", "neuron Smooth:").split("    spike when")[0] + "    output v\n"


def _first_order(m, x):
    # (`tau > 1` learnable trains as tau = 1 + softplus(raw_tau): the Parameter is raw_tau)
    v = m(x)
    (g,) = torch.autograd.grad((v * v * x).sum(), m.raw_tau, create_graph=True)
    return g


def test_second_order_gradients_are_correct_on_torch_and_refused_on_triton():
    """Double backward through a learnable param: the torch backend's equals a central finite
    difference of its first-order gradient (float64); the Triton kernels' backward is not
    differentiable, so create_graph=True through them is a located error, never zeros. (A
    model without a spike: finite differences see a spike as a step, autograd as its surrogate.)"""
    x = torch.linspace(-0.5, 1.5, 24, dtype=torch.float64).reshape(6, 4)
    m = flexdsl.loads(SMOOTH, backend="torch").double()
    g = _first_order(m, x)
    (g2,) = torch.autograd.grad(g, m.raw_tau)
    h, raw = 1e-5, m.raw_tau.item()
    fd = []
    for r in (raw + h, raw - h):
        m.reset()
        with torch.no_grad():
            m.raw_tau.fill_(r)
        fd.append(_first_order(m, x).item())
    with torch.no_grad():
        m.raw_tau.fill_(raw)
    assert abs(g2.item() - (fd[0] - fd[1]) / (2 * h)) < 1e-6 * max(1.0, abs(g2.item()))
    assert g2.item() != 0.0
    from flexdsl import backends

    for kernels in [b for b in ("triton", "cpu") if b in backends.names() and backends.get(b).available()]:
        tri = flexdsl.loads(SMOOTH, backend=kernels)
        with pytest.raises(flexdsl.FlexDSLError, match="second-order"):
            _first_order(tri, x.float())
        tri.reset()
        v = tri(x.float())  # first order still works, and equals the torch backend's
        (g1,) = torch.autograd.grad((v * v * x.float()).sum(), tri.raw_tau)
        m.reset()
        # float32 kernels against the float64 torch backend: 6 steps, the gradient summed over x
        assert_close(g1, _first_order(m, x).detach(), ops=scan_ops(SMOOTH, 6, x.numel()), precision=torch.float32)


def test_torch_func_transforms_work_on_the_torch_backend():
    """grad, vmap, jacrev and jvp of a flexdsl layer equal plain autograd and a loop (the
    spike's surrogate is its derivative in both modes); on the Triton kernels a transform is a
    clear error, and backend='auto' takes the torch path."""
    from torch.func import functional_call, grad, jacrev, jvp, vmap

    m = flexdsl.loads(LEARNABLE, backend="torch").double()
    x = torch.linspace(-0.5, 1.5, 12, dtype=torch.float64).reshape(4, 3)

    def loss(params, x):
        s, v = functional_call(m, params, (x,))
        m.reset()
        return (s * x + v).sum()

    params = {"tau": m.tau.detach().clone()}
    gf = grad(loss, argnums=(0, 1))(params, x)
    xr = x.clone().requires_grad_()
    s, v = m(xr)
    m.reset()
    (s * xr + v).sum().backward()
    torch.testing.assert_close(gf[1], xr.grad)
    # functional_call's `tau` is used as given; the module trains tau = 1 + softplus(raw_tau)
    torch.testing.assert_close(gf[0]["tau"], m.raw_tau.grad / torch.sigmoid(m.raw_tau.detach()))

    def volts(xx):
        out = m.step(xx, state=None)[0][1]
        return out

    batched = vmap(volts, in_dims=1, out_dims=1)(x)
    loop = torch.stack([volts(x[:, i]) for i in range(3)], dim=1)
    torch.testing.assert_close(batched, loop)
    jac = jacrev(volts)(x)
    ref = torch.autograd.functional.jacobian(volts, x)
    torch.testing.assert_close(jac, ref)
    tangent = torch.rand(4, 3, dtype=torch.float64)
    _, fwd = jvp(volts, (x,), (tangent,))
    torch.testing.assert_close(fwd, (ref.reshape(12, 12) @ tangent.reshape(12)).reshape(4, 3))

    vmap(lambda xx: m(xx)[1], in_dims=1, out_dims=1)(x)  # keeps a batched state...
    with pytest.raises(flexdsl.FlexDSLError, match="vmap"):
        m(x)  # ...which a call outside vmap cannot use: a clear error, not functorch's
    m.reset()
    m(x)
    tri = flexdsl.loads(LEARNABLE, backend="triton")
    with pytest.raises(flexdsl.FlexDSLError, match="torch.func"):
        grad(lambda xx: tri(xx)[1].sum())(x.float())
    auto = flexdsl.loads(LEARNABLE, backend="auto")
    assert_close(grad(lambda xx: auto(xx)[1].sum())(x.float()),
                 torch.func.grad(lambda xx: m.step(xx, None)[0][1].sum())(x), ops=scan_ops(LEARNABLE, 4))


# ---------------------------------------------------------------- params: validated fully, then committed
def _snapshot(m) -> dict:
    out = {}
    for k, v in m.param_values().items():
        out[k] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    return out


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


# a step that is undefined for some finite params (exp(dt / tau) overflows)
INVARIANT = """neuron Inv:
    input x
    param tau = 2.0 where tau > 0
    param dt = 1.0
    param g = 1.0 learnable
    param w = 0.5
    state v = 0.0
    state u = 0.0
    update:
        v = v * exp(dt / tau) + g * w * x
        u = u * exp(dt / tau) + x
    output v
"""


@pytest.mark.parametrize("shapes", [None, {"w": (3,)}, {"g": (3,)}])
def test_a_refused_assignment_changes_nothing(shapes):
    m = flexdsl.loads(INVARIANT, param_shapes=shapes or {})
    before = _snapshot(m)
    bad = {"tau": [0.0, -1.0, float("nan"), 1e-3, "x", None, True, torch.tensor([1.0, -2.0, 3.0]), 10 ** 400],
           "dt": [float("inf"), 1e6, torch.tensor(float("nan")), torch.tensor([1 + 2j])],
           "g": [float("nan"), torch.tensor([True]), torch.zeros(0), torch.ones(4)],
           "w": [float("-inf"), torch.tensor([0.5, float("nan"), 0.5]), torch.zeros(0), "1e999"]}
    for name, values in bad.items():
        for v in values:
            with pytest.raises(flexdsl.FlexDSLError) as e:
                setattr(m, name, v)
            assert e.value.line, e.value  # located at the param or the statement
            assert _same(before, _snapshot(m)), (name, v)
    x = torch.ones(2, 3)
    assert torch.equal(m(x), flexdsl.loads(INVARIANT, param_shapes=shapes or {})(x))  # (the same program and values)


def test_a_refused_checkpoint_changes_nothing():
    m = flexdsl.loads(INVARIANT)
    good = m.state_dict()
    m.tau = 3.0
    before = _snapshot(m)
    cases = []
    for name, value in [("tau", float("inf")), ("dt", float("nan")), ("tau", 1e-3), ("tau", -2.0)]:
        sd = m.state_dict()
        sd["_extra_state"] = {**sd["_extra_state"], "params": {**sd["_extra_state"]["params"], name: value}}
        cases.append(sd)
    for g in (float("nan"), float("inf")):
        sd = dict(good)
        sd["g"] = torch.tensor(g)
        cases.append(sd)
    sd = dict(good)
    sd["g"] = torch.tensor(True)
    cases.append(sd)
    for sd in cases:
        with pytest.raises(flexdsl.FlexDSLError):
            m.load_state_dict(sd)
        assert _same(before, _snapshot(m))
    m.load_state_dict(good)
    assert m.tau == 2.0


def _everything(m) -> dict:
    """What a refused change must leave as it was: every param's value, every Parameter (the same
    object, its value, shape and dtype), buffer and float param."""
    out = {f"value:{k}": v for k, v in _snapshot(m).items()}
    out |= {f"param:{k}": (id(p), p.detach().clone()) for k, p in m.named_parameters()}
    out |= {f"buffer:{k}": b.clone() for k, b in m.named_buffers()}
    return out | {f"float:{k}": v for k, v in m._fixed.items()}


def _unchanged(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, tuple):
            if x[0] != y[0]:
                return False
            x, y = x[1], y[1]
        if not _same({k: x}, {k: y}):
            return False
    return True


def _bad_checkpoints(m, leaky) -> list[tuple]:
    """(module, checkpoint) pairs of several params, one of them refused: a raw value that is NaN,
    per-channel values whose shapes clash, a value on its bound (a closed one, which the
    constraint allows) beside a raw value of another shape (which loading would reshape), values
    that violate a constraint."""
    good, lgood = m.state_dict(), leaky.state_dict()
    f64 = torch.float64
    return [(m, good | {"raw_tau": torch.tensor(float("nan"), dtype=f64)}),
            (m, good | {"raw_tau": torch.full((2,), 0.5, dtype=f64), "raw_v_reset": torch.full((3,), 0.5, dtype=f64)}),
            (m, {k: v for k, v in good.items() if k != "raw_tau"} | {"tau": torch.tensor(0.5)}),
            (m, {k: v for k, v in good.items() if k != "raw_v_reset"} | {"v_reset": torch.ones(3) * 2}),
            (leaky, {k: v for k, v in lgood.items() if k != "raw_beta"} |
             {"beta": torch.tensor(1.0), "raw_threshold": torch.full((3,), 0.5, dtype=f64)}),
            (leaky, lgood | {"raw_threshold": torch.full((3,), 0.5, dtype=f64),
                             "raw_beta": torch.full((2,), 0.5, dtype=f64)})]


def test_a_refused_change_of_any_kind_of_param_changes_nothing():
    """Every kind of param (float, buffer, per-channel, unbounded and bounded learnable, one that a
    torch tool took over) and several params at once (load_state_dict, set_extra_state): a
    refused change raises a located error before anything is stored -- including the raw value
    of a bounded param whose bound it would move, and a Parameter that a checkpoint would
    reshape. (Before: a per-channel bound assigned where one raw value could not keep the bounded
    param's value stored the bound, then raised torch's error.)"""
    lif = flexdsl.load("lif", learnable=["tau", "v_reset"])
    per = flexdsl.load("lif", learnable=["v_reset"], param_shapes={"v_reset": (3,), "tau": (3,)})
    plif = flexdsl.load("plif", param_shapes={"w": (4,)})
    cases = [
        (lif, "v_threshold", [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[1.0, 2.0, 3.0]] * 2), -1.0, 0.0]),
        (lif, "tau", [1.0, torch.tensor([2.0, 3.0]), torch.nn.Parameter(torch.tensor(3.0)), float("nan")]),
        (lif, "v_reset", [1.0, 2.0, torch.tensor([-1.0, -2.0])]),
        (per, "v_threshold", [torch.tensor([1.0, 2.0]), torch.tensor([0.5, -5.0, 2.0]), torch.ones(2, 2)]),
        (per, "tau", [torch.tensor([2.0, 3.0]), torch.tensor([2.0, 0.5, 3.0]), torch.ones(2, 2) * 2]),
        (per, "v_reset", [torch.tensor([[-1.0, -2.0, -3.0]] * 2), torch.tensor([-1.0, 5.0, -1.0])]),
        (plif, "w", [torch.zeros(3), torch.nn.Parameter(torch.full((4,), float("nan"))), torch.ones(2, 4)]),
        (plif, "v_threshold", [torch.ones(3), torch.ones(2, 3)]),
    ]
    x = torch.rand(4, 2, 3, generator=torch.Generator().manual_seed(3)) * 2
    for m, name, values in cases:
        before = _everything(m)
        xx = x if m is not plif else torch.rand(4, 2, 4, generator=torch.Generator().manual_seed(3)) * 2
        m.reset()
        out = m(xx)
        for v in values:
            with pytest.raises(flexdsl.FlexDSLError) as e:
                setattr(m, name, v)
            assert e.value.line, e.value
            assert _unchanged(before, _everything(m)), (name, v)
        m.reset()
        assert torch.equal(m(xx), out)  # (the same values, the same program)
    # several params at once: checkpoints and extra state
    for m, sd in _bad_checkpoints(lif, flexdsl.load("snn_leaky", learnable=["beta", "threshold"])):
        before = _everything(m)
        with pytest.raises(flexdsl.FlexDSLError) as e:
            m.load_state_dict(sd)
        assert e.value.line and _unchanged(before, _everything(m)), sd.keys()
    before = _everything(lif)
    extra = lif.get_extra_state()
    for params in ({"v_threshold": -2.0}, {"v_threshold": float("nan")}, {"v_threshold": 5.0, "bogus": 1.0}):
        with pytest.raises(flexdsl.FlexDSLError):
            lif.set_extra_state({**extra, "params": params})
        assert _unchanged(before, _everything(lif)), params
    leaky = flexdsl.load("snn_leaky", learnable="beta")  # a bounded param's float (saved where it was not
    before = _everything(leaky)  # learnable) on its closed bound, which the constraint allows
    with pytest.raises(flexdsl.FlexDSLError, match="lies on the bound"):
        leaky.set_extra_state({**leaky.get_extra_state(), "params": {"threshold": 2.0, "beta": 1.0}})
    assert _unchanged(before, _everything(leaky))
    from torch.nn.utils import parametrize  # a param a torch tool took over: validated as given

    class Same(torch.nn.Module):
        def forward(self, w):
            return w

        def right_inverse(self, w):
            return w

    parametrize.register_parametrization(plif, "w", Same())
    before = _everything(plif)
    for v in (torch.full((4,), float("nan")), torch.tensor([0.0, float("inf"), 0.0, 0.0]), "abc"):
        with pytest.raises(flexdsl.FlexDSLError):
            plif.w = v
        assert _unchanged(before, _everything(plif))
    # and what the rule lets through is stored whole: a bound of equal values per channel keeps v_reset
    lif.v_threshold = torch.full((3,), 1.5)
    assert lif.v_reset.shape == (3,) and bool((lif.v_reset == 0).all()) and lif.raw_v_reset.shape == ()


def test_a_checkpoint_of_another_model_or_missing_params_does_not_load():
    lif = flexdsl.load("lif", tau=3.0)
    for other in ("izhikevich", "lif_soft", "plif"):
        m = flexdsl.load(other)
        before = _snapshot(m)
        with pytest.raises(flexdsl.FlexDSLError, match="LIF"):
            m.load_state_dict(lif.state_dict())
        assert _same(before, _snapshot(m))
    m = flexdsl.load("lif")
    with pytest.raises(flexdsl.FlexDSLError, match="no value for the params `tau`, `v_threshold`, `v_reset`"):
        m.load_state_dict({})
    with pytest.raises(flexdsl.FlexDSLError, match="no value"):
        flexdsl.load("plif").load_state_dict({"w": torch.tensor(0.1)})
    with pytest.raises(flexdsl.FlexDSLError, match="does not have"):
        m.load_state_dict({**lif.state_dict(), "bogus": torch.zeros(1)})
    assert m.tau == 2.0
    m.load_state_dict({}, strict=False)  # strict=False keeps what a checkpoint lacks
    assert m.tau == 2.0
    m.load_state_dict(lif.state_dict())
    assert m.tau == 3.0
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), flexdsl.load("plif"))
    net2 = torch.nn.Sequential(torch.nn.Linear(2, 2), flexdsl.load("plif", w=0.3))
    net.load_state_dict(net2.state_dict())  # inside a network (prefixed keys)
    assert torch.equal(net[1].w, net2[1].w)


def test_nan_and_inf_params_are_located_errors_everywhere():
    for v in (float("nan"), float("inf"), "nan", torch.tensor([1.0, float("nan")]), torch.tensor(float("-inf"))):
        with pytest.raises(flexdsl.FlexDSLError, match="finite|takes a number") as e:
            flexdsl.load("lif", v_threshold=v)
        assert e.value.line == 17
    m = flexdsl.load("lif")
    with pytest.raises(flexdsl.FlexDSLError, match="finite"):
        m.v_reset = float("nan")
    sd = m.state_dict()
    sd["_extra_state"]["params"]["v_threshold"] = float("nan")
    with pytest.raises(flexdsl.FlexDSLError, match="finite"):
        m.load_state_dict(sd)
    # a default computed from finite overrides that overflows
    text = "neuron D:\n    input x\n    param a = 1.0\n    param b = a * 1e300\n    state v = 0.0\n" \
           "    update:\n        v = x * b\n    output v\n"
    with pytest.raises(flexdsl.FlexDSLError, match="default of `b` is inf") as e:
        flexdsl.loads(text, a=1e10)
    assert (e.value.line, e.value.column) == (4, 15)


def test_zero_denominators_and_param_ranges_are_checked_in_the_precision_of_the_run():
    """tau = 1e-50 is nonzero in float64 but 0 in float32: a float32 run would divide by zero
    silently; a float64 run is fine. Params beyond the run's dtype are errors too."""
    text = "neuron L:\n    input x\n    param tau = 2.0\n    state v = 0.0\n    update:\n" \
           "        v = v + (x - v) / tau\n    output v\n"
    for backend in ("torch", "triton"):
        m = flexdsl.loads(text, tau=1e-50, backend=backend)
        with pytest.raises(flexdsl.FlexDSLError, match="is 0 in float32|divides by zero in float32") as e:
            m(torch.ones(3, 2))
        assert e.value.line in (3, 6)  # (the param, or the statement it divides)
        m = flexdsl.loads(text, tau=1e39, backend=backend)
        with pytest.raises(flexdsl.FlexDSLError, match="beyond what float32 holds"):
            m(torch.ones(3, 2))
    m = flexdsl.loads(text, tau=1e-50, backend="torch")
    out = m(torch.ones(2, 1, dtype=torch.float64))
    assert torch.isfinite(out).all() and out[0, 0].item() == 1e50
    m = flexdsl.loads(text, backend="torch")
    m(torch.ones(2, 1, dtype=torch.float16))  # checked once per dtype, again after a change
    m.tau = 1e5
    with pytest.raises(flexdsl.FlexDSLError, match="beyond what float16 holds"):
        m(torch.ones(2, 1, dtype=torch.float16))


def test_unvalidated_values_never_reach_torch_raw():
    m = flexdsl.load("lif")
    x = torch.ones(3, 2)
    for state in ({"v": "abc"}, {"v": torch.tensor([True, False])}, {"v": torch.ones(2, dtype=torch.complex64)},
                  {"v": 10 ** 400}, {"v": float("nan")}, {"v": [1.0, 2.0]}, {"v": True}):
        with pytest.raises(flexdsl.FlexDSLError, match="state `v`"):
            m.step(x, state=state)
    for v in ("abc", torch.zeros(2, dtype=torch.int64), 1 + 2j):
        with pytest.raises(flexdsl.FlexDSLError, match="state `v`"):
            m.v = v
    for bad in ({"tau": (-1,)}, {"tau": None}, {"tau": "abc"}, {"tau": (0,)}, {"tau": (2.5,)}, {"nope": (2,)},
                {"tau": (True,)}, ["tau"]):
        with pytest.raises(flexdsl.FlexDSLError, match="param_shapes"):
            flexdsl.load("lif", param_shapes=bad)
    with pytest.raises(flexdsl.FlexDSLError, match="param_shapes gives `tau` the shape"):
        flexdsl.load("lif", tau=torch.tensor([2.0, 3.0]), param_shapes={"tau": (3,)})
    for v in (10 ** 400, -(10 ** 400)):
        with pytest.raises(flexdsl.FlexDSLError, match="too large for a float"):
            flexdsl.load("lif", tau=v)
    for v in (torch.zeros(0), torch.zeros(0, 3)):
        with pytest.raises(flexdsl.FlexDSLError, match="empty"):
            flexdsl.load("lif", v_reset=v)
        with pytest.raises(flexdsl.FlexDSLError, match="empty"):
            m.v_reset = v
    assert flexdsl.load("lif", param_shapes={"tau": 3}).tau.shape == (3,)


# ---------------------------------------------------------------- one rule for a param's shape against the step
# LIF without its bound (tau a plain Parameter when learnable) and a threshold no membrane reaches here,
# so that the reference is the membrane's linear recurrence, written out below
LIF_PLAIN = (ROOT / "neurons" / "lif.neuron").read_text().replace(" where tau > 1", "")
_FITS = [(1,), (1, 1), (1, 1, 1), (3,), (1, 3), (1, 1, 3), (2, 1), (1, 2, 1), (2, 3), (1, 2, 3), (1, 1, 1, 1, 3)]
_CLASHES = [(3, 1), (2, 2, 3), (4,), (1, 4), (2, 1, 1), (3, 1, 1)]


def _membrane(x: torch.Tensor, tau: torch.Tensor, step: tuple[int, ...]) -> torch.Tensor:
    """The reference: v_t = v + (x_t - v) / tau from v = 0 (v_reset = 0, no spike), in float64,
    with tau taken by the documented rule (its leading sizes of 1 beyond the step's rank dropped)."""
    t = tau.reshape(tau.shape[max(0, tau.dim() - len(step)):])
    v = torch.zeros(step, dtype=torch.float64)
    for xt in x.double():
        v = v + (xt - v) / t
    return v


def _tau(shape: tuple[int, ...]) -> torch.Tensor:
    n = 1
    for k in shape:
        n *= k
    return (1.5 + 0.25 * torch.arange(n, dtype=torch.float64)).reshape(shape)


def test_a_params_shape_broadcasts_by_one_rule_on_every_backend_and_in_recurrent_layers():
    """A param broadcasts against one step of the input to the step's shape, its leading sizes of
    1 beyond the step's rank dropped: the outputs and states keep the input's shapes and equal the
    reference (and its gradient reaches the param in its own shape) on the torch, Triton and CPU
    backends and in a recurrent layer; a shape that does not broadcast so is the same located error
    everywhere. (Before: (1, 1, 1) gave the torch backend an extra dimension, the Triton backend
    and the torch recurrent scan torch's errors.)"""
    T, step = 4, (2, 3)
    x = torch.rand(T, *step, generator=torch.Generator().manual_seed(5)) * 2
    ops = scan_ops("lif", T)
    for shape in _FITS:
        ref_tau = _tau(shape).requires_grad_()
        ref = _membrane(x, ref_tau, step)
        ref.sum().backward()
        for backend, dtype in (("torch", torch.float64), ("torch", torch.float32), ("triton", torch.float32),
                               ("cpu", torch.float32)):
            m = flexdsl.loads(LIF_PLAIN, backend=backend, learnable="tau", param_shapes={"tau": shape},
                              tau=_tau(shape), v_threshold=20.0).to(dtype)
            out = m(x.to(dtype))
            assert out.shape == x.shape and m.v.shape == step, (shape, backend, out.shape, m.v.shape)
            assert_close(m.v, ref, ops=ops, what=f"{shape} {backend} {dtype}")
            m.v.sum().backward()
            assert m.tau.grad.shape == shape
            assert_close(m.tau.grad, ref_tau.grad, ops=ops + T * 6, scale=float(ref_tau.grad.abs().max()),
                         what=f"grad {shape} {backend}")
    errors = {}
    for shape in _CLASHES:
        for backend in ("torch", "triton", "cpu"):
            m = flexdsl.load("lif", backend=backend, param_shapes={"tau": shape}, tau=_tau(shape))
            with pytest.raises(flexdsl.FlexDSLError) as e:
                m(x)
            errors.setdefault(shape, set()).add((e.value.reason, e.value.line, e.value.column))
        assert len(errors[shape]) == 1 and next(iter(errors[shape]))[1] == 16, errors[shape]
    # the recurrent layer: [*batch, hidden] steps, on its torch and Triton scans
    H, x3 = 3, torch.rand(T, 2, 4, generator=torch.Generator().manual_seed(6))
    for shape in [*_FITS, *_CLASHES]:
        got, seen = [], set()
        for backend in ("torch", "triton"):
            neuron = flexdsl.loads(LIF_PLAIN, param_shapes={"tau": shape}, tau=_tau(shape), v_threshold=20.0)
            layer = flexdsl.recurrent(neuron, 4, H, backend=backend)
            try:
                out = layer(x3)
            except flexdsl.FlexDSLError as e:
                seen.add((e.reason, e.line, e.column))
                continue
            assert out.shape == (T, 2, H) and layer.neuron.v.shape == (2, H)
            with torch.no_grad():
                drive = x3.double() @ layer.W_in.double().T + layer.bias.double()  # (no spike: no feedback)
            got.append(layer.neuron.v)
            assert_close(layer.neuron.v, _membrane(drive, _tau(shape), (2, H)), ops=ops + T * 8,
                         what=f"recurrent {shape} {backend}")
        assert (len(got), len(seen)) in ((2, 0), (0, 1)), (shape, seen)
        assert (len(got) == 2) == (shape in _FITS)


# ---------------------------------------------------------------- both backends agree at the edges
def test_zero_steps_give_the_same_shapes_and_graph_on_both_backends():
    """T = 0 with broadcast inputs: outputs [0, *broadcast shape], the initial states as final
    states, differentiable (zero gradients) like any call, on both backends."""
    text = TWO_INPUTS.replace("param a = 0.5", "param a = 0.5 learnable").replace(
        "    output v\n", "    spike when v >= 1.0\n    output spike, v\n")
    got = {}
    for backend in ("torch", "triton"):
        m = flexdsl.loads(text, backend=backend)
        x = torch.ones(0, 1, 3, requires_grad=True)
        outs = m(x, torch.ones(0, 4, 1))
        st = m.v
        got[backend] = [(o.shape, o.requires_grad) for o in outs] + [(st.shape, st.requires_grad)]
        (outs[0].sum() + st.sum()).backward()
        assert x.grad.shape == x.shape and not x.grad.any()
        assert m.a.grad == 0
        m.reset()
        with torch.no_grad():
            o, _ = m(torch.ones(0, 1, 3), torch.ones(0, 4, 1))
        assert not o.requires_grad
        m.reset()
        m.v = torch.full((4, 3), 0.25, requires_grad=True)
        m(torch.ones(0, 1, 3), torch.ones(0, 4, 1))
        assert torch.equal(m.v.detach(), torch.full((4, 3), 0.25))
    assert got["torch"] == got["triton"] == [((0, 4, 3), True)] * 2 + [((4, 3), True)]


@pytest.mark.parametrize("var, value", [("FLEXDSL_TRITON_BLOCK", "-1"), ("FLEXDSL_TRITON_BLOCK", "0"),
                                        ("FLEXDSL_TRITON_BLOCK", "100"), ("FLEXDSL_TRITON_BLOCK", "1e9"),
                                        ("FLEXDSL_TRITON_WARPS", "3"), ("FLEXDSL_TRITON_BLOCK_RC", "abc"),
                                        ("FLEXDSL_CHUNK", "0"), ("FLEXDSL_CHUNK", "-1"), ("FLEXDSL_CHUNK", "10000"),
                                        ("FLEXDSL_CHUNK", "\u0663"), ("FLEXDSL_TRITON_TRAINING", "fast"),
                                        ("FLEXDSL_TRITON_FAST_LAUNCH", "false")])
def test_environment_variables_are_checked(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    text = TWO_INPUTS.replace("neuron TwoIn:", f"neuron Env{abs(hash((var, value)))}:")
    with pytest.raises(flexdsl.FlexDSLError, match=var):
        flexdsl.loads(text, backend="triton")(torch.ones(2, 3), torch.ones(2, 3))


# ---------------------------------------------------------------- constraints that cannot be evaluated
RAISING = """neuron W:
    input x
    param tau = 3.0
    param k = 0.5 where k < 1/(tau - 2)
    param q = 0.5 where q < log(tau)
    state v = 0.0
    update:
        v = v + (x - v) / tau * k * q
    output v
"""


def test_a_constraint_that_raises_is_a_located_error_everywhere(tmp_path, capsys):
    from flexdsl import cli

    for tau in (2.0, 0.0):
        with pytest.raises(flexdsl.FlexDSLError) as e:
            flexdsl.loads(RAISING, tau=tau)
        assert e.value.line in (4, 5) and e.value.column == 25
    m = flexdsl.loads(RAISING)
    sd = m.state_dict()
    for tau in (2.0, 0.0, -1.0):
        with pytest.raises(flexdsl.FlexDSLError, match="constraint of `[kq]`") as e:
            m.tau = tau
        assert e.value.line in (4, 5)
        sd["_extra_state"]["params"]["tau"] = tau
        with pytest.raises(flexdsl.FlexDSLError, match="constraint of `[kq]`"):
            m.load_state_dict(sd)
        assert m.tau == 3.0
    bad = tmp_path / "models" / "a_bad.neuron"
    bad.parent.mkdir()
    bad.write_text(RAISING.replace("param tau = 3.0", "param tau = 2.0"))
    (tmp_path / "models" / "b_good.neuron").write_text(RAISING)
    assert cli.main(["check", str(bad.parent)]) == 1
    out, err = capsys.readouterr()
    assert "b_good.neuron: ok" in out  # one bad file does not stop the others
    assert f"{bad}:4:25: error: the constraint of `k` cannot be evaluated" in err and "Traceback" not in err
    good = tmp_path / "models" / "b_good.neuron"
    for tau in ("2", "0"):
        assert cli.main(["run", str(good), "--T", "5", "--param", f"tau={tau}"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{good}:") and "Traceback" not in err


# ---------------------------------------------------------------- constants
def _one(update: str, param: str = "1.0") -> str:
    return f"neuron C:\n    input x\n    param a = {param}\n    state v = 0.0\n    update:\n        v = {update}\n" \
           "    output v\n"


@pytest.mark.parametrize("text, col", [("1\u06605", 16), ("\uff13.5", 15), ("\u0663", 15), ("2\u0e52", 16),
                                       ("1e\u0665", 17), ("1.\u0661", 17)])
def test_non_ascii_digits_are_not_numbers(text, col):
    with pytest.raises(flexdsl.FlexDSLError, match="not a digit") as e:
        flexdsl.loads(_one("v + x * a", text))
    assert (e.value.line, e.value.column) == (3, col)


def test_numbers_given_as_text_are_read_as_the_language_reads_them(capsys):
    from flexdsl import cli

    for v in ("\uff13", "1\u06605", "1_0", " nan", "inf"):
        with pytest.raises(flexdsl.FlexDSLError):
            flexdsl.load("lif", v_threshold=v)
    assert flexdsl.load("lif", v_threshold="2.5").v_threshold == 2.5
    assert flexdsl.load("adex", tau_w="100 ms").tau_w == 100.0
    with pytest.raises(flexdsl.FlexDSLError):
        flexdsl.load("adex", tau_w="\uff11\uff10\uff10 ms")
    for argv in (["--param", "tau=\uff13"], ["--input", "\uff13"], ["--input", "step:1.5@\u0663"]):
        assert cli.main(["run", "lif", "--T", "5", *argv]) == 1
        assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "lif", "--T", "\u0663"])


def test_literals_and_folded_constants_that_underflow_are_located_errors():
    for update, col in (("x + 1e-400", 17), ("x * 0.000000000000000000000000000000000000000000001e-300", 17)):
        with pytest.raises(flexdsl.FlexDSLError, match="too small for a float") as e:
            flexdsl.loads(_one(update))
        assert (e.value.line, e.value.column) == (6, col)
    with pytest.raises(flexdsl.FlexDSLError, match="too small") as e:
        flexdsl.loads(_one("x", "1e-999"))
    assert (e.value.line, e.value.column) == (3, 15)
    with pytest.raises(flexdsl.FlexDSLError, match="underflow") as e:
        flexdsl.compile(_one("x * 1e-200 * 1e-200")).step  # noqa: B018 - lowering folds them
    assert e.value.line == 6
    m = flexdsl.loads(_one("x * 1e-320"), backend="torch")  # a subnormal float64 is a float
    assert m(torch.ones(1, 1, dtype=torch.float64)).item() == 1e-320
    assert flexdsl.loads(_one("x + 0e-400 + 0.0e5")) is not None  # zero written with an exponent


@pytest.mark.parametrize("param", ["1e308*10", "1e308*10 - 1e308*10", "-(1e200 * 1e200)", "1e308 + 1e308",
                                   "exp(1000)"])
def test_params_whose_default_overflows_are_located_errors(param):
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.compile(_one("v + x * a", param))
    assert (e.value.line, e.value.column) == (3, 15)


@pytest.mark.parametrize("c", ["1e200 pF * 1e200", "1e300 pF / 1e-300", "1e308 GF", "1e-300 fF / 1e300"])
def test_unit_products_that_overflow_or_underflow_are_located_errors(c):
    text = (f"neuron U:\n    input I : nA\n    param C = {c}\n    param dt = 0.1 ms\n    state v = 0 mV\n"
            "    equations:\n        dv/dt = I / C\n    output v\n")
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.compile(text)
    assert e.value.line == 3


BIG = "18446744073709551616"  # 2**64


@pytest.mark.parametrize("update", [f"v = {BIG}", f"v = x * {BIG}", f"v = x + {BIG}1 - {BIG}1",
                                    f"v = where(x > {BIG}, 1.0, 0.0)", f"v = clip(x, -{BIG}, {BIG})",
                                    f"v = x / {BIG}", f"v = min(x, {BIG}) * 0.5", f"v = where(x > 1, {BIG}, 0)",
                                    "v = v * 0.5 + x * 9223372036854775808"])
def test_integer_constants_beyond_64_bits_run_alike_on_both_backends(update):
    text = _one(update.removeprefix("v = "))
    x = torch.linspace(-1.0, 2.0, 8).reshape(4, 2)
    ref = flexdsl.loads(text, backend="torch").double()(x.double())
    for backend in ("torch", "triton"):
        m = flexdsl.loads(text, backend=backend)
        xg = x.clone().requires_grad_()
        out = m(xg)
        assert_close(out, ref, ops=scan_ops(text, 4, backward=False))
        if out.requires_grad:
            out.sum().backward()
            assert xg.grad is None or torch.isfinite(xg.grad).all()


def test_a_state_set_to_a_constant_beyond_the_dtype_is_an_error_on_both_backends():
    for update in ("1e300", "x * 0 + 1e300", "where(x > 100, 1.0, 1.0) * 1e300"):
        text = _one(update)
        for backend in ("torch", "triton"):
            with pytest.raises(flexdsl.FlexDSLError, match=r"sets state `v` to 1e\+300, beyond what float32") as e:
                flexdsl.loads(text, backend=backend)(torch.ones(2, 3))
            assert e.value.line == 6
        out = flexdsl.loads(text, backend="torch")(torch.ones(2, 3, dtype=torch.float64))
        assert (out == 1e300).all()  # float64 holds it
    text = _one("70000.0")
    with pytest.raises(flexdsl.FlexDSLError, match="float16"):
        flexdsl.loads(text, backend="triton")(torch.ones(2, 3, dtype=torch.float16))
    assert (flexdsl.loads(text, backend="triton")(torch.ones(2, 3)) == 70000.0).all()


def test_where_of_two_numbers_keeps_a_float64_run_in_float64():
    m = flexdsl.loads(_one("where(x > 0, 0.1, 0.2) + where(x > 1, a, 0.3)"), backend="torch")
    out = m(torch.tensor([[1.0], [-1.0], [2.0]], dtype=torch.float64))
    assert out[:, 0].tolist() == [0.1 + 0.3, 0.2 + 0.3, 0.1 + 1.0]


def test_run_refuses_sizes_that_would_take_minutes(capsys):
    """`flexdsl run` steps from Python in float64 and keeps every trace: its bound counts the
    statements of a step, so a heavy model gets fewer steps than LIF."""
    from flexdsl import cli

    for model, T in (("lif", "100001"), ("hodgkin_huxley", "50000"), ("lif", "10000000000")):
        assert cli.main(["run", model, "--T", T]) == 1
        err = capsys.readouterr().err
        assert "more steps" in err and "Traceback" not in err


# ---------------------------------------------------------------- threads on a cold start
_THREADS = r'''
import os, sys, threading
import flexdsl
assert "sympy" not in sys.modules
N = 12
barrier = threading.Barrier(N)
errors = []

def work(i):
    if i % 4 == 0:
        text = (f"neuron U{i}:\n    input I : nA\n    param C = {i + 1} pF\n    param dt = 0.1 ms\n"
                "    state v = 0 mV\n    equations:\n        dv/dt = I / C\n    output v\n")
    else:
        method = ["exact", "euler", "rk4", "exponential_euler"][i % 4]
        text = (f"neuron T{i}:\n    input x\n    param tau = {2 + i}.0\n    param dt = 0.1\n    state v = 0.0\n"
                f"    equations method {method}:\n        dv/dt = (x - v) / tau\n    spike when v >= 1\n"
                "    output spike\n")
    barrier.wait()
    try:
        c = flexdsl.compile(text)
        c.torch_source
        if i % 4 == 1:
            flexdsl.docs.latex(c, "step")
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")

threads = [threading.Thread(target=work, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors)
assert not errors, errors
'''


def test_threads_compiling_new_models_in_a_fresh_process(tmp_path):
    """sympy's modules import each other in cycles: threads that reach it at once must not see
    it half-imported (the first import is serialized)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(flexdsl.__file__).resolve().parents[1])
    for k in range(2):
        env = dict(os.environ, FLEXDSL_CACHE_DIR=str(tmp_path / f"cache{k}"),
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


# ---------------------------------------------------------------- lines as the parser counts them
@pytest.mark.parametrize("sep", ["\x0c", "\x85", "\u2028", "\u2029", "\x1c", "\x1e"])
def test_line_separators_inside_text_do_not_shift_lines(sep):
    """A form feed, NEL, U+2028... inside a docstring, a comment or a description: the parser
    counts lines at `\\n` only, so must everything that quotes a line (errors, generated code,
    the docs)."""
    text = (f'neuron M:\n    """doc{sep}more"""\n    input x  # a{sep}b\n    param a = 0.5 "half{sep}way"\n'
            "    state v = 0.0\n    update:\n        v = v * a + x\n    output v\n")
    if sep in "\x1c\x1e":  # control characters: a located error whose caret line is the line
        with pytest.raises(flexdsl.FlexDSLError) as e:
            flexdsl.compile(text)
        assert (e.value.line, e.value.column) == (2, 11)
        assert e.value.source_line == '    """doc more"""'
        return
    c = flexdsl.compile(text)
    for source in (c.torch_source, c.triton_source):
        assert "# line 7: v = v * a + x" in source
    from flexdsl.docs import render_markdown

    assert "v = v * a + x" in render_markdown(c, plots=False)
    bad = text.replace("v = v * a + x", "v = v * a + y")
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.compile(bad)
    assert (e.value.line, e.value.column, e.value.source_line) == (7, 21, "        v = v * a + y")


# ---------------------------------------------------------------- the command line, the store, memory
def test_the_cli_never_prints_terminal_escapes(tmp_path, capsys, monkeypatch):
    from flexdsl import cli

    monkeypatch.chdir(tmp_path)
    name = "x\x1b[2J\x1b]0;owned\x07y.neuron"
    (tmp_path / name).write_text((ROOT / "neurons" / "lif.neuron").read_text())
    for argv in (["check", name], ["check", "nope\x1b[31m.neuron"], ["run", name, "--T", "3"],
                 ["run", "lif", "--param", "x\x1b[1m=2"], ["show", "\x9b31m"], ["run", "lif", "--T", "\x1bx"]):
        try:
            cli.main(argv)
        except SystemExit:
            pass
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err and "\x9b" not in out + err and "\x07" not in out + err, argv
        assert "\\x1b" in out + err or "\\x9b" in out + err, argv
    e = flexdsl.FlexDSLError("bad", "f\x1b[2J.neuron", hint="h\x1b")
    assert "\x1b" not in str(e)


def test_a_relative_file_named_like_model_text_is_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "neuron lif.neuron").write_text((ROOT / "neurons" / "lif.neuron").read_text())
    m = flexdsl.load("neuron lif.neuron")
    assert m.compiled.filename == "neuron lif.neuron" and m.compiled.name == "LIF"
    with pytest.raises(flexdsl.FlexDSLError, match="no such file"):
        flexdsl.load("neuron X:")
    with pytest.raises(flexdsl.FlexDSLError, match="end of file"):
        flexdsl.loads("neuron X:")  # text given as text


def test_temporary_files_of_killed_writers_are_swept(tmp_path, monkeypatch):
    import os
    import time

    from flexdsl.store import cache

    monkeypatch.setenv("FLEXDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_memory", {})
    monkeypatch.setattr(cache, "_swept", set())
    d = cache.folder()
    stale, fresh = d / ".abc.123.456.tmp", d / ".def.123.457.tmp"
    for p in (stale, fresh):
        p.write_text("{")
    old = time.time() - 2 * cache.STALE_TMP_SECONDS
    os.utime(stale, (old, old))
    mine = d / f".k1.{os.getpid()}.{__import__('threading').get_ident()}.tmp"  # a dead process with my pid
    mine.write_text("{")
    cache.write("k1", cache.Artefact("t", "source"))
    assert not stale.exists() and fresh.exists() and not mine.exists()
    assert cache.read("k1").source == "source"


def test_in_process_caches_are_bounded(monkeypatch):
    from flexdsl.runtime import compiler
    from flexdsl.store import cache

    monkeypatch.setattr(compiler, "_PROGRAMS_SIZE", 3)
    monkeypatch.setattr(cache, "MEMORY_ENTRIES", 5)
    texts = [TWO_INPUTS.replace("neuron TwoIn:", f"neuron Bounded{i}:").replace("0.5", f"0.{i + 1}") for i in range(6)]
    x, y = torch.rand(3, 4), torch.rand(3, 4)
    for _ in range(2):  # the second round loads evicted models again: their kernels still run right
        for t in texts:
            tri, ref = flexdsl.loads(t, backend="triton"), flexdsl.loads(t, backend="torch")
            assert_close(tri(x, y), ref(x, y), ops=scan_ops(t, 3, backward=False))
            assert len(compiler._PROGRAMS) <= 3 and len(cache._memory) <= 5


# ---------------------------------------------------------------- NIR graphs
def _nir_graph(meta=None, w_out=4, n=4, node_meta=None):
    import nir
    import numpy as np

    nodes = {"in": nir.Input(input_type={"input": np.array([3])}),
             "fc": nir.Affine(weight=np.ones((w_out, 3)), bias=np.zeros(w_out)),
             "lif": nir.LIF(tau=np.linspace(0.01, 0.02, n), r=np.ones(n), v_leak=np.zeros(n), v_threshold=np.ones(n)),
             "out": nir.Output(output_type={"output": np.array([n])})}
    if node_meta is not None:
        nodes["lif"].metadata = node_meta
    g = nir.NIRGraph(nodes=nodes, edges=[("in", "fc"), ("fc", "lif"), ("lif", "out")], type_check=False)
    if meta is not None:
        g.metadata = meta
    return g


@pytest.mark.parametrize("meta", [{"flexdsl_dt": []}, {"flexdsl_dt": 10 ** 400}, {"flexdsl_dt": True},
                                  {"flexdsl_dt": "1e-3"}, {"flexdsl_dt": [1e-3, 2e-3]}, {"flexdsl_dt": float("nan")},
                                  {"flexdsl_dt": {"a": 1}}])
def test_nir_graphs_with_malformed_metadata_are_located_errors(meta):
    pytest.importorskip("nir")
    with pytest.raises(flexdsl.FlexDSLError, match="dt must be"):
        flexdsl.nir.load(_nir_graph(meta))


@pytest.mark.parametrize("node_meta", [{"flexdsl_method": ["exact"]}, {"flexdsl_method": "rk4"},
                                       {"flexdsl_surrogate": 5}, {"flexdsl_surrogate": "atan(alpha=1e999)"},
                                       {"flexdsl_surrogate": "atan(alpha=\u0663)"}])
def test_nir_neuron_metadata_that_flexdsl_does_not_write_is_an_error(node_meta):
    pytest.importorskip("nir")
    with pytest.raises(flexdsl.FlexDSLError, match="NIR node `lif`"):
        flexdsl.nir.load(_nir_graph(node_meta=node_meta), dt=1e-3)


def test_nir_layers_that_do_not_fit_are_found_at_load():
    pytest.importorskip("nir")
    with pytest.raises(flexdsl.FlexDSLError, match=r"NIR node `lif` \(LIF\) does not fit its input of per-sample "
                                                   r"shape \(5,\)"):
        flexdsl.nir.load(_nir_graph(w_out=5, n=4), dt=1e-3)
    net = flexdsl.nir.load(_nir_graph(), dt=1e-3)  # the trial step leaves no state behind
    x = torch.rand(6, 2, 3)
    y = net(x)
    net.reset()
    assert torch.equal(net(x), y)  # (the same program and inputs: the same numbers)


@pytest.mark.parametrize("method", ["euler", "rk2", "rk4", "heun", "exact", "exponential_euler"])
@pytest.mark.parametrize("coef", ["where(tau > 3, 8, -8) ** (1/3)", "clip(tau - 5, -9, 9) ** 0.5", "log(tau - 5)",
                                  "sqrt(tau - 3)"])
def test_params_that_make_a_part_of_the_step_nan_are_located_errors_for_every_method(method, coef):
    """A value computed from the params alone that is NaN or inf (a negative base to a fractional
    power, log of a negative number...) is a located error at load for every method — not a
    silent NaN (euler), a complex constant or a crash (Triton) — and both backends agree."""
    text = ("neuron M:\n    input x\n    param tau = 2.0\n    param dt = 0.1\n    state v = 1.0\n"
            f"    equations method {method}:\n        dv/dt = -v * {coef} + x\n    output v\n")
    for backend in ("torch", "triton"):
        with pytest.raises(flexdsl.FlexDSLError, match="the step is not defined") as e:
            flexdsl.loads(text, backend=backend)(torch.ones(2, 1))
        assert e.value.line == 7
    ok = flexdsl.loads(text, tau=10.0, backend="torch")
    assert torch.isfinite(ok(torch.ones(2, 1))).all()


def test_min_max_ties_and_kept_half_states_give_the_same_gradients_on_both_backends():
    """Found by the history property test: at a tie min/max give the whole gradient to one side
    in the derived backward (the kernels) while torch.minimum splits it; a float16 state kept
    from an earlier call made the torch backend compute `a * v` of a float32 call in float16."""
    text = ("neuron Tie:\n    input x\n    param a = 0.5 learnable\n    state v = 0.0\n    state w = 0.25\n"
            "    update:\n        v = a * v + x + 0.5 * w\n        w = min(w * 0.5, x) + max(x, 0.0)\n    output v\n")
    x0 = torch.tensor([[0.0], [0.0], [0.25], [0.0]])  # min(w/2, x) and max(x, 0) tie at steps with x = 0
    grads = {}
    for backend in ("triton", "torch"):
        m = flexdsl.loads(text, backend=backend)
        x = x0.clone().requires_grad_()
        m(x).sum().backward()
        grads[backend] = (x.grad.clone(), m.a.grad.clone())
    for t, r in zip(grads["triton"], grads["torch"]):
        torch.testing.assert_close(t, r, rtol=0, atol=0)
    # a float16 state kept from a float16 call, then a float32 call: exact dyadic values
    text = "neuron H:\n    input x\n    param a = 0.25 learnable\n    state v = 0.0\n    update:\n" \
           "        v = a * v + x\n    output v\n"
    res = {}
    for backend in ("triton", "torch"):
        m = flexdsl.loads(text, backend=backend)
        m(torch.tensor([[1.375], [-0.625]], dtype=torch.float16))
        m.detach()
        out = m(torch.tensor([[0.5], [0.25], [-1.0]]))
        (out * torch.tensor([[0.75], [-1.25], [2.0]])).sum().backward()
        res[backend] = (out.detach(), m.a.grad.clone())
    for t, r in zip(res["triton"], res["torch"]):
        torch.testing.assert_close(t, r, rtol=0, atol=0)


@pytest.mark.parametrize("update, what", [("v * 1e308 + x", "constant 1e\\+308, beyond what float32"),
                                          ("where(v >= 1e-308, 1.0, 0.0) + x", "1e-308, which float32 rounds to 0"),
                                          ("v * 1e39 - x", "constant 1e\\+39")])
def test_constants_beyond_the_precision_of_the_call_are_errors(update, what):
    """Found by the fuzzer: `v * 1e308` is NaN in float32 for v = 0 (1e308 is inf there) where
    float64 gives 0; `v >= 1e-308` fires at v = 0 in float32. A located error on both
    backends; float64 runs them."""
    text = _one(update)
    for backend in ("torch", "triton"):
        with pytest.raises(flexdsl.FlexDSLError, match=what) as e:
            flexdsl.loads(text, backend=backend)(torch.zeros(2, 3))
        assert e.value.line == 6
    out = flexdsl.loads(text, backend="torch")(torch.zeros(2, 3, dtype=torch.float64))
    assert torch.isfinite(out).all()
    m = flexdsl.loads(_one("v + x * a"), a=1e-300, backend="torch")
    with pytest.raises(flexdsl.FlexDSLError, match="is 0 in float32"):
        m(torch.ones(2, 3))
    assert m(torch.ones(2, 3, dtype=torch.float64))[0, 0].item() == 1e-300


def test_check_of_a_directory_goes_on_after_a_file_flexdsl_fails_on(tmp_path, capsys, monkeypatch):
    """A failure flexdsl did not foresee on one file (a bug) is reported for that file, located,
    and the other files are still checked."""
    from flexdsl import cli
    from flexdsl.runtime import compiler

    for name in ("a.neuron", "b.neuron"):
        (tmp_path / name).write_text((ROOT / "neurons" / "lif.neuron").read_text())
    real = compiler.compile_model

    def flaky(model, *a, **k):
        if str(model).endswith("a.neuron"):
            raise ZeroDivisionError("float division by zero")
        return real(model, *a, **k)

    monkeypatch.setattr(compiler, "compile_model", flaky)
    assert cli.main(["check", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "b.neuron: ok" in out and "a.neuron: error: flexdsl failed on this file" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- issue 36: every constant one float64
LINEAR = """neuron K:
    input x
    param tau = 2.0
    param dt = 0.5
    state v = 0.0
    equations method {method}:
        dv/dt = (x * ({c}) - v) / tau
    output v
"""
# the factor R(h) of one step of dv/dt = (c*x - v)/tau with x held (h = dt/tau): v' = c*x + (v - c*x)*R(h)
_R = {"euler": lambda h: 1 - h, "rk2": lambda h: 1 - h + h**2 / 2, "heun": lambda h: 1 - h + h**2 / 2,
      "rk4": lambda h: 1 - h + h**2 / 2 - h**3 / 6 + h**4 / 24, "exact": lambda h: math.exp(-h),
      "exponential_euler": lambda h: math.exp(-h)}
_CPU = pytest.param("cpu", marks=pytest.mark.skipif(not backends.get("cpu").available(), reason="no C++ compiler"))


@pytest.mark.parametrize("c, value, method", [
    ("2**70", 2**70, "euler"), ("-(2**64)", -(2**64), "rk4"), ("4294967296 * 4294967296", 2**64, "exact"),
    ("2**53 + 1", 2**53 + 1, "heun"), ("3**40", 3**40, "rk2"), ("1" + "0" * 30, 10**30, "exponential_euler"),
    ("2**70 * 2**10", 2**80, "euler")])
@pytest.mark.parametrize("backend", ["torch", "triton", _CPU])
def test_integers_beyond_2_53_are_one_float64_on_every_backend(c, value, method, backend):
    """Sympy folds `2**70`, `4294967296 * 4294967296` and a 31-digit literal to exact integers, which
    torch's scalars and Triton's integer constants cannot take (an OverflowError or "Nonrepresentable
    integer" at the first call): every such constant is the float64 nearest it, printed alike by
    every backend, and the model runs as the recurrence written out by hand (R(h) of its method)
    gives, in float32 and float64."""
    text = LINEAR.format(method=method, c=c)
    x = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [3.0, 1.0, 0.0], [-2.0, 0.5, 1.0]], dtype=torch.float64)
    cv, r = float(value), _R[method](0.25)  # (float(int) rounds to the nearest float64)
    v, ref = torch.zeros(3, dtype=torch.float64), []
    for t in range(x.shape[0]):
        v = cv * x[t] + (v - cv * x[t]) * r
        ref.append(v)
    ref = torch.stack(ref)
    c_ = flexdsl.compile(text)
    code = [ln for ln in c_.artefact(backend).source.split("\n") if not ln.lstrip().startswith(("#", "//"))]
    assert not any(str(abs(value)) in ln for ln in code)  # the float64, not the integer (comments quote the model)
    assert any(repr(abs(cv)) in ln for ln in code)
    ops = scan_ops(text, x.shape[0], backward=False)
    for dtype in (torch.float32, torch.float64):
        if backend == "triton" and dtype == torch.float64:
            continue  # (the Triton kernels compute in float32)
        m = flexdsl.loads(text, backend=backend)
        xs = x.to(dtype).requires_grad_()
        out = (m.double() if dtype == torch.float64 else m)(xs)
        assert_close(out, ref, ops=ops, precision=dtype)
        out.sum().backward()  # d sum(v) / dx[t]: c*(1 - R) * (1 + R + ... + R^(T-1-t)), here in float64
        g = torch.tensor([cv * (1 - r) * sum(r**k for k in range(x.shape[0] - t)) for t in range(x.shape[0])],
                         dtype=torch.float64)
        assert_close(xs.grad, g[:, None].expand(-1, 3), ops=ops, precision=dtype)


@pytest.mark.parametrize("method", ["euler", "rk2", "rk4", "heun", "exact", "exponential_euler"])
@pytest.mark.parametrize("c", ["sqrt(-2)", "(-1)**0.5", "sqrt(1 - 2)", "sqrt(2**70 - 2**71)", "(-2)**(1/2)",
                               "log(-1)", "sqrt(-1e-300)"])
def test_a_negative_square_root_of_a_constant_is_a_located_error_under_every_method(method, c):
    """Every integration method, every backend: the model is refused at load where the square root
    (logarithm, fractional power) of a negative constant is written, never run into NaN."""
    text = LINEAR.format(method=method, c=c)
    start = text.split("\n")[6].index("(" + c) + 2  # (the column of the constant expression)
    for backend in ("torch", "triton", "cpu"):
        with pytest.raises(flexdsl.FlexDSLError, match="complex") as e:
            flexdsl.loads(text, backend=backend)(torch.ones(3, 2))
        assert e.value.line == 7 and start <= e.value.column < start + len(c), (e.value.column, start)
        assert e.value.format().startswith("<string>:7:")
