"""Spikes saved as bits under what an attacker tries (issue 35's bad input): graded outputs, autocast,
torch.func's transforms, TorchScript, the switch and the memory report. Reference: the same network
without the rewrite (or with the bits off), same inputs: outputs and gradients equal, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import flexdsl
from flexdsl import FlexDSLError
from flexdsl.runtime import bits
from tests.tolerances import assert_close


def _grads(net: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in net.parameters()]


def _reset(net: nn.Module) -> None:
    for m in net.modules():
        if m is not net and hasattr(m, "reset") and callable(m.reset):
            m.reset()


@pytest.mark.parametrize("surrogate", ["Sigmoid", "ATan"])
def test_spikingjelly_nodes_with_graded_outputs_are_not_taken_for_spikes(surrogate):
    """`surrogate_function=Sigmoid(spiking=False)`: the node outputs the surrogate's value, not 0/1;
    packing it as spikes changed the next layer's weight gradient (by ~1.3)."""
    from spikingjelly.activation_based import functional, neuron
    from spikingjelly.activation_based import surrogate as sg

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), neuron.LIFNode(surrogate_function=getattr(sg, surrogate)(spiking=False)),
                        nn.Linear(32, 4))
    ref = copy.deepcopy(net)
    line = flexdsl.save_spikes_as_bits(net)
    assert "graded output" in line and "0 SpikingJelly node(s) known" in line
    x = torch.randn(2, 16) * 3
    outs = []
    for n in (net, ref):
        functional.reset_net(n)
        y = n(x)
        y.sum().backward()
        outs.append(y)
    assert not bool(((outs[1] == 0) | (outs[1] == 1)).all())  # (the node's output is graded indeed)
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(_grads(net), _grads(ref)))


@pytest.mark.parametrize("mode", ["norm", "product"])
def test_recomputed_products_run_under_the_forwards_autocast(mode):
    """A product or normalization made again in the backward runs under the autocast its forward ran
    under (it failed with a dtype error): the gradients of the network as written, bit for bit."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), flexdsl.load("lif", step_mode="s"),
                        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), flexdsl.load("lif", step_mode="s"),
                        nn.Flatten(), nn.Linear(8 * 64, 3))
    ref = copy.deepcopy(net)
    flexdsl.save_spikes_as_bits(net, recompute=mode)
    x = torch.rand(2, 3, 8, 8)
    outs = []
    for n in (net, ref):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = n(x)
        y.float().sum().backward()
        outs.append(y)
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(_grads(net), _grads(ref)))
    layer = flexdsl.conv_layer("lif", 3, 4, 3, padding=1, recompute=mode)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer((torch.rand(2, 2, 3, 8, 8) < 0.3).float())
    y.float().sum().backward()
    assert all(p.grad is not None for p in layer.parameters() if p.requires_grad)


def _func_nets():
    torch.manual_seed(1)
    ff = nn.Sequential(flexdsl.feedforward("lif", 4, 6, backend="torch"),
                       flexdsl.feedforward("lif", 6, 3, backend="torch"))
    rewritten = nn.Sequential(nn.Linear(4, 6), flexdsl.load("lif", step_mode="s", backend="torch"), nn.Linear(6, 3))
    flexdsl.save_spikes_as_bits(rewritten)
    return [(ff, torch.rand(5, 2, 4)), (rewritten, torch.rand(2, 4))]


@pytest.mark.parametrize("case", [0, 1])
def test_torch_func_transforms_run_and_equal_autograd(case):
    """`torch.func.grad` and `vmap(grad)` of flexdsl layers and of a rewritten network: the plain
    products, the gradients autograd gives (they failed: an autograd.Function without setup_context,
    a data-dependent check)."""
    from torch.func import functional_call, grad, vmap

    net, x = _func_nets()[case]
    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss(p, xx):
        _reset(net)
        return functional_call(net, p, (xx,)).sum()

    g = grad(loss)(params, x)
    _reset(net)
    net.zero_grad()
    net(x).sum().backward()
    ops = 5 * (6 * 4 + 3 * 6) * 8  # (at most 5 steps of two layers' products and neuron steps, forward and back)
    for k, p in net.named_parameters():
        assert_close(g[k], p.grad, ops=ops, scale=max(float(p.grad.abs().max()), 1.0))
    xs = torch.stack([x, x * 0.5])
    gv = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    for k in params:
        assert_close(gv[k][0], g[k], ops=ops, scale=max(float(g[k].abs().max()), 1.0))


def test_torchscript_and_non_modules_are_left_or_refused():
    scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)))
    line = flexdsl.save_spikes_as_bits(scripted)
    assert "nothing changed" in line and "TorchScript" in line
    assert scripted(torch.rand(2, 4)).shape == (2, 2)
    for f in (flexdsl.save_spikes_as_bits, flexdsl.memory_report):
        with pytest.raises(FlexDSLError, match="torch.nn.Module"):
            f(5)


def test_the_report_counts_the_bits_products_keep_and_the_switch_turns_them_off():
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(64, 256), flexdsl.load("lif"), nn.Linear(256, 128), flexdsl.load("lif"),
                        nn.Linear(128, 10))
    flexdsl.save_spikes_as_bits(net)
    x = torch.rand(4, 32, 64)
    net(x).sum().backward()
    rep = flexdsl.memory_report(net)
    # (the two later products' 0/1 inputs, [4, 32, 256] and [4, 32, 128], as the float32 values they hold)
    assert rep.n_bits == 2 and rep.bits_bytes == 4 * 32 * (256 + 128) * 4
    _reset(net)
    was = bits.ENABLED
    try:
        bits.ENABLED = False
        net(x).sum().backward()
        rep = flexdsl.memory_report(net)
        assert rep.n_bits == 0 and rep.bits_bytes == 0
    finally:
        bits.ENABLED = was


def test_a_value_that_is_not_0_or_1_never_spills_into_its_neighbours_bits():
    from flexdsl.backends import packed

    x = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.0, 0.0, 2.5, 0.0, 1.0])
    back = packed.unpack(packed.pack(x), x.shape, x.dtype)
    assert torch.equal(back, (x != 0).float())


def test_layers_the_rewrite_leaves_are_named():
    """A lazy Linear before its first forward (it becomes a plain Linear then: a rewrite would be
    undone) and torch's recurrent layers are left as they are, and the line says so."""
    net = nn.Sequential(nn.LazyLinear(4), nn.RNN(3, 3))
    line = flexdsl.save_spikes_as_bits(net)
    assert line.startswith("flexdsl.save_spikes_as_bits: 0 product(s)") and "left as they are: 0, 1" in line


