"""What a network rewritten by `flexdsl.save_spikes_as_bits(net, recompute=...)` keeps for its
backward (`flexdsl/runtime/recompute.py`): saved spikes as bits, normalizations ("norm") and the
products before them ("product") run again in the backward. The claim is exactness: the same
operations on the same values, so outputs, every gradient and the normalizations' statistics are
bitwise those of the network as it was; and what is left out is exactly the tensors named (their
sizes computed here from the shapes). Also: a large input kept as bits is unpacked for its weight
gradient a chunk at a time (`FLEXDSL_BITS_CHUNK_MB`)."""

from __future__ import annotations

import copy
import os

import pytest
import torch

import flexdsl
from flexdsl.runtime import recompute

T, B, H = 3, 2, 8
TRITON = os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
DEV = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available() else "cpu"
BACKENDS = ["auto", "triton"] if TRITON else ["auto"]
CHANNELS = (4, 8, 8)


def _net(backend: str, node: str = "flexdsl"):
    """SpikingJelly's multi-step conv -> BN -> neuron blocks, a max-pool of spikes, a classifier."""
    from spikingjelly.activation_based import functional, layer, neuron

    torch.manual_seed(0)
    mods: list = []
    c = 2
    for i, co in enumerate(CHANNELS):
        mods += [layer.Conv2d(c, co, 3, padding=1, bias=i == 1), layer.BatchNorm2d(co),
                 flexdsl.load("lif", backend=backend, step_mode="m") if node == "flexdsl" else neuron.LIFNode()]
        if i == 1:
            mods.append(layer.MaxPool2d(2))
        c = co
    mods += [layer.Flatten(), layer.Linear(CHANNELS[-1] * (H // 2) ** 2, 10)]
    net = torch.nn.Sequential(*mods)
    functional.set_step_mode(net, "m")
    return net.to(DEV)


def _x():
    g = torch.Generator().manual_seed(1)
    return (torch.rand(T, B, 2, H, H, generator=g) < 0.5).float().to(DEV)


def _step(net, x, backward=True):
    from spikingjelly.activation_based import functional

    functional.reset_net(net)
    for p in net.parameters():
        p.grad = None
    out = net(x)
    if backward:
        (out * torch.arange(10.0, device=out.device)).square().sum().backward()
    return out, [p.grad.clone() for p in net.parameters()] if backward else [], [b.clone() for b in net.buffers()]


def _same(a, b):
    return (torch.equal(a[0], b[0]) and len(a[1]) == len(b[1]) and all(torch.equal(u, v) for u, v in zip(a[1], b[1]))
            and all(torch.equal(u, v) for u, v in zip(a[2], b[2])))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [None, "norm", "product"])
def test_recomputing_gives_the_same_outputs_gradients_and_statistics(mode, backend):
    """Two training steps (the running statistics updated twice) of the rewritten network equal the
    plain network's bit for bit; with the Triton kernels (which keep the neuron's input itself) what
    is left out is each BN's output ("norm") and also each conv's output ("product"), and the max-pool's
    indices (both)."""
    plain = _net(backend)
    net = copy.deepcopy(plain)
    line = flexdsl.save_spikes_as_bits(net, recompute=mode)
    assert ("normalization(s)" in line) == (mode is not None)
    x = _x()
    for _ in range(2):
        assert _same(_step(net, x), _step(plain, x))
    rep = flexdsl.memory_report(net)
    act = [T * B * co * s * s * 4 for co, s in zip(CHANNELS, (H, H, H // 2))]  # (each block's output bytes)
    indices = T * B * CHANNELS[1] * (H // 2) ** 2 * 8  # (the max-pool's int64 indices: made again from its input)
    kernels = backend == "triton" or DEV == "cuda"  # (the Triton kernels keep the neuron's input itself)
    if mode is None:
        assert rep.left_out_bytes == indices
    elif kernels:
        assert rep.left_out_bytes == sum(act) * (2 if mode == "product" else 1) + indices
    else:  # (the CPU kernels keep a copy of their input; BN's input is still left out)
        assert rep.left_out_bytes == (sum(act) if mode == "product" else 0) + indices  # (the input is 0/1 too)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode, cheap", [("product", True), ("norm", True), ("norm", False)])
def test_a_product_of_a_real_valued_input_is_run_again_from_it(monkeypatch, backend, mode, cheap):
    """A real-valued input (an image) is kept as it is by its convolution (for the weight's
    gradient); with "product" the convolution's output is made again from it in the backward, not
    kept; with "norm" too where the convolution costs at most `CHEAP_MACS` multiply-adds a value (here
    2 channels x 3 x 3 = 18; `cheap=False` lowers the limit under it): the same bits, and that
    output's bytes left out besides the rest."""
    if not cheap:
        monkeypatch.setattr(recompute, "CHEAP_MACS", 17)
    plain = _net(backend)
    net = copy.deepcopy(plain)
    flexdsl.save_spikes_as_bits(net, recompute=mode)
    g = torch.Generator().manual_seed(4)
    x = torch.rand(T, B, 2, H, H, generator=g).to(DEV) * 2  # (not 0/1)
    for _ in range(2):
        assert _same(_step(net, x), _step(plain, x))
    act = [T * B * co * s * s * 4 for co, s in zip(CHANNELS, (H, H, H // 2))]
    indices = T * B * CHANNELS[1] * (H // 2) ** 2 * 8
    kernels = backend == "triton" or DEV == "cuda"  # (the Triton kernels keep the neuron's input: BN's output)
    if mode == "product":
        want = sum(act) * (2 if kernels else 1) + indices
    else:  # (each BN's output with the kernels, and the first convolution's output where it is cheap)
        want = (sum(act) if kernels else 0) + (act[0] if cheap else 0) + indices
    assert flexdsl.memory_report(net).left_out_bytes == want


def test_spikingjelly_nodes_and_evaluation_mode():
    """SpikingJelly's own LIFNode after the normalizations, and BN in evaluation mode (its running
    statistics normalize): the same bits as the plain network."""
    plain = _net("auto", node="sj")
    net = copy.deepcopy(plain)
    flexdsl.save_spikes_as_bits(net, recompute="product")
    x = _x()
    assert _same(_step(net, x), _step(plain, x))
    plain.eval()
    net.eval()
    assert _same(_step(net, x), _step(plain, x))
    assert flexdsl.memory_report(net).left_out_bytes > 0


@pytest.mark.parametrize("mode", [None, "norm"])
def test_saved_spikes_anywhere_are_kept_as_bits(monkeypatch, mode):
    """A max-pool keeps its input (a neuron's spikes) for its backward: kept as bits, 1/32 of it;
    its indices are made again from that input in the backward, which is unpacked once for both (the
    pool's op and the indices)."""
    from flexdsl.backends import packed

    monkeypatch.setattr(recompute, "_MIN_BITS", 1)
    plain = _net("auto")
    net = copy.deepcopy(plain)
    flexdsl.save_spikes_as_bits(net, recompute=mode)
    x = _x()
    ref = _step(plain, x)
    unpacked = []
    real = packed.unpack
    monkeypatch.setattr(packed, "unpack", lambda b, shape, dt: unpacked.append(tuple(shape)) or real(b, shape, dt))
    assert _same(_step(net, x), ref)
    rep = flexdsl.memory_report(net)
    pooled = (T * B, CHANNELS[1], H, H)  # (SpikingJelly's pool: the steps flattened into the batch)
    # (the pooled spikes, float32 before, and the network's 0/1 input, which its product checked (on a GPU
    # on the device: kept as bits if the check had finished before the forward did))
    pool, first = T * B * CHANNELS[1] * H * H * 4, T * B * 2 * H * H * 4
    # (and the 0/1 inputs the later products pack themselves: counted as the float32 values they hold)
    own = T * B * (CHANNELS[0] * H * H + (CHANNELS[1] + CHANNELS[2]) * (H // 2) ** 2) * 4
    assert rep.bits_bytes == pool + first + own or DEV == "cuda" and rep.bits_bytes == pool + own
    assert unpacked.count(pooled) == 1
    indices = T * B * CHANNELS[1] * (H // 2) ** 2 * 8  # (the pool's int64 indices, made again: in every mode)
    assert rep.left_out_bytes == indices if mode is None else rep.left_out_bytes >= indices


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("what", ["weight", "running_mean", "bias"])
def test_a_tensor_changed_between_forward_and_backward_is_an_error(what, backend):
    """A recomputation reads the weights and (in evaluation mode) the statistics as they are at the
    backward: changed in place since the forward, the backward raises (as autograd does for what it
    keeps) instead of giving another gradient. Where the plain network's backward does not read the
    changed tensor, the rewritten one either raises or gives the plain network's gradients."""
    outcomes = []
    for rewrite in (False, True):
        net = _net(backend)
        if rewrite:
            flexdsl.save_spikes_as_bits(net, recompute="product")
        if what == "running_mean":
            net.eval()
        out = net(_x())
        with torch.no_grad():
            if what == "weight":
                net[3].weight.add_(1.0)  # (the second conv: its input is 0/1 spikes)
            elif what == "bias":
                net[4].bias.add_(1.0)  # (the second BN's shift: its backward does not read it)
            else:
                net[4].running_mean.add_(1.0)
        try:
            out.square().sum().backward()
            outcomes.append([p.grad.clone() for p in net.parameters()])
        except RuntimeError as e:
            assert "modified" in str(e)
            outcomes.append(None)
    plain, rewritten = outcomes
    if plain is None or (what == "bias" and backend == "triton"):  # (the neuron's input recomputed from it)
        assert rewritten is None
    else:
        assert rewritten is None or all(torch.equal(u, v) for u, v in zip(plain, rewritten))


def test_two_backwards_and_two_forwards():
    """`retain_graph` runs the recomputations again (the same gradient twice); two forwards before
    one backward keep their own recipes."""
    plain = _net("auto")
    net = copy.deepcopy(plain)
    flexdsl.save_spikes_as_bits(net, recompute="product")
    x = _x()
    grads = []
    for n in (net, plain):
        n.zero_grad(set_to_none=True)
        out = n(x)
        out2 = n(x)  # (the neurons carry their state: another output)
        loss = out.square().sum() + out2.sum()
        loss.backward(retain_graph=True)
        loss.backward()
        grads.append([p.grad.clone() for p in n.parameters()])
    assert all(torch.equal(u, v) for u, v in zip(*grads))


def test_hooks_around_the_network_still_apply():
    """A saved-tensor hooks context around the network (e.g. `save_on_cpu`) still sees what the
    network keeps as it is; less than the plain network keeps."""
    seen = []

    def count(t):
        seen.append(t.numel() * t.element_size())
        return t

    plain = _net("auto")
    net = copy.deepcopy(plain)
    flexdsl.save_spikes_as_bits(net, recompute="product")
    x = _x()
    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        a = _step(plain, x)
    before = sum(seen)
    seen.clear()
    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        b = _step(net, x)
    assert _same(a, b) and 0 < sum(seen) <= before - flexdsl.memory_report(net).left_out_bytes


def test_a_bad_mode_is_a_located_error():
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.save_spikes_as_bits(_net("auto"), recompute="all")
    msg = str(e.value)
    assert "recompute='all'" in msg and "'norm'" in msg and "^" in msg


def test_a_rewritten_network_with_recompute_pickles():
    import io

    net = _net("auto")
    flexdsl.save_spikes_as_bits(net, recompute="product")
    x = _x()
    buf = io.BytesIO()
    torch.save(net, buf)
    a = _step(net, x)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert _same(_step(back, x), a) and flexdsl.memory_report(back).left_out_bytes > 0


# ----------------------------------------------------------------- the weight gradient in chunks
def test_a_large_input_is_unpacked_a_chunk_at_a_time(monkeypatch):
    """With FLEXDSL_BITS_CHUNK_MB=1, a Linear's and a conv's 0/1 inputs of several MiB are unpacked
    at most 1 MiB at a time; the weight gradients equal float64's within the sums' float32 bound."""
    from flexdsl.backends import packed
    from flexdsl.runtime import bits

    monkeypatch.setenv("FLEXDSL_BITS_CHUNK_MB", "1")
    sizes = []
    real = packed.unpack

    def spy(p, shape, dtype):
        sizes.append(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size())
        return real(p, shape, dtype)
    monkeypatch.setattr(packed, "unpack", spy)
    monkeypatch.setattr(bits, "unpack", spy)
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(16, 40, 700, generator=g) < 0.3).float()  # (1.7 MiB as float32)
    w = (torch.randn(96, 700, generator=g) * 0.1).requires_grad_()
    packed.mark_binary(x)
    y = packed.linear(x, w, None)
    gy = torch.randn(y.shape, generator=g)
    y.backward(gy)
    ref = gy.double().reshape(-1, 96).T @ x.double().reshape(-1, 700)
    eps = torch.finfo(torch.float32).eps
    bound = 640 * eps * (gy.double().abs().reshape(-1, 96).T @ x.double().reshape(-1, 700)) + 1e-30
    assert len(sizes) > 1 and max(sizes) <= 1 << 20
    assert ((w.grad.double() - ref).abs() <= bound).all()

    sizes.clear()
    xc = (torch.rand(48, 6, 40, 40, generator=g) < 0.3).float().requires_grad_()  # (1.8 MiB)
    wc = (torch.randn(5, 6, 3, 3, generator=g) * 0.1).requires_grad_()
    bc = torch.zeros(5, requires_grad=True)
    yc = bits.spike_conv(xc, wc, bc, 1, 1, 1, 1)
    gc = torch.randn(yc.shape, generator=g)
    yc.backward(gc)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (xc, wc, bc))
    torch.nn.functional.conv2d(xd, wd, bd, 1, 1).backward(gc.double())
    assert len(sizes) > 1 and max(sizes) <= 1 << 20
    # float32's bound on each sum: (its number of terms) * eps * (the sum of the terms' magnitudes)
    xa, wa = (t.detach().double().abs().requires_grad_() for t in (xc, wc))
    torch.nn.functional.conv2d(xa, wa, None, 1, 1).backward(gc.double().abs())
    n_w, n_x = 48 * 40 * 40, 5 * 3 * 3
    assert ((wc.grad.double() - wd.grad).abs() <= n_w * eps * wa.grad).all()
    assert ((xc.grad.double() - xd.grad).abs() <= n_x * eps * xa.grad + 1e-30).all()
    assert ((bc.grad.double() - bd.grad).abs() <= n_w * eps * gc.double().abs().sum((0, 2, 3))).all()


def test_a_bad_chunk_size_is_a_clear_error(monkeypatch):
    from flexdsl.backends import packed

    monkeypatch.setenv("FLEXDSL_BITS_CHUNK_MB", "0")
    with pytest.raises(flexdsl.FlexDSLError, match="FLEXDSL_BITS_CHUNK_MB"):
        packed.chunk_rows(10, 10, torch.float32)


@pytest.mark.skipif(not TRITON, reason="the Triton kernels' backward (interpreter or CUDA)")
def test_the_neurons_input_gradient_takes_the_memory_of_its_recomputed_input(monkeypatch):
    """With the Triton kernels, a neuron's input recomputed for its backward alone is where that
    backward writes the input's gradient (one activation less at the backward's peak): every
    block's neuron takes it, and the gradients are still the plain network's, bit for bit."""
    from flexdsl.backends import packed

    taken = []
    real = packed.take_donation
    monkeypatch.setattr(packed, "take_donation", lambda t: taken.append(real(t)) or taken[-1])
    plain = _net("triton")
    net = copy.deepcopy(plain)
    flexdsl.save_spikes_as_bits(net, recompute="norm")
    x = _x()
    assert _same(_step(net, x), _step(plain, x))
    assert taken.count(True) == len(CHANNELS)


class _Shifted(torch.nn.BatchNorm2d):
    def forward(self, x):
        return super().forward(x.flatten(0, 1)).view(x.shape) + 0.25


class _Noisy(torch.nn.BatchNorm2d):
    def forward(self, x):
        y = super().forward(x.flatten(0, 1)).view(x.shape)
        return y + 0.1 * torch.randn_like(y) if self.training else y


class _Counting(torch.nn.BatchNorm2d):
    def __init__(self, c):
        super().__init__(c)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        if self.training:
            self.seen += x.shape[0]
        return super().forward(x.flatten(0, 1)).view(x.shape)


@pytest.mark.parametrize("norm", [_Shifted, _Noisy, _Counting])
def test_a_batch_norm_with_a_forward_of_its_own_is_kept_as_it_is(norm):
    """A batch norm subclass with a forward of its own is not run again in the backward (it was, through
    that forward: one drawing random numbers gave another output, so wrong gradients; one updating a
    buffer of its own updated it twice): its output is kept. The network as it was, bit for bit."""
    torch.manual_seed(2)
    plain = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), norm(4)).to(DEV)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.lif = plain[0], plain[1], flexdsl.load("lif").to(DEV)

        def forward(self, x):
            y = self.conv(x.flatten(0, 1)).view(*x.shape[:2], 4, H, H)
            return self.lif(self.bn(y))
    a = Net()
    b = copy.deepcopy(a)
    line = flexdsl.save_spikes_as_bits(b, recompute="product")
    assert "0 normalization(s)" in line
    x = _x()
    for _ in range(2):
        outs = []
        for n in (a, b):
            n.lif.reset()
            n.zero_grad(set_to_none=True)
            torch.manual_seed(5)
            out = n(x)
            (out * torch.arange(out.numel(), device=out.device).view(out.shape)).sum().backward()
            outs.append((out, [p.grad.clone() for p in n.parameters()], [t.clone() for t in n.buffers()]))
        assert _same(*outs)
    assert flexdsl.memory_report(b).left_out_bytes == T * B * 4 * H * H * 4  # (the convolution's output alone)


def _bn_net(sj: bool):
    from spikingjelly.activation_based import layer

    torch.manual_seed(0)
    if sj:
        net = torch.nn.Sequential(layer.Conv2d(2, 8, 3, padding=1, step_mode="m"), layer.BatchNorm2d(8, step_mode="m"),
                                  torch.nn.GELU())  # (GELU saves its input: the normalization's output)
    else:
        net = torch.nn.Sequential(torch.nn.Conv2d(2, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.GELU())
    return net.to(DEV)


@pytest.mark.parametrize("sj", [False, True])
@pytest.mark.parametrize("mode", ["norm", "product"])
@pytest.mark.parametrize("hook", ["forward before", "pre after", "forward with kwargs after", "global"])
def test_a_batch_norm_with_hooks_is_kept_as_it_is(hook, mode, sj):
    """A batch norm whose call runs hooks of the user's (a forward hook registered before the rewrite, a
    pre-hook after it, a global one) was made again in the backward without them: a neuron's saved
    input other than the forward's, wrong gradients. A call with such hooks keeps its output; one
    without recomputes it (hooks are asked at each call). The network as it was, bit for bit."""
    a = _bn_net(sj)
    handles = []

    def add(n):
        if hook == "pre after":
            handles.append(n[1].register_forward_pre_hook(lambda m, i: (i[0] ** 2,)))
        elif hook == "forward with kwargs after":
            handles.append(n[1].register_forward_hook(lambda m, i, k, o: o * 1.5, with_kwargs=True))
        elif hook == "forward before":
            handles.append(n[1].register_forward_hook(lambda m, i, o: o * 1.5 + 0.25))
    if hook == "forward before":
        add(a)
    b = copy.deepcopy(a)
    flexdsl.save_spikes_as_bits(b, recompute=mode)
    if hook in ("pre after", "forward with kwargs after"):
        add(a)
        add(b)
    if hook == "global":
        handles.append(torch.nn.modules.module.register_module_forward_hook(
            lambda m, i, o: o * 1.5 if isinstance(m, torch.nn.BatchNorm2d) else None))
    x = torch.rand(T, B, 2, H, H, device=DEV)
    if not sj:
        x = x.flatten(0, 1)
    try:
        for n in (a, b):
            n.zero_grad(set_to_none=True)
            n(x).square().sum().backward()
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
        conv_out = T * B * 8 * H * H * 4  # (made again in either mode: "norm" remakes a cheap product of an image)
        assert flexdsl.memory_report(b).left_out_bytes == conv_out
    finally:
        for h in handles:
            h.remove()
    if hook != "forward before":  # (the copy's hook stays: its handle is the original's)
        b.zero_grad(set_to_none=True)
        b(x).square().sum().backward()  # (the hooks gone: the normalization's output is made again too)
        assert flexdsl.memory_report(b).left_out_bytes == 2 * conv_out


@pytest.mark.parametrize("mode", [None, "product"])
def test_an_unmarked_spike_input_is_checked_later_without_a_host_sync(mode):
    """A product's input of 0/1 values that no neuron marked (spikes upsampled by repetition) is
    checked (on a GPU: on the device, the forward making no host sync); once the check has finished
    (here: the device drained by a module before the next save) the input is kept as bits; with
    "product" the product's output is made again from those bits; gradients bitwise."""
    cuda = DEV == "cuda"

    class Drain(torch.nn.Module):
        def forward(self, x):
            if cuda:
                mode = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode(mode)
            return x

    torch.manual_seed(3)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 64), flexdsl.load("lif"), torch.nn.Upsample(scale_factor=2),
                                torch.nn.Linear(128, 32), Drain(), flexdsl.load("lif"),
                                torch.nn.Linear(32, 8)).to(DEV)
    net = copy.deepcopy(plain)
    flexdsl.save_spikes_as_bits(net, recompute=mode)
    x = torch.rand(6, 4, 64, device=DEV) * 3
    outs = []
    for n in (plain, net, net):
        for m in n:
            if hasattr(m, "reset"):
                m.reset()
        n.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            if n is net:
                torch.cuda.set_sync_debug_mode("error")
        try:
            out = n(x)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        out.square().sum().backward()
        outs.append((out, [p.grad.clone() for p in n.parameters()], []))
    assert _same(outs[0], outs[1]) and _same(outs[0], outs[2])
    rep = flexdsl.memory_report(net)
    assert rep.bits_bytes >= 6 * 4 * 128 * 4  # (the upsampled spikes, kept as bits)
    if mode == "product" and cuda:  # (the Triton neurons keep their input: the two products' outputs)
        assert rep.left_out_bytes >= 6 * 4 * (64 + 32) * 4


# ----------------------------------------------------------------- the conv layer for new code
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["norm", "product", None])
def test_conv_layer_equals_its_three_modules(backend, mode):
    """`flexdsl.conv_layer` = Conv2d -> BatchNorm2d -> neuron run one after the other (outputs,
    gradients, BN statistics bitwise, two training steps and one in evaluation mode); a second
    layer's spike input is kept as bits, and with the Triton kernels its BN output is left out."""
    torch.manual_seed(7)
    a = torch.nn.Sequential(flexdsl.conv_layer("lif", 2, 4, 3, padding=1, backend=backend, recompute=mode),
                            flexdsl.conv_layer("lif", 4, 4, 3, padding=1, stride=2, backend=backend,
                                               recompute=mode)).to(DEV)
    plain = [(copy.deepcopy(layer.conv), copy.deepcopy(layer.bn), flexdsl.load("lif", backend=backend).to(DEV))
             for layer in a]
    for conv, _, _ in plain:  # (the plain product: the bits class undone)
        conv.__class__ = torch.nn.Conv2d

    def run_plain(x):
        for conv, bn, lif in plain:
            y = bn(conv(x.flatten(0, 1)))
            x = lif(y.view(*x.shape[:2], *y.shape[1:]))
        return x
    params_plain = [p for conv, bn, _ in plain for p in (*conv.parameters(), *bn.parameters())]
    x = _x()
    for train in (True, True, False):
        outs = []
        for f, params, mods in ((a, list(a.parameters()), [a]), (run_plain, params_plain, [m for t in plain for m in t])):
            for m in mods:
                m.train(train)
            for layer in (a if f is a else [lif for _, _, lif in plain]):
                layer.reset()
            for p in params:
                p.grad = None
            out = f(x)
            (out * torch.arange(out.numel(), device=out.device).view(out.shape) % 7).sum().backward()
            bufs = [b.clone() for b in a.buffers()] if f is a else [b.clone() for _, bn, _ in plain for b in bn.buffers()]
            outs.append((out, [p.grad.clone() for p in params], bufs))
        assert _same(*outs)
    seen = []  # (what the second layer keeps, as a hooks context around it sees it)
    a[0].reset()
    a[1].reset()
    s = a[0](x)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append((t.dtype, t.numel())) or t, lambda t: t):
        a[1](s)
    assert (torch.uint8, T * B * 4 * H * H // 8) in seen  # (its spike input as bits)
    assert (torch.float32, T * B * 4 * H * H) not in seen
    rep = flexdsl.memory_report(a[1])
    if mode is not None and (backend == "triton" or DEV == "cuda"):
        assert rep.left_out_bytes >= T * B * 4 * (H // 2) ** 2 * 4  # (its BN output)


def test_conv_layer_bad_input_is_a_located_error():
    layer = flexdsl.conv_layer("lif", 2, 4, 3)
    with pytest.raises(flexdsl.FlexDSLError) as e:
        layer(torch.zeros(2, 2, 8, 8))
    assert "[T, B, C, H, W]" in str(e.value) and "^" in str(e.value)
    with pytest.raises(flexdsl.FlexDSLError, match="recompute='fast'"):
        flexdsl.conv_layer("lif", 2, 4, 3, recompute="fast")
    with pytest.raises(flexdsl.FlexDSLError, match="loaded"):
        flexdsl.conv_layer(flexdsl.load("lif", step_mode="m"), 2, 4, 3, tau=3.0)


@pytest.mark.parametrize("kw,says", [
    ({"in_channels": 0}, "in_channels=0"), ({"out_channels": -1}, "out_channels=-1"),
    ({"kernel_size": 0}, "kernel_size=0"), ({"kernel_size": (3, 3, 3)}, "kernel_size="),
    ({"stride": 0}, "stride=0"), ({"dilation": 1.5}, "dilation=1.5"), ({"padding": -1}, "padding=-1"),
    ({"padding": "bogus"}, "padding='bogus'"), ({"padding": "same", "stride": 2}, "stride 1"),
    ({"groups": 3}, "divides"), ({"groups": 0}, "groups=0"), ({"bias": "yes"}, "bias='yes'"),
    ({"eps": -1.0}, "eps=-1.0"), ({"eps": float("nan")}, "eps=nan"), ({"momentum": "x"}, "momentum='x'"),
    ({"momentum": 2.0}, "momentum=2.0")])
def test_conv_layer_bad_arguments_are_located_errors(kw, says):
    """Arguments nn.Conv2d or nn.BatchNorm2d refuse (bare torch errors, some only at the first call) or
    take silently (in_channels=0, kernel_size=0): located FlexDSLErrors with a hint, as feedforward's."""
    args = {"in_channels": 2, "out_channels": 4, "kernel_size": 3, **kw}
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.conv_layer("lif", args.pop("in_channels"), args.pop("out_channels"), args.pop("kernel_size"), **args)
    assert says in str(e.value) and "^" in str(e.value) and e.value.hint


@pytest.mark.parametrize("case", ["channels", "float64", "int", "kernel larger", "one value per channel"])
def test_conv_layer_bad_calls_are_located_errors(case):
    """An input the convolution or normalization cannot take was torch's bare error: a located one
    with a hint; the layer works on a good input after it (the same as its three modules)."""
    layer = flexdsl.conv_layer("lif", 2, 4, 5 if case == "kernel larger" else 3, padding=0)
    x = {"channels": torch.zeros(2, 2, 3, 8, 8), "float64": torch.zeros(2, 2, 2, 8, 8, dtype=torch.float64),
         "int": torch.zeros(2, 2, 2, 8, 8, dtype=torch.long), "kernel larger": torch.zeros(2, 2, 2, 3, 3),
         "one value per channel": torch.zeros(1, 1, 2, 3, 3)}[case]
    with pytest.raises(flexdsl.FlexDSLError) as e:
        layer(x)
    assert "^" in str(e.value) and e.value.hint
    good = (torch.rand(2, 2, 2, 8, 8) < 0.3).float()
    layer.reset()
    y = layer(good)
    ref = layer.bn(layer.conv(good.flatten(0, 1)))
    assert y.shape == (2, 2, 4, *ref.shape[2:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_normalization_output_changed_in_place_is_kept_as_it_is(backend):
    """The neuron's input written in place after the normalization (here `add_`) is no longer the
    normalization's output: it is kept as it is, not recomputed; the same bits as the plain network."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)
            self.lif = flexdsl.load("lif", backend=backend)

        def forward(self, x):
            z = self.bn(self.conv(x.flatten(0, 1)))
            z.add_(0.5)
            return self.lif(z.view(*x.shape[:2], *z.shape[1:]))
    torch.manual_seed(8)
    a = Net().to(DEV)
    b = copy.deepcopy(a)
    flexdsl.save_spikes_as_bits(b, recompute="product")
    x = _x()
    outs = []
    for n in (a, b):
        n.lif.reset()
        out = n(x)
        out.sum().backward()
        outs.append((out, [p.grad.clone() for p in n.parameters()], [t.clone() for t in n.buffers()]))
    assert _same(*outs)
    assert flexdsl.memory_report(b).left_out_bytes == T * B * 4 * H * H * 4  # (only the conv's output)


def test_two_threads_forwards_keep_their_own_sessions():
    """Two rewritten networks whose forwards overlap in two threads: the sessions were one global list,
    so the first to end was left behind (not on top) and took every later product's input outside
    any network (held, never freed). Each thread's own now: gradients are those of the networks run
    alone, and nothing is held after."""
    import threading
    import weakref

    from flexdsl.runtime import bits

    class Wait(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.started, self.go = threading.Event(), threading.Event()

        def forward(self, x):
            self.started.set()
            assert self.go.wait(30)
            return x

    def make(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), flexdsl.load("lif", step_mode="s"),
                                   torch.nn.Identity(), torch.nn.Linear(32, 4))
    plain = [make(0), make(1)]
    nets = [copy.deepcopy(n) for n in plain]
    for n in nets:
        flexdsl.save_spikes_as_bits(n, recompute="product")
    for n in (*plain, *nets):
        n[3] = Wait()
    xs = [torch.rand(16, 64) * 3, torch.rand(16, 64) * 3]
    errors = []

    def train(i):
        try:
            nets[i](xs[i]).square().sum().backward()
        except Exception as e:  # (reported below)
            errors.append(e)
    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    threads[0].start()
    assert nets[0][3].started.wait(30)
    threads[1].start()
    assert nets[1][3].started.wait(30)
    nets[0][3].go.set()  # (the first ends while the second runs)
    threads[0].join(30)
    nets[1][3].go.set()
    threads[1].join(30)
    assert not errors
    for n, p, x in zip(nets, plain, xs):
        p[3].go.set()
        p(x).square().sum().backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(n.parameters(), p.parameters()))
    w = torch.randn(4, 64, requires_grad=True)
    x = (torch.rand(8, 64) < 0.3).float()
    ref = weakref.ref(x)
    bits.spike_linear(x, w, None).sum().backward()  # (outside any network: no session takes it)
    del x
    assert ref() is None
