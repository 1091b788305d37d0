"""The Triton backend's delay kernels at their edges, against the torch backend: an empty batch, a
second derivative (create_graph=True), and the other corners a probe of the learnable delays found
wrong once."""

from __future__ import annotations

import pytest
import torch

import flexdsl
from flexdsl import backends

pytestmark = pytest.mark.skipif(not backends.get("triton").available(),
                                reason="needs the Triton backend (a GPU or TRITON_INTERPRET=1)")
F, H, D = 4, 5, 4
LINES = {"gauss synaptic": f"delay synaptic max {D} learnable", "gauss axonal": f"delay axonal max {D} learnable",
         "gauss dendritic": f"delay dendritic max {D} learnable",
         "linear synaptic": f"delay synaptic max {D} learnable linear", "fixed synaptic": f"delay synaptic max {D}"}


def _pair(line: str, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the layer on the Triton backend, the same layer on the torch backend in float64)."""
    torch.manual_seed(seed)
    text = (f"layer L:\n    neuron lif\n    size {H}\n    input s size {F}\n    synapses W from s to x:\n"
            f"        {line}\n        bias b\n")
    kw = {} if "learnable" in line else {"delays": {"W": torch.randint(0, D + 1, (H, F))}}
    tri = flexdsl.loads(text, backend="triton", **kw)
    ref = flexdsl.loads(text, backend="torch", **kw).double()
    ref.load_state_dict(tri.state_dict())
    return tri, ref


@pytest.mark.parametrize("kind", list(LINES))
def test_an_empty_batch_runs_through_the_delay_kernels(kind):
    """A batch of 0 (`[T, 0, n]`) through a Triton layer's delays gives an empty current, the
    gradients of the weights and delays zeros, and the next empty call runs too (the fused gauss op
    reshaped its empty history with -1: an error)."""
    tri, ref = _pair(LINES[kind])
    x = torch.rand(6, 0, F, requires_grad=True)
    out = tri.current(x)
    assert out.shape == ref.current(x.detach().double()).shape == (6, 0, H)
    out.sum().backward()
    assert x.grad.shape == x.shape and not tri.W.grad.any()
    assert tri.current(torch.rand(2, 0, F)).shape == (2, 0, H)


@pytest.mark.parametrize("kind", list(LINES))
def test_second_derivatives_through_the_delay_kernels_are_a_located_error(kind):
    """A gradient penalty (the input's gradient made with create_graph=True, then differentiated to
    the weights) through a Triton layer's delay kernels: their backward is a kernel, so it is a located
    FlexDSLError, never the silently partial second derivative (dendritic gauss delays gave the wrong
    weight gradient and no delay gradient) or an unlocated torch error. The torch backend's works."""
    tri, ref = _pair(LINES[kind])
    x = torch.rand(6, 2, F, generator=torch.Generator().manual_seed(1))
    xr = x.double().requires_grad_()
    gx, = torch.autograd.grad(ref.current(xr).square().sum(), xr, create_graph=True)
    assert torch.autograd.grad(gx.square().sum(), ref.W)[0].abs().sum() > 0
    xt = x.requires_grad_()
    with pytest.raises(flexdsl.FlexDSLError, match="second-order"):
        gx, = torch.autograd.grad(tri.current(xt).square().sum(), xt, create_graph=True)
        torch.autograd.grad(gx.square().sum(), tri.W)


@pytest.mark.parametrize("kind", list(LINES))
def test_delayed_synapses_under_autocast_give_the_torch_backends_dtype(kind):
    """Under torch.autocast a Triton layer's delayed current and spikes have the dtype the torch
    backend's have (autocast's, as F.linear's): the sparse synaptic kernels (fixed and linear delays)
    gave float32, and the layer's spikes with it."""
    tri, ref = _pair(LINES[kind])
    ref = ref.float()
    x = (torch.rand(6, 3, F, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cur, want_cur = tri.current(x), ref.current(x)
        tri.reset()
        ref.reset()
        spikes, want = tri(x), ref(x)
    assert cur.dtype == want_cur.dtype == torch.bfloat16
    assert spikes.dtype == want.dtype == torch.bfloat16


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("line", [f"delay synaptic max {D} learnable", "delay 2"])
def test_a_call_of_no_steps_through_delayed_recurrent_synapses_back_propagates(backend, line):
    """A recurrent layer whose recurrent synapses have delays, called on no steps (`[0, B, n]`, a
    chunked loop's empty remainder): its empty output is of the graph as a layer's without delays is,
    so a loss of it back-propagates (was a constant: "element 0 of tensors does not require grad")
    and the next call runs as the first."""
    text = (f"layer L:\n    neuron lif\n    size {H}\n    input s size {F}\n    synapses W from s to x:\n"
            f"        bias b\n    synapses R from spike to x:\n        {line}\n")
    m = flexdsl.loads(text, backend=backend)
    x = torch.rand(0, 3, F, requires_grad=True)
    out = m(x)
    assert out.shape == (0, 3, H) and out.requires_grad
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert m(torch.rand(2, 3, F)).shape == (2, 3, H)
