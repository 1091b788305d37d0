"""Trust on every path a model runs (issue 36): the checks of a neuron module's eager call hold
for a call after an in-place change of its params, for a `torch.compile`d call and for a
recurrent layer's call; the layer's own inputs (weights, mask, feedback) are checked at every
call. Each test is a class of failure with several instances: the same refusal (a located
`FlexDSLError`) wherever the eager module refuses, never a NaN or a silently different number."""

from __future__ import annotations

import pytest
import torch

import flexdsl
from flexdsl import FlexDSLError

# a param that is a denominator (0 in float32 below ~1.4e-45), and one inside an exp (beyond
# float32's range above ~88)
DIV = """neuron Div:
    input x
    param a = 1.0 learnable
    param b = 1.0
    param k = 1.0
    state v = 0.0
    update:
        v = 0.5 * v + x / (a * b) * exp(k)
    output v
"""
TINY, HUGE_EXP = 1e-50, 100.0
ZERO = "0 in float32|divides by zero"  # (the two checks that find a float32 zero)


def _compiled(m):
    torch._dynamo.reset()
    return torch.compile(m, fullgraph=True, backend="aot_eager")


def _paths():
    """(name, make a callable from a fresh module, input shape): the ways a module is called."""
    return [
        ("eager", lambda m: m, (4, 3)),
        ("compiled", _compiled, (4, 3)),
        ("layer", lambda m: flexdsl.recurrent(m, 3, 3, backend="torch"), (4, 2, 3)),
        ("compiled layer", lambda m: _compiled(flexdsl.recurrent(m, 3, 3, backend="torch")), (4, 2, 3)),
    ]


def _refused(f, x, match: str) -> None:
    with pytest.raises(FlexDSLError, match=match) as e:
        f(x)
    assert e.value.line > 0  # located at the param


@pytest.mark.parametrize("path", range(4), ids=[p[0] for p in _paths()])
def test_params_the_eager_call_refuses_are_refused_on_every_path(path):
    """Values loaded, assigned after a first call, or written in place (an optimizer step, an
    in-place op under no_grad) that are 0 or beyond the range of the call's precision, or NaN:
    refused on every path as the eager call refuses them."""
    _, wrap, shape = _paths()[path]
    x = torch.rand(*shape)
    # loaded with a value float32 cannot hold
    _refused(wrap(flexdsl.loads(DIV, b=TINY)), x, ZERO)
    _refused(wrap(flexdsl.loads(DIV, k=HUGE_EXP)), x, "float32")
    # assigned after a first call (the compiled graph exists; a new value is an input, not a guard)
    m = flexdsl.loads(DIV)
    f = wrap(m)
    f(x)
    with pytest.raises(FlexDSLError, match="float32"):
        m.k = HUGE_EXP
        f(x)
    m.k = 1.0
    # written in place after a first call: the learnable denominator made 0 in float32, then NaN
    for bad, match in ((TINY, ZERO), (float("nan"), "nan")):
        m = flexdsl.loads(DIV)
        f = wrap(m)
        assert torch.isfinite(f(x)).all()
        with torch.no_grad():
            m.a.fill_(bad)
        _refused(f, x, match)
        m.a = 2.0  # (a valid value through the API: the module works again)
        assert torch.isfinite(f(x)).all()


@pytest.mark.parametrize("path", range(4), ids=[p[0] for p in _paths()])
def test_an_optimizer_step_to_nan_is_refused_on_every_path(path):
    """A bounded learnable param (tau = 1 + softplus(raw_tau)) and an unbounded one whose
    Parameters an optimizer step sets to NaN (a NaN gradient): the next call is a located error
    naming the param, on every path."""
    _, wrap, shape = _paths()[path]
    x = torch.rand(*shape)
    for model, opts in (("lif", {"learnable": ["tau"]}), (DIV, {})):
        m = flexdsl.load(model, **opts) if model == "lif" else flexdsl.loads(model, **opts)
        f = wrap(m)
        f(x)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for p in m.parameters():
            p.grad = torch.full_like(p, float("nan"))
        opt.step()
        if hasattr(f, "reset"):
            f.reset()
        m.reset()
        _refused(f, x, "nan")


# ---------------------------------------------------------------- a recurrent layer's own inputs
def _layer(**kw):
    torch.manual_seed(0)
    return flexdsl.recurrent("lif", 3, 4, backend="torch", **kw)


def test_a_layers_mask_can_only_keep_or_remove_weights():
    """The mask is kept as bool: a write into it (through `.data`, in place, or a new tensor)
    cannot scale W_rec; a new mask is checked like the one given at construction."""
    x = torch.rand(6, 2, 3) * 4
    ones = _layer(mask=torch.ones(4, 4))
    plain = _layer()
    assert ones.mask.dtype == torch.bool and torch.equal(ones(x), plain(x))
    for write in (lambda m: m.data.fill_(1), lambda m: m.data.copy_(torch.full((4, 4), 3.0)),
                  lambda m: m.fill_(True)):
        ones.reset()
        plain.reset()
        write(ones.mask)
        assert torch.equal(ones(x), plain(x))  # (never 3 * W_rec)
    for bad in (torch.full((4, 4), 0.5), torch.ones(3, 3), "x", torch.tensor([[1 + 1j] * 4] * 4)):
        with pytest.raises(FlexDSLError, match="mask"):
            ones.mask = bad
    ones.mask = torch.eye(4)  # a valid new mask: bool, used
    assert ones.mask.dtype == torch.bool and int(ones.mask.sum()) == 4
    ones.mask = None
    ones.reset()
    plain.reset()
    assert torch.equal(ones(x), plain(x))


def test_a_layers_feedback_weights_and_options_are_checked():
    """Complex or integer feedback (assigned, or a tensor changed to it), weights set to None, a
    neuron option the layer cannot honour, a torch.func transform: located errors, never a silent
    drop (of an imaginary part, of an option) or a raw exception."""
    from torch.func import functional_call, grad, vmap

    x = torch.rand(5, 2, 3)
    m = _layer()
    for bad in (torch.zeros(2, 4, dtype=torch.complex64), torch.zeros(2, 4, dtype=torch.int64), 1.0):
        with pytest.raises(FlexDSLError, match="feedback"):
            m.feedback = bad
    m(x)
    m._states["feedback"] = torch.zeros(2, 4, dtype=torch.complex64)  # (around the assignment)
    with pytest.raises(FlexDSLError, match="feedback"):
        m(x)
    for name in ("W_rec", "W_in"):
        m = _layer()
        with pytest.raises(FlexDSLError, match=name):
            setattr(m, name, None)
        m.register_parameter(name, None)  # (around the assignment)
        with pytest.raises(FlexDSLError, match=name):
            m(x)
    for option in ("check_finite", "store_state_seqs"):
        with pytest.raises(FlexDSLError, match=option):
            flexdsl.recurrent(flexdsl.load("lif", **{option: True}), 3, 4)
        m = _layer()
        setattr(m.neuron, option, True)
        with pytest.raises(FlexDSLError, match=option):
            m(x)
    m = _layer()
    for transform in (lambda: grad(lambda xx: m(xx).sum())(x), lambda: vmap(m, in_dims=1, out_dims=1)(x),
                      lambda: grad(lambda p: functional_call(m, p, (x,)).sum())(dict(m.named_parameters()))):
        m.reset()
        with pytest.raises(FlexDSLError, match="torch.func"):
            transform()