def test_a_recurrent_layer_refuses_the_feedforward_options():
    """Each with a hint of its own: sparse_input's said to write a .layer file's `delay` line (which a
    .layer recurrent layer refuses too)."""
    for k, v, hint in (("sparse_input", True, "leave sparse_input out"), ("rule", "stdp_additive", "rule="),
                       ("delay", 3, "`delay` line")):
        with pytest.raises(FlexDSLError, match=f"`{k}` is an option of flexdsl.feedforward") as e:
            flexdsl.recurrent("lif", 3, 4, **{k: v})
        assert hint in e.value.hint and (k == "delay") == ("delay" in e.value.hint)


def _sj_step(net: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from spikingjelly.activation_based import functional

    functional.reset_net(net)
    net.zero_grad(set_to_none=True)
    y = net(x)
    (y * torch.linspace(0.1, 1.0, y.shape[-1])).square().sum().backward()
    return y, _grads(net)


@pytest.mark.parametrize("mode", [None, "product"])
@pytest.mark.parametrize("where", ["node", "identity", "flatten", "global"])
def test_a_hook_that_returns_other_values_leaves_them_unmarked(where, mode):
    """A user's forward hook on a SpikingJelly node, an Identity or a Flatten that returns graded
    values (`out * 2`), registered before the rewrite: the rewrite's marking ran after it and marked
    them 0/1, so the next Linear's weight gradient came out halved. The network as it was, bit for bit."""
    from spikingjelly.activation_based import functional, layer, neuron

    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(64, 256), neuron.LIFNode(), nn.Identity(), nn.Flatten(start_dim=2),
                        layer.Linear(256, 10))
    functional.set_step_mode(net, "m")
    ref = copy.deepcopy(net)
    handles = []
    for n in (net, ref):
        if where != "global":
            handles.append(n[{"node": 1, "identity": 2, "flatten": 3}[where]].register_forward_hook(
                lambda m, a, out: out * 2.0))
    flexdsl.save_spikes_as_bits(net, recompute=mode)
    if where == "global":  # (runs before a module's own hooks: what the node returned is not known)
        handles.append(nn.modules.module.register_module_forward_hook(
            lambda m, a, out: out * 2.0 if isinstance(m, neuron.LIFNode) else None))
    x = torch.rand(4, 8, 64) * 4
    try:
        got, want = _sj_step(net, x), _sj_step(ref, x)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(got[0], want[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


@pytest.mark.parametrize("case", ["nn.Sigmoid", "function", "set_spiking_mode later", "assigned later"])
def test_a_node_spikes_0_1_only_while_its_surrogate_is_spikingjellys_in_spiking_mode(case):
    """A node whose surrogate has no spiking mode (`nn.Sigmoid()`, `torch.tanh`: graded output) was
    taken for 0/1 by the permissive default of a check made once at the rewrite; so was one switched
    to `spiking=False` after it. Each call decides: the network as it was, bit for bit."""
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    sg = {"nn.Sigmoid": nn.Sigmoid(), "function": torch.tanh}.get(case, surrogate.Sigmoid())
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(64, 256), neuron.LIFNode(surrogate_function=sg), layer.Linear(256, 10))
    functional.set_step_mode(net, "m")
    ref = copy.deepcopy(net)
    line = flexdsl.save_spikes_as_bits(net)
    assert ("0 SpikingJelly node(s) known" in line) == (case in ("nn.Sigmoid", "function"))
    for n in (net, ref):
        if case == "set_spiking_mode later":
            n[1].surrogate_function.set_spiking_mode(False)
        elif case == "assigned later":
            n[1].surrogate_function = surrogate.Sigmoid(spiking=False)
    x = torch.rand(4, 8, 64) * 4
    got, want = _sj_step(net, x), _sj_step(ref, x)
    assert torch.equal(got[0], want[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_the_report_does_not_count_a_view_of_a_parameter():
    """A Linear of a 3-D input that needs a gradient saves `weight.t()`, a view of the weight: resident
    anyway, it was counted as kept activation memory (all of the weight's bytes). Reference: what the
    plain Linear saves, less what shares a parameter's memory."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 512))
    ref = copy.deepcopy(net)
    flexdsl.save_spikes_as_bits(net)
    x0 = torch.rand(2, 3, 256, requires_grad=True)
    for _ in range(3):  # (an input from earlier layers, not a leaf; after two, not checked for 0/1)
        net(x0 * 2).sum().backward()
    weight = ref[0].weight.untyped_storage().data_ptr()
    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() != weight and not isinstance(t, nn.Parameter):
            saved.append(t.numel() * t.element_size())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ref(x0 * 2).sum().backward()
    rep = flexdsl.memory_report(net)
    assert rep.kept_bytes == sum(saved) and rep.n_kept == len(saved) > 0


@pytest.mark.parametrize("mode", [None, "product"])
def test_a_second_derivative_through_bits_is_a_flexdsl_error_and_bits_off_runs_it(mode):
    """A gradient penalty (`create_graph=True`, then backward through the input's gradient) through a
    product that kept its input as bits raised a bare 'differentiate twice ... once_differentiable';
    now a FlexDSLError naming the way out, which gives the network's own gradients, bit for bit."""
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    torch.manual_seed(0)
    net = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1), layer.BatchNorm2d(4),
                        neuron.LIFNode(surrogate_function=surrogate.Sigmoid()), layer.MaxPool2d(2),
                        layer.Conv2d(4, 4, 3, padding=1), layer.BatchNorm2d(4),
                        neuron.LIFNode(surrogate_function=surrogate.Sigmoid()))
    functional.set_step_mode(net, "m")
    ref = copy.deepcopy(net)
    flexdsl.save_spikes_as_bits(net, recompute=mode)
    x0 = torch.rand(2, 2, 2, 16, 16) * 2

    def penalty(n):
        functional.reset_net(n)
        n.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        out = n(x)
        loss = (out * torch.linspace(0, 1, out.numel()).view(out.shape)).sum()
        gx, = torch.autograd.grad(loss, x, create_graph=True)
        (gx.square().sum() + loss).backward()
        return _grads(n)
    with pytest.raises(FlexDSLError, match="second derivative") as e:
        penalty(net)
    assert "flexdsl.runtime.bits.ENABLED = False" in str(e.value)
    was = bits.ENABLED
    try:
        bits.ENABLED = False
        got = penalty(net)
    finally:
        bits.ENABLED = was
    assert all(torch.equal(a, b) for a, b in zip(got, penalty(ref)))
