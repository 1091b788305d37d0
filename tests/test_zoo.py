"""SpikingJelly's model zoo with flexdsl neurons (issue 19): `spiking_vgg11_bn`, `sew_resnet18` and
`parametric_lif_net.MNISTNet` built with `spiking_neuron=partial(flexdsl.load, "lif")`, the zoo's own
keywords (`surrogate_function=surrogate.ATan()`, `detach_reset=True`) passed through, give the
outputs and gradients of the same nets built with SpikingJelly's `LIFNode`, and train the same.

SpikingJelly's `spiking_vgg` and `sew_resnet` import one torchvision helper at import time (to
download pretrained weights, never used here). torchvision cannot be installed beside the CPU
torch of the test environment, so where it is missing this file puts a stand-in module with that
one name in `sys.modules` before importing them (`_zoo`); the nets themselves are SpikingJelly's."""

from __future__ import annotations

import sys
import types
from functools import partial

import pytest
import torch

import flexdsl

from tolerances import tol


def _zoo():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        helper = types.ModuleType("torchvision._internally_replaced_utils")
        helper.load_state_dict_from_url = None  # (only for pretrained weights)
        sys.modules.setdefault("torchvision", types.ModuleType("torchvision"))
        sys.modules["torchvision._internally_replaced_utils"] = helper
    from spikingjelly.activation_based.model import parametric_lif_net, sew_resnet, spiking_vgg

    return parametric_lif_net, sew_resnet, spiking_vgg


def _build(arch: str, node):
    parametric_lif_net, sew_resnet, spiking_vgg = _zoo()
    from spikingjelly.activation_based import functional, surrogate

    torch.manual_seed(0)
    kw = {"spiking_neuron": node, "surrogate_function": surrogate.ATan(), "detach_reset": True}
    if arch == "spiking_vgg11_bn":
        net = spiking_vgg.spiking_vgg11_bn(num_classes=10, **kw)
    elif arch == "sew_resnet18":
        net = sew_resnet.sew_resnet18(cnf="ADD", num_classes=10, **kw)
    else:
        net = parametric_lif_net.MNISTNet(channels=8, **kw)
    functional.set_step_mode(net, "m")
    return net


def _run(net, x, y, opt):
    """One training step; returns the outputs and the parameters' gradients (before the update)."""
    from spikingjelly.activation_based import functional

    functional.reset_net(net)
    opt.zero_grad()
    torch.manual_seed(1)  # (the nets' dropout draws the same masks for both)
    out = net(x).mean(0)
    torch.nn.functional.cross_entropy(out, y).backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None and p.numel() < 2_000_000}
    opt.step()
    return out.detach(), grads


SHAPES = {"MNISTNet": (2, 2, 1, 28, 28), "sew_resnet18": (2, 2, 3, 32, 32), "spiking_vgg11_bn": (2, 2, 3, 32, 32)}
# float64 where it is cheap (then gradients agree to rounding); VGG's 120M weights in float32,
# where the deep nets' outputs and gradients agree to float32 sums in another order. The bound is
# the roundings along the longest path (tests/tolerances.py): the largest dot product (VGG: a
# 512 x 3 x 3 convolution, 4608 terms; a Linear of 25088 inputs) summed over the network's 11
# weight layers forward and back, 2 steps of LIF, 2 SGD steps: about 5e4 operations in float32
# (2 * 5e4 * 2^-24 = 6e-3); in float64 likewise 1e5 operations (2e-11).
DTYPES = {"MNISTNet": (torch.float64, tol(torch.float64, 1e5)), "sew_resnet18": (torch.float64, tol(torch.float64, 1e5)),
          "spiking_vgg11_bn": (torch.float32, tol(torch.float32, 5e4))}


@pytest.mark.parametrize("arch", list(SHAPES))
def test_zoo_nets_with_flexdsl_neurons_equal_spikingjellys(arch):
    from spikingjelly.activation_based import neuron

    ours = _build(arch, partial(flexdsl.load, "lif"))
    theirs = _build(arch, neuron.LIFNode)
    cells = [m for m in ours.modules() if isinstance(m, flexdsl.runtime.module.NeuronModule)]
    assert cells and all(c.compiled.options.surrogate == "atan(alpha=2.0)" and c.detach_reset for c in cells)
    assert all(m.surrogate_function.alpha == 2.0 for m in theirs.modules() if isinstance(m, neuron.LIFNode))
    ours.load_state_dict(theirs.state_dict(), strict=False)  # (the same weights; flexdsl's extra state stays)
    dtype, tol = DTYPES[arch]
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = torch.rand(*SHAPES[arch], generator=torch.Generator().manual_seed(2), dtype=dtype)
    y = torch.tensor([3, 7])
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.05)
    opt_b = torch.optim.SGD(theirs.parameters(), lr=0.05)
    for _ in range(2):  # two steps: the second runs on the weights each trained
        out_a, g_a = _run(ours, x, y, opt_a)
        out_b, g_b = _run(theirs, x, y, opt_b)
        torch.testing.assert_close(out_a, out_b, rtol=tol, atol=tol)  # (the bound: DTYPES)
        assert g_a.keys() == g_b.keys() and len(g_a) > 5
        scale = max(g.norm() for g in g_b.values())  # (a conv bias before a BatchNorm has no gradient but noise)
        for k in g_a:
            assert (g_a[k] - g_b[k]).norm() <= tol * (g_b[k].norm() + 1e-3 * scale), (k, (g_a[k] - g_b[k]).norm())
    assert any(g.abs().sum() > 0 for k, g in g_a.items() if "0.weight" in k)  # gradients reached the input layer
