"""The symbolic backward (derive.py) equals torch.autograd of the generated core, in float64.

For every library model and for ODE models of every integration method: random previous
states, inputs and upstream gradients; the derived VJP (gradients of inputs, previous states
and learnable params) must match autograd within 1e-10.
"""

from __future__ import annotations

import pytest
import torch

import flexdsl

METHOD_MODELS = {
    "euler": "dv/dt = (-v + w*w/(1 + w*w) + I) / tau\n        dw/dt = (v - w) / tau_w",
    "rk2": "dv/dt = (-v + w*w/(1 + w*w) + I) / tau\n        dw/dt = (v - w) / tau_w",
    "rk4": "dv/dt = (-v + w*w/(1 + w*w) + I) / tau\n        dw/dt = (v - w) / tau_w",
    "heun": "dv/dt = (-v + w*w/(1 + w*w) + I) / tau\n        dw/dt = (v - w) / tau_w",
    "exponential_euler": "dv/dt = (-v + w*w/(1 + w*w) + I) / tau\n        dw/dt = (v*v - w) / tau_w",
    "exact": "dv/dt = (-v + w + I) / tau\n        dw/dt = (v - w) / tau_w",
}


def ode_model(method: str) -> str:
    return f'''neuron ODE_{method}:
    input I
    param dt = 0.5
    param tau = 10.0 learnable
    param tau_w = 30.0
    param v_th = 1.0
    state v = 0.0
    state w = 0.2
    equations method {method}:
        {METHOD_MODELS[method]}
    spike when v >= v_th surrogate atan(alpha=2.0)
    on spike:
        v = 0.0
        w += 0.1
    output spike, w
'''


def _random_like_state(init: float, shape, gen) -> torch.Tensor:
    scale = max(abs(init) * 0.2, 0.5)
    return init + scale * torch.randn(shape, dtype=torch.float64, generator=gen)


def check_vjp(c: flexdsl.Compiled, seed: int = 0, n: int = 64) -> None:
    gen = torch.Generator().manual_seed(seed)
    m = flexdsl.load(c.text if c.filename == "<string>" else c.filename, detach_reset=c.detach_reset)
    params = m.param_values()
    step = c.step
    inputs = [(torch.randn(n, dtype=torch.float64, generator=gen) * 2 + 0.5).requires_grad_() for _ in step.inputs]
    states = []
    for s in c.checked.states:
        init = m._initial_value(s.name)
        init = float(init) if not isinstance(init, torch.Tensor) else float(init.mean())
        states.append(_random_like_state(init, (n,), gen).requires_grad_())
    learn = {p.name for p in step.learnable}
    pvals = []
    leaves = []
    for name, v in params.items():
        t = torch.as_tensor(float(v.detach()) if isinstance(v, torch.Tensor) else v, dtype=torch.float64)
        if name in learn:
            t = t.clone().requires_grad_()
            leaves.append(t)
        pvals.append(t)
    # the params derived from the declared ones (propagators of coupled `exact` states) are
    # leaves of the step too: learnable where they depend on a learnable param
    for name, v in zip(c.derived_names, c.with_derived([p.detach() for p in pvals])[len(pvals):]):
        t = torch.as_tensor(v, dtype=torch.float64).detach().clone()
        if name in learn:
            t.requires_grad_()
            leaves.append(t)
        pvals.append(t)
    outs = c.torch_module.core(*inputs, *states, *pvals)
    grads = [torch.randn(n, dtype=torch.float64, generator=gen) for _ in outs]
    wrt = [*inputs, *states, *leaves]
    diff_outs = [(o, g) for o, g in zip(outs, grads) if isinstance(o, torch.Tensor) and o.requires_grad]
    auto = torch.autograd.grad([o for o, _ in diff_outs], wrt, [g for _, g in diff_outs], allow_unused=True)
    auto = [torch.zeros(n, dtype=torch.float64) if a is None else a for a in auto]
    with torch.no_grad():
        derived = c.torch_backward(*[t.detach() for t in inputs], *[t.detach() for t in states], *grads,
                                   *[t.detach() for t in pvals])
    names = [*(s.name for s in step.inputs), *(s.name for s in step.states), *(p.name for p in step.learnable)]
    assert len(derived) == len(auto) == len(names)
    for name, a, d in zip(names, auto, derived):
        d = torch.as_tensor(d, dtype=torch.float64).expand_as(a) if not isinstance(d, torch.Tensor) or d.dim() == 0 \
            else d
        if name in learn:  # a learnable scalar param: autograd reduces over neurons
            d = d.sum() if d.dim() else d
            a = a.sum() if a.dim() else a
        assert torch.isfinite(a).all(), f"{c.name}: autograd d/d{name} not finite"
        err = (a - d).abs().max().item()
        scale = max(a.abs().max().item(), 1.0)
        assert err <= 1e-10 * scale, f"{c.name}: d/d{name} differs by {err:.3e} (scale {scale:.3e})"


@pytest.mark.parametrize("stem", flexdsl.library())
@pytest.mark.parametrize("detach_reset", [False, True])
def test_library_backward_equals_autograd(stem: str, detach_reset: bool) -> None:
    check_vjp(flexdsl.compile(stem, detach_reset=detach_reset))


@pytest.mark.parametrize("method", sorted(METHOD_MODELS))
def test_ode_methods_backward_equals_autograd(method: str) -> None:
    c = flexdsl.compile(ode_model(method))
    assert c.method == method
    for seed in range(3):
        check_vjp(c, seed)


def test_backward_is_linear_in_size_and_fast() -> None:
    """A cold build of the rk4 Hodgkin-Huxley backward stays small (SSA, not expanded): its size
    bounds the work (no wall time here: speed lives in bench/)."""
    text = flexdsl.compile("hodgkin_huxley").text.replace("neuron ", "neuron Cold", 1)
    c = flexdsl.compile(text)
    bw = c.backward
    ops = sum(sum(1 for _ in __import__("sympy").preorder_traversal(e)) for _, e in bw.assignments)
    fwd = sum(sum(1 for _ in __import__("sympy").preorder_traversal(e)) for _, e in c.step.assignments)
    assert ops < 12 * fwd, (ops, fwd)
