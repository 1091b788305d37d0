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
