"""Issue 18, "no silent wrong numbers": every class of failure found by an attacker's and a
numerical analyst's audit, each pinned by a test that fails without its fix. Caches may change
speed, never results; a refused change changes nothing; every user error is a located
`FlexDSLError`. (Triton runs through its interpreter here, as in CI.)"""

from __future__ import annotations

import pytest
import torch

import flexdsl

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
    torch.testing.assert_close(tri(a, a), ref(a, a), rtol=0, atol=1e-6)
    for m in (tri, flexdsl.loads(TWO_INPUTS, backend="triton")):
        m.reset()
        ref.reset()
        torch.testing.assert_close(m(a, b), ref(a, b), rtol=0, atol=1e-6)
        m.reset()
        ref.reset()
        torch.testing.assert_close(m(b, a), ref(b, a), rtol=0, atol=1e-6)


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
        torch.testing.assert_close(t, r, rtol=1e-5, atol=1e-6)


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
    v = m(x)
    (g,) = torch.autograd.grad((v * v * x).sum(), m.tau, create_graph=True)
    return g


def test_second_order_gradients_are_correct_on_torch_and_refused_on_triton():
    """Double backward through a learnable param: the torch backend's equals a central finite
    difference of its first-order gradient (float64); the Triton kernels' backward is not
    differentiable, so create_graph=True through them is a located error, never zeros. (A
    model without a spike: finite differences see a spike as a step, autograd as its surrogate.)"""
    x = torch.linspace(-0.5, 1.5, 24, dtype=torch.float64).reshape(6, 4)
    m = flexdsl.loads(SMOOTH, backend="torch").double()
    g = _first_order(m, x)
    (g2,) = torch.autograd.grad(g, m.tau)
    h, tau = 1e-5, m.tau.item()
    fd = []
    for t in (tau + h, tau - h):
        m.reset()
        m.tau = t
        fd.append(_first_order(m, x).item())
    assert abs(g2.item() - (fd[0] - fd[1]) / (2 * h)) < 1e-6 * max(1.0, abs(g2.item()))
    assert g2.item() != 0.0
    tri = flexdsl.loads(SMOOTH, backend="triton")
    with pytest.raises(flexdsl.FlexDSLError, match="second-order"):
        _first_order(tri, x.float())
    tri.reset()
    v = tri(x.float())  # first order still works, and equals the torch backend's
    (g1,) = torch.autograd.grad((v * v * x.float()).sum(), tri.tau)
    m.reset()
    m.tau = tau
    torch.testing.assert_close(g1.double(), _first_order(m, x).detach(), rtol=1e-4, atol=1e-5)


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
    torch.testing.assert_close(gf[0]["tau"], m.tau.grad)

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
    torch.testing.assert_close(grad(lambda xx: auto(xx)[1].sum())(x.float()),
                               torch.func.grad(lambda xx: m.step(xx, None)[0][1].sum())(x).float())
