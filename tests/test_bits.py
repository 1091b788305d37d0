"""Spikes saved as bits (`runtime/bits.py`): packing is exact, a feed-forward layer's product saves
its 0/1 input as bits (32x fewer bytes than float32) with outputs and gradients equal to the plain
product's, and a non-binary input is saved as it is."""

from __future__ import annotations

import pytest
import torch

import flexdsl
from flexdsl.runtime import bits
from tests.tolerances import assert_close


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (3, 5, 13), (2, 0, 4)])
def test_pack_and_unpack_are_exact(shape):
    torch.manual_seed(0)
    x = (torch.rand(shape) < 0.4).float()
    p = bits.pack(x)
    assert p.dtype == torch.uint8 and p.numel() == (x.numel() + 7) // 8
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        assert torch.equal(bits.unpack(p, x.shape, dt), x.to(dt))
        assert torch.equal(bits.pack(x.to(dt)), p)  # (packed from any float dtype: the same bytes)
    if x.numel():
        assert torch.equal(bits.pack(torch.ones(x.shape))[: x.numel() // 8], torch.full((x.numel() // 8,), 255,
                                                                                         dtype=torch.uint8))


def _saved_bytes(fn):
    """The bytes autograd saves while `fn()` runs (every tensor a saved-tensor hook sees)."""
    total = [0]

    def pack_hook(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        out = fn()
    return out, total[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_layer_saves_its_spike_input_as_bits_with_the_same_results(dtype):
    torch.manual_seed(1)
    T, B, F, H = 12, 4, 64, 16
    m = flexdsl.feedforward("lif", F, H, backend="torch").to(dtype)
    x = (torch.rand(T, B, F) < 0.3).to(dtype).requires_grad_()
    y, saved = _saved_bytes(lambda: m.current(x))
    m.reset()
    ref, ref_saved = _saved_bytes(lambda: torch.nn.functional.linear(x, m.W, m.bias))
    assert torch.equal(y, ref)
    # the plain product saves x (T*B*F values) and W; the layer W and T*B*F bits
    assert ref_saved - saved == x.numel() * x.element_size() - x.numel() // 8
    g = torch.randn_like(y)
    got = torch.autograd.grad((y * g).sum(), [x, m.W, m.bias])
    want = torch.autograd.grad((ref * g).sum(), [x, m.W, m.bias])
    for a, r in zip(got, want):
        assert_close(a, r, ops=T * B + F)


def test_a_real_valued_input_is_saved_as_it_is():
    torch.manual_seed(2)
    m = flexdsl.feedforward("lif", 8, 4, backend="torch").double()
    x = torch.rand(5, 3, 8, dtype=torch.float64)
    x[0, 0, 0] = 0.5
    (y, saved) = _saved_bytes(lambda: m.current(x))
    assert saved >= x.numel() * 8  # (x itself)
    g = torch.randn_like(y)
    (gw,) = torch.autograd.grad((y * g).sum(), [m.W])
    assert_close(gw, g.reshape(-1, 4).T @ x.reshape(-1, 8), ops=15)


def test_every_library_model_trains_the_same_with_bits():
    """A feed-forward layer of each library model: outputs and the weight's gradient with the input
    saved as bits equal those of the plain product (the neuron's own saved values unchanged)."""
    torch.manual_seed(3)
    x = (torch.rand(10, 2, 12) < 0.5).double()
    for stem in flexdsl.library():
        m = flexdsl.feedforward(stem, 12, 5, backend="torch").double()
        with torch.no_grad():
            m.W.mul_(8.0)
        y = m(x)
        y = y[0] if isinstance(y, tuple) else y
        (gw,) = torch.autograd.grad(y.sum(), [m.W], allow_unused=True)
        m.reset()
        cur = torch.nn.functional.linear(x, m.W, m.bias)  # the plain product, through the same neuron
        r = m.neuron(cur)
        r = r[0] if isinstance(r, tuple) else r
        (rw,) = torch.autograd.grad(r.sum(), [m.W], allow_unused=True)
        assert torch.equal(y, r), stem
        if rw is None:
            assert gw is None or not gw.any(), stem
        else:
            assert_close(gw, rw, ops=20 * 10 * 2, what=stem)


def test_a_neurons_spikes_skip_the_check_until_written(monkeypatch):
    """A flexdsl neuron's spike output is 0/1 by construction: the next layer's product packs it
    without the check (one pass and, on a GPU, a host sync); once written in place it is checked."""
    torch.manual_seed(4)
    a = flexdsl.feedforward("lif", 16, 32, backend="torch")
    b = flexdsl.feedforward("lif", 32, 8, backend="torch")
    with torch.no_grad():
        a.W.mul_(6.0)
    s = a((torch.rand(6, 2, 16) < 0.5).float())
    checks = []
    real_all = torch.Tensor.all

    def counting_all(self, *args, **kw):
        checks.append(1)
        return real_all(self, *args, **kw)

    monkeypatch.setattr(torch.Tensor, "all", counting_all)
    y1, saved1 = _saved_bytes(lambda: b.current(s))
    assert not checks  # (a neuron's spikes: no check)
    s.mul_(1.0)  # (a write: the version changes)
    y2, saved2 = _saved_bytes(lambda: b.current(s))
    assert len(checks) == 1  # (checked after the write)
    assert torch.equal(y1, y2) and saved1 == saved2  # (both packed: still 0/1)
    s.mul_(0.5)
    _, saved3 = _saved_bytes(lambda: b.current(s))
    assert saved3 - saved1 == s.numel() * 4 - s.numel() // 8  # (no longer 0/1: saved as it is)


def _sj_net():
    from spikingjelly.activation_based import layer, neuron

    return torch.nn.Sequential(
        layer.Conv2d(2, 8, 3, padding=1, step_mode="m"), layer.BatchNorm2d(8, step_mode="m"),
        neuron.LIFNode(step_mode="m"),
        layer.Conv2d(8, 8, 3, padding=1, bias=False, padding_mode="circular", step_mode="m"),
        layer.BatchNorm2d(8, step_mode="m"), neuron.IFNode(step_mode="m"),
        layer.Flatten(step_mode="m"), layer.Linear(8 * 6 * 6, 10, step_mode="m"), neuron.LIFNode(step_mode="m"))


def _train_step(net, x):
    from spikingjelly.activation_based import functional

    functional.reset_net(net)
    y, saved = _saved_bytes(lambda: net(x))
    (y * torch.arange(10.0, dtype=y.dtype)).sum().backward()
    return y, [p.grad.clone() for p in net.parameters()], saved


def test_save_spikes_as_bits_rewrites_a_spikingjelly_network_with_the_same_results():
    """One line on an existing SpikingJelly network: outputs and every gradient bitwise those of the
    network before; the products after a spiking layer save their input as bits."""
    import copy

    torch.manual_seed(5)
    a = _sj_net().double()
    b = copy.deepcopy(a)
    report = flexdsl.save_spikes_as_bits(b)
    assert report.startswith("flexdsl.save_spikes_as_bits: 3 product(s)") and "3 SpikingJelly node(s)" in report
    assert [type(m).__name__ for m in b if "Conv" in type(m).__name__ or "Linear" in type(m).__name__] == \
        ["BitsConv2d", "BitsConv2d", "BitsLinear"]
    x = torch.rand(4, 3, 2, 6, 6, dtype=torch.float64) * 3  # (real-valued: the first product saves it as it is)
    ya, ga, sa = _train_step(a, x)
    yb, gb, sb = _train_step(b, x)
    assert torch.equal(ya, yb) and all(torch.equal(u, v) for u, v in zip(ga, gb))
    # the two later products' inputs: the circularly padded spikes (T * B * 8 channels * 8 * 8) and the
    # flattened ones (T * B * 288), float64 before, one bit each now
    conv, lin = 4 * 3 * 8 * 8 * 8, 4 * 3 * 288
    assert sa - sb == (conv * 8 - conv // 8) + (lin * 8 - lin // 8)
    assert flexdsl.save_spikes_as_bits(b).startswith("flexdsl.save_spikes_as_bits: 3 product(s)")  # (again: the same)


def test_save_spikes_as_bits_leaves_what_it_cannot_serve_and_says_so():
    class OwnLinear(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2.0

    net = torch.nn.Sequential(OwnLinear(4, 4), flexdsl.load("lif"), torch.nn.Linear(4, 2))
    report = flexdsl.save_spikes_as_bits(net)
    assert "1 product(s)" in report and "left as they are: 0" in report
    assert type(net[0]) is OwnLinear and type(net[2]).__name__ == "BitsLinear"
    import copy

    plain = copy.deepcopy(net)
    for m in plain:
        if type(m).__name__ == "BitsLinear":
            m.__class__ = torch.nn.Linear
    x = torch.rand(5, 3, 4) * 4
    assert torch.equal(net(x), plain(x))


def test_a_rewritten_network_pickles_and_loads_back_in_another_process(tmp_path):
    """torch.save of the whole rewritten module, torch.load in a fresh interpreter: the same classes
    (made again by name), the same outputs."""
    import subprocess
    import sys

    torch.manual_seed(6)
    net = _sj_net()
    flexdsl.save_spikes_as_bits(net)
    x = torch.rand(2, 2, 2, 6, 6)
    torch.save({"net": net, "x": x}, tmp_path / "net.pt")
    from spikingjelly.activation_based import functional

    functional.reset_net(net)
    torch.save(net(x), tmp_path / "y.pt")
    code = ("import torch\nfrom spikingjelly.activation_based import functional\n"
            f"d = torch.load({str(tmp_path / 'net.pt')!r}, weights_only=False)\n"
            "net = d['net']\nfunctional.reset_net(net)\n"
            f"assert torch.equal(net(d['x']), torch.load({str(tmp_path / 'y.pt')!r}))\n"
            "print(type(net[0]).__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent.parent)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["BitsConv2d"]


def test_a_rewritten_subclass_defined_in_a_script_pickles(tmp_path):
    """A Linear subclass defined in the training script (`__main__`; a name with underscores): its Bits
    class's pickle name, dots as `__`, could not give `__main__` back (a PicklingError). Loaded back,
    the same class and the same output as the network before the rewrite."""
    import subprocess
    import sys

    code = ("import copy, io, pickle, torch, flexdsl\nfrom torch import nn\n"
            "class My_Linear(nn.Linear):\n    pass\n"
            "torch.manual_seed(0)\nnet = nn.Sequential(My_Linear(8, 4))\nplain = copy.deepcopy(net)\n"
            "flexdsl.save_spikes_as_bits(net)\nx = torch.rand(3, 8)\n"
            "back = pickle.loads(pickle.dumps(net))\nbuf = io.BytesIO()\ntorch.save(net, buf)\nbuf.seek(0)\n"
            "for n in (back, torch.load(buf, weights_only=False)):\n"
            "    assert type(n[0]) is type(net[0]) and isinstance(n[0], My_Linear)\n"
            "    assert torch.equal(n(x), plain(x))\n"
            "print('ok')\n")
    script = tmp_path / "train.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent.parent)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok"]


@pytest.mark.parametrize("model,backend", [("lif", "torch"), ("alif", "torch"), ("lif", "triton"),
                                           ("izhikevich", "triton")])
def test_a_recurrent_layer_keeps_its_spikes_and_spike_input_as_bits(model, backend):
    # the scan's source after s0 (spikes) and an input known to be 0/1 (a neuron's output) are kept
    # as bits between forward and backward: the same outputs and gradients, bitwise, as with the
    # bits off; the saved bytes fall by (T*H + T*B*F) values less their bits
    import os

    dev = "cuda" if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    torch.manual_seed(3)
    T, B, F, H = 9, 3, 24, 10
    r = flexdsl.recurrent(model, F, H, backend=backend).to(dev)
    with torch.no_grad():
        r.W_in.mul_(60.0 if model == "alif" else 6.0)  # (a layer that spikes)
    src = flexdsl.load("lif")
    x_in = (torch.rand(T, B, F) * 3).to(dev)

    def run(on: bool):
        bits.ENABLED = on
        try:
            r.reset()
            src.reset()
            x = src(x_in).requires_grad_()  # (a neuron's spikes: known 0/1)
            assert bits.known_binary(x) or not on
            seen = []

            def hook(t):
                seen.append(t.numel() * t.element_size())
                return t
            with torch.autograd.graph.saved_tensors_hooks(hook, lambda t: t):
                out = r(x)
            out = out[0] if isinstance(out, tuple) else out
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dev)
            grads = torch.autograd.grad((out * g).sum(), [x, r.W_rec, r.W_in, r.bias])
            return out.detach(), grads, sum(seen)
        finally:
            bits.ENABLED = True

    on, off = run(True), run(False)
    assert on[0].sum() > 0 and torch.equal(on[0], off[0])
    for a, b in zip(on[1], off[1]):
        assert torch.equal(a, b)
    # (spikes and input kept in float32, or the input in bfloat16 where the product takes it so: at least
    # 2 bytes a value, against 1/8 as bits)
    assert off[2] - on[2] >= (T * B * H + T * B * F) * 2 * 3 // 4


def test_the_pack_kernels_equal_the_torch_packing():
    # (the CUDA path of pack/unpack: one Triton kernel each, run here by the interpreter)
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    from flexdsl.backends.triton import packbits

    dev = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    for n in (1, 7, 8, 13, 3000):
        x = (torch.rand(n, generator=torch.Generator().manual_seed(n)) < 0.4).float()
        want = bits.pack(x)
        got = packbits.pack(x.to(dev))
        assert torch.equal(got.cpu(), want)
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            assert torch.equal(packbits.unpack(got, n, dt).cpu(), x.to(dt))


def test_every_library_model_trains_the_same_recurrent_with_bits():
    """A recurrent layer of each library model (torch scan, float64): outputs and gradients (input,
    W_in, W_rec) with its spikes and its 0/1 input kept as bits equal, bitwise, those with the bits
    off (a model whose source is not its spike keeps it as it is)."""
    from flexdsl import FlexDSLError

    torch.manual_seed(5)
    x = (torch.rand(8, 2, 6) < 0.5).double()
    ran = packed = 0
    for stem in flexdsl.library():
        try:
            r = flexdsl.recurrent(stem, 6, 5, backend="torch").double()
        except FlexDSLError:
            continue  # (a model a recurrent layer cannot take: its own located error, tested elsewhere)
        with torch.no_grad():
            r.W_in.mul_(8.0)
        got = []
        for on in (True, False):
            bits.ENABLED = on
            try:
                r.reset()
                xx = x.clone().requires_grad_()
                bits.mark_binary(xx)
                y, saved = _saved_bytes(lambda: r(xx))  # noqa: B023 - (called here, in this iteration)
                y = y[0] if isinstance(y, tuple) else y
                g = torch.autograd.grad((y * torch.linspace(-1, 1, y.shape[-1], dtype=y.dtype)).sum(),
                                        [xx, r.W_in, r.W_rec], allow_unused=True)
                got.append((y.detach(), g, saved))
            finally:
                bits.ENABLED = True
        (y1, g1, s1), (y0, g0, s0) = got
        packed += s1 < s0
        assert torch.equal(y1, y0), stem
        for a, b in zip(g1, g0):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), stem
        ran += 1
    assert ran >= 20 and packed >= 15, (ran, packed)  # (most models' source is their spike)
