"""Delays in recurrent layers, on the input synapses and on the recurrent ones (fixed and learnable):
spikes and gradients (inputs, weights, bias, delays) against a hand-written loop in float64 with
SpikingJelly's sigmoid surrogate (the library `lif`'s), on every backend; the kept history across
calls."""

from __future__ import annotations

import math

import pytest
import torch

import flexdsl
from flexdsl import backends

from tolerances import assert_close, layer_ops, tol

pytestmark = pytest.mark.usefixtures("numpy_backend")
needs_cpp = pytest.mark.skipif(not backends.get("cpu").available(), reason="needs a C++ compiler (the CPU kernels)")
needs_triton = pytest.mark.skipif(not backends.get("triton").available(),
                                  reason="needs the Triton backend (a GPU or TRITON_INTERPRET=1)")
SCANS = ["torch", pytest.param("cpu", marks=needs_cpp), "numpy"]
T, B, F, H, D = 14, 3, 4, 5, 4


def _text(line: str) -> str:
    return (f"layer R:\n    neuron lif\n    size {H}\n    input s size {F}\n    synapses W_in from s to x:\n"
            f"        {line}\n        bias b\n    synapses W_rec from spike to x\n")


def _delayed(kind: str, interp: str | None, x: torch.Tensor, d: torch.Tensor, sigma: float) -> torch.Tensor:
    """x delayed per element of its last dim by d (whole steps, or relaxed), zeros before step 0."""
    xx = torch.cat([torch.zeros(D, *x.shape[1:], dtype=x.dtype), x])
    out = []
    for t in range(x.shape[0]):
        cols = []
        for j in range(x.shape[-1]):
            if interp is None:
                cols.append(xx[D + t - int(d[j]), :, j])
            elif interp == "linear":
                d0 = min(int(math.floor(float(d[j].detach()))), D - 1)
                f = d[j] - d0
                cols.append((1 - f) * xx[D + t - d0, :, j] + f * xx[D + t - d0 - 1, :, j])
            else:
                g = torch.stack([torch.exp(-(k - d[j]) ** 2 / (2 * sigma ** 2)) for k in range(D + 1)])
                g = g / g.sum()
                cols.append(sum(g[k] * xx[D + t - k, :, j] for k in range(D + 1)))
        out.append(torch.stack(cols, -1))
    return torch.stack(out)


def _hand(kind, interp, x, W_in, b, W_rec, d, sigma):
    """The layer, one step at a time: LIF (tau 2, threshold 1, hard reset to 0) whose input is the
    delayed current (axonal: the input delayed, then W_in; dendritic: W_in x + b delayed) plus W_rec s[t-1]."""
    from spikingjelly.activation_based import surrogate

    sg = surrogate.Sigmoid(alpha=4.0)
    if kind == "dendritic":
        cur = _delayed(kind, interp, x @ W_in.T + b, d, sigma)
    else:
        cur = _delayed(kind, interp, x, d, sigma) @ W_in.T + b
    v = torch.zeros(x.shape[1], H, dtype=x.dtype)
    s = torch.zeros_like(v)
    spikes, vs = [], []
    for t in range(x.shape[0]):
        h = v + (cur[t] + s @ W_rec.T - v) / 2.0
        s = sg(h - 1.0)
        v = h * (1 - s)
        spikes.append(s)
        vs.append(v)
    return torch.stack(spikes), torch.stack(vs)


CASES = [("axonal", None), ("axonal", "gauss"), ("axonal", "linear"), ("dendritic", "gauss")]


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("kind,interp", CASES, ids=[f"{k}-{i or 'fixed'}" for k, i in CASES])
def test_recurrent_layer_with_input_delays_equals_a_hand_loop(kind, interp, scan):
    torch.manual_seed(21)
    line = f"delay {kind} max {D}" + (f" learnable {interp}" if interp else "")
    n = F if kind == "axonal" else H
    kw = {} if interp else {"delays": {"W_in": torch.randint(0, D + 1, (n,))}}
    m = flexdsl.loads(_text(line), backend=scan, **kw).double()
    sigma = 1.4
    if interp:
        with torch.no_grad():
            m.W_in_delay.copy_(torch.rand(n, dtype=torch.float64) * (D - 0.2) + 0.1)
        if interp == "gauss":
            m.set_delay_width(sigma)
    with torch.no_grad():
        m.W_in.mul_(6.0)
    x = (torch.rand(T, B, F, dtype=torch.float64) < 0.5).double()
    xo = x.clone().requires_grad_()
    spikes = m(xo)
    names = ["W_in", "W_rec", "bias"] + (["W_in_delay"] if interp else [])
    params = [getattr(m, nm) for nm in names]
    ref_params = [p.detach().clone().requires_grad_() for p in params]
    xr = x.clone().requires_grad_()
    d_ref = ref_params[3] if interp else m.W_in_delay
    rs, rv = _hand(kind, interp, xr, ref_params[0], ref_params[2], ref_params[1], d_ref, sigma)
    assert 10 < int(rs.sum()) < rs.numel() * 0.8  # the layer fires, and not always
    assert torch.equal(spikes, rs)
    g = torch.randn_like(rs)
    got = torch.autograd.grad((spikes * g).sum(), [xo, *params])
    want = torch.autograd.grad((rs * g).sum(), [xr, *ref_params])
    ops = layer_ops("lif", T, B, F, H) + (D + 1) * 4
    for nm, a, r in zip(["x", *names], got, want):
        assert r.abs().max() > 0, nm
        err = float((a - r).norm() / r.norm())
        assert err <= tol(torch.float64, ops), f"{nm}: {err:.2e}"


def test_the_kept_input_history_makes_chunks_one_call_and_reset_clears_it():
    torch.manual_seed(22)
    m = flexdsl.loads(_text(f"delay synaptic max {D} learnable"), backend="torch").double()
    x = torch.rand(T, B, F, dtype=torch.float64) * 2
    whole = m(x)
    m.reset()
    parts = torch.cat([m(x[:3]), m(x[3:4]), m(x[4:])])
    # (the same sums over the same kept steps, grouped by another convolution call)
    assert_close(parts, whole, ops=layer_ops("lif", T, B, F * (D + 1), H), floor=1.0)
    m.reset()
    assert torch.equal(m(x), whole)
    with pytest.raises(flexdsl.FlexDSLError, match="call m.reset"):
        m(torch.rand(T, B + 1, F, dtype=torch.float64))


TRITON_CASES = [("recurrent", f"delay axonal max {D}"), ("recurrent", f"delay synaptic max {D} learnable"),
                ("recurrent", f"delay dendritic max {D} learnable linear"), ("feedforward", f"delay synaptic max {D}"),
                ("feedforward", f"delay synaptic max {D} learnable linear"),
                ("delayed_recurrent_synapse", f"delay axonal max {D}"),
                ("delayed_recurrent_synapse", f"delay synaptic max {D} learnable"),
                ("recurrent", f"delay axonal max {D} learnable"), ("feedforward", f"delay dendritic max {D} learnable"),
                ("feedforward", f"delay synaptic max {D} learnable")]


@needs_triton
@pytest.mark.parametrize("layer,line", TRITON_CASES)
def test_delays_on_the_triton_kernels_equal_the_torch_backend(line, layer):
    """float32 (the Triton kernels' dtypes): the delays run before the kernels, the same on both;
    spikes equal, gradients within the float32 bound of the layer's operations."""
    torch.manual_seed(23)
    text = _text(line) if layer == "recurrent" else _text(line).replace("    synapses W_rec from spike to x\n", "")
    n = F if "axonal" in line else (H, F) if "synaptic" in line else H
    name = "W_in"
    if layer == "delayed_recurrent_synapse":
        text = _text("bias c").replace("        bias b\n", "") + f"    synapses W_rec from spike to x:\n        {line}\n"
        text = text.replace("    synapses W_rec from spike to x\n    synapses", "    synapses")
        n, name = (H if "synaptic" not in line else (H, H)), "W_rec"
    kw = {} if "learnable" in line else {"delays": {name: torch.randint(0, D + 1, (n,) if isinstance(n, int) else n)}}
    ref = flexdsl.loads(text, backend="torch", **kw)
    tri = flexdsl.loads(text, backend="triton", **kw)
    tri.load_state_dict(ref.state_dict())
    with torch.no_grad():
        ref.W_in.copy_(ref.W_in.abs() * 12.0)
        tri.W_in.copy_(ref.W_in)
    x = (torch.rand(T, B, F) < 0.5).float()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = tri(xa), ref(xb)
    assert 5 < int(b.sum()) < b.numel() and torch.equal(a, b)
    g = torch.randn_like(a)
    names = [n for n, p in ref.named_parameters() if p.requires_grad and not n.startswith("neuron.")]
    ga = torch.autograd.grad((a * g).sum(), [xa, *(dict(tri.named_parameters())[n] for n in names)])
    gb = torch.autograd.grad((b * g).sum(), [xb, *(dict(ref.named_parameters())[n] for n in names)])
    for nm, u, w in zip(["x", *names], ga, gb):
        assert_close(u, w, ops=layer_ops("lif", T, B, F * (D + 1), H), floor=1.0, what=nm)


def _rec_hand(kind, interp, x, W_in, b, W_rec, d, sigma):
    """LIF (tau 2, threshold 1, hard reset to 0) whose input is W_in x[t] + b plus the recurrent current
    of the spikes 1 + d steps back (axonal d[j], synaptic d[i, j], dendritic d[i]; relaxed: the sum over
    the steps k back of g_k(d) s[t - 1 - k]); zeros before the first step."""
    from spikingjelly.activation_based import surrogate

    sg = surrogate.Sigmoid(alpha=4.0)
    cur = x @ W_in.T + b
    v = torch.zeros(x.shape[1], H, dtype=x.dtype)
    past = [torch.zeros_like(v) for _ in range(D + 1)]  # past[-1 - k]: the spikes k + 1 steps ago

    def g(dd):
        if interp is None:
            return [1.0 if k == int(dd) else 0.0 for k in range(D + 1)]
        if interp == "linear":
            return [torch.clamp(1 - (k - dd).abs(), min=0) for k in range(D + 1)]
        e = torch.stack([torch.exp(-(k - dd) ** 2 / (2 * sigma ** 2)) for k in range(D + 1)])
        return list(e / e.sum())

    spikes = []
    for t in range(x.shape[0]):
        rec = torch.zeros_like(v)
        for i in range(H):
            for j in range(H):
                dd = d[j] if kind == "axonal" else d[i, j] if kind == "synaptic" else d[i]
                for k, gk in enumerate(g(dd)):
                    rec[:, i] = rec[:, i] + gk * W_rec[i, j] * past[-1 - k][:, j]
        h = v + (cur[t] + rec - v) / 2.0
        s = sg(h - 1.0)
        v = h * (1 - s)
        spikes.append(s)
        past = past[1:] + [s]
    return torch.stack(spikes)


REC = [("axonal", None), ("synaptic", None), ("dendritic", None), ("axonal", "gauss"), ("synaptic", "linear")]


@pytest.mark.parametrize("scan", ["torch", "numpy"])
@pytest.mark.parametrize("kind,interp", REC, ids=[f"{k}-{i or 'fixed'}" for k, i in REC])
def test_delayed_recurrent_synapses_equal_a_hand_loop(kind, interp, scan):
    torch.manual_seed(24)
    shape = (H,) if kind != "synaptic" else (H, H)
    text = (f"layer R:\n    neuron lif\n    size {H}\n    input s size {F}\n    synapses W_in from s to x:\n"
            f"        bias b\n    synapses W_rec from spike to x:\n        delay {kind} max {D}"
            + (f" learnable {interp}" if interp else "") + "\n")
    kw = {} if interp else {"delays": {"W_rec": torch.randint(0, D + 1, shape)}}
    m = flexdsl.loads(text, backend=scan, **kw).double()
    sigma = 1.2
    if interp:
        with torch.no_grad():
            m.W_rec_delay.copy_(torch.rand(shape, dtype=torch.float64) * (D - 0.2) + 0.1)
        if interp == "gauss":
            m.set_delay_width(sigma)
    with torch.no_grad():
        m.W_in.mul_(5.0)
        m.W_rec.mul_(4.0)
    x = (torch.rand(T, B, F, dtype=torch.float64) < 0.5).double()
    xo = x.clone().requires_grad_()
    spikes = m(xo)
    names = ["W_in", "W_rec", "bias"] + (["W_rec_delay"] if interp else [])
    params = [getattr(m, nm) for nm in names]
    refp = [p.detach().clone().requires_grad_() for p in params]
    xr = x.clone().requires_grad_()
    d = refp[3] if interp else m.W_rec_delay
    rs = _rec_hand(kind, interp, xr, refp[0], refp[2], refp[1], d, sigma)
    assert 10 < int(rs.sum()) < rs.numel() * 0.8
    assert torch.equal(spikes, rs)
    g = torch.randn_like(rs)
    got = torch.autograd.grad((spikes * g).sum(), [xo, *params])
    want = torch.autograd.grad((rs * g).sum(), [xr, *refp])
    ops = layer_ops("lif", T, B, F, H * (D + 1))
    for nm, a, r in zip(["x", *names], got, want):
        assert r.abs().max() > 0, nm
        err = float((a - r).norm() / r.norm())
        assert err <= tol(torch.float64, ops), f"{nm}: {err:.2e}"
    # the kept history: two calls equal one, and reset() starts from zeros again
    m.reset()
    parts = torch.cat([m(x[:5]), m(x[5:])])
    assert torch.equal(parts, spikes)
    m.reset()
    m.step_mode = "s"
    assert torch.equal(torch.stack([m(x[t]) for t in range(T)]), spikes)


@needs_triton
@pytest.mark.parametrize("lanes", [(3, 5), (2, 1, 7)])
def test_the_spread_kernel_equals_the_depthwise_convolution(lanes):
    """Per-element relaxed delays on the Triton backend (`delay_spread`: the history read as it lies,
    float32 like every Triton kernel) against the depthwise convolution over time of the torch path in
    float64: outputs, the history's and the taps' gradients, within float32's rounding of sums of at
    most (max + 1) * steps * batch products."""
    from flexdsl.backends.triton.delays import delay_spread
    from flexdsl.runtime.delays import _spread

    g = torch.Generator().manual_seed(31)
    Dm, Tn, C = 6, 9, lanes[-1]
    hist = torch.randn(Dm + Tn, *lanes, dtype=torch.float64, generator=g)
    taps = torch.softmax(torch.randn(C, Dm + 1, dtype=torch.float64, generator=g), -1)
    go = torch.randn(Tn, *lanes, dtype=torch.float64, generator=g)
    outs = []
    for f, dt in ((lambda h, t: delay_spread(h, t), torch.float32), (lambda h, t: _spread(h, t, Tn), torch.float64)):
        h, t = hist.to(dt).requires_grad_(), taps.to(dt).requires_grad_()
        out = f(h, t)
        outs.append([v.double() for v in (out, *torch.autograd.grad((out * go.to(dt)).sum(), [h, t]))])
    n = (Dm + 1) * Tn * math.prod(lanes[:-1])
    for u, v in zip(*outs):
        assert u.shape == v.shape
        assert float((u - v).abs().max()) <= 4 * n * torch.finfo(torch.float32).eps * max(float(v.abs().max()), 1.0)


@needs_triton
@pytest.mark.parametrize("sizes,blocks", [((6, 9, (3,), 5, 4), False), ((4, 7, (2, 3), 37, 70), False),
                                          ((0, 5, (2,), 3, 130), False), ((5, 7, (4,), 20, 36), True),
                                          ((3, 6, (2, 4), 140, 24), True), ((0, 3, (4,), 4, 8), True)])
def test_the_dense_delay_kernel_equals_the_convolution(sizes, blocks, monkeypatch):
    """Dense relaxed synaptic delays on the Triton backend (`delay_conv`: one product over taps and
    inputs, the time-major history read in place with its rows shifted per tap) against torch's
    convolution over time in float64: outputs, the history's and the weights' gradients, within
    float32's rounding of their sums (inputs x taps terms; steps x batch terms for the weights).
    Sizes whose rows are 16-byte aligned run the block-load kernels (Hopper's TMA; checked: the
    pointer kernels refuse to run), the others the pointer kernels."""
    import flexdsl.backends.triton.dense_delays as dl
    from flexdsl.backends.triton.dense_delays import delay_conv

    if blocks:
        for name in ("_MM", "_MMT"):
            monkeypatch.setattr(dl, name, lambda *a, **k: pytest.fail("a pointer kernel ran"))
    g = torch.Generator().manual_seed(37)
    Dm, Tn, lanes, J, I = sizes
    hist = torch.randn(Dm + Tn, *lanes, J, dtype=torch.float64, generator=g)
    W = torch.randn(Dm + 1, J, I, dtype=torch.float64, generator=g)
    go = torch.randn(Tn, *lanes, I, dtype=torch.float64, generator=g)

    def conv(h, w):  # out[t, n, i] = sum_k sum_j w[k, j, i] h[D + t - k, n, j]
        x = h.reshape(h.shape[0], -1, J).permute(1, 2, 0)
        out = torch.nn.functional.conv1d(x, w.permute(2, 1, 0).flip(-1))
        return out.permute(2, 0, 1).reshape(Tn, *lanes, I)

    outs = []
    for f, dt in ((delay_conv, torch.float32), (conv, torch.float64)):
        h, w = hist.to(dt).requires_grad_(), W.to(dt).requires_grad_()
        out = f(h, w)
        outs.append([v.detach().double() for v in (out, *torch.autograd.grad((out * go.to(dt)).sum(), [h, w]))])
    eps = torch.finfo(torch.float32).eps
    for u, v, n in zip(*outs, ((Dm + 1) * J, (Dm + 1) * I, Tn * math.prod(lanes))):
        assert u.shape == v.shape
        assert float((u - v).abs().max()) <= 4 * n * eps * max(float(v.abs().max()), 1.0)


@needs_triton
@pytest.mark.parametrize("sizes,width,past", [((6, 9, (4,), 20, 12), 3.3, 6), ((4, 5, (3,), 7, 40), 0.7, 4),
                                              ((3, 4, (2, 4), 36, 20), 1e-3, 3), ((0, 3, (4,), 8, 4), 2.0, 0),
                                              ((6, 9, (4,), 20, 12), 3.3, 0), ((5, 3, (4,), 12, 8), 1.5, 2),
                                              ((4, 5, (3,), 7, 40), 0.7, 1)])
def test_the_fused_gauss_delays_equal_the_taps_and_convolution(sizes, width, past):
    """Learnable gauss synaptic delays in one Triton op (`delay_gauss`: the taps `w[i, j] g_k(d[i, j])`
    made in a kernel, the product over taps and inputs, the gradients of the history, `w` and `d`)
    against the torch path in float64 (`tap_weights` and torch's convolution over time, autograd):
    within float32's rounding of the sums (inputs x taps terms; steps x batch x taps terms for `w`, and
    for `d` times the largest tap derivative 2c(D) of the width). With fewer than max steps of history
    (`past`: after a reset, none) the kernels read the steps before it as 0: the same as zeros given."""
    from flexdsl.backends.triton.dense_delays import delay_gauss
    from flexdsl.runtime.delays import gauss_coef, tap_weights

    g = torch.Generator().manual_seed(41)
    Dm, Tn, lanes, J, I = sizes
    hist = (torch.rand(Dm + Tn, *lanes, J, generator=g) < 0.4).double()
    w = torch.randn(I, J, dtype=torch.float64, generator=g)
    d = torch.rand(I, J, dtype=torch.float64, generator=g) * Dm
    go = torch.randn(Tn, *lanes, I, dtype=torch.float64, generator=g)

    def torch_path(h, w_, d_):
        taps = (w_.unsqueeze(-1) * tap_weights(d_, Dm, width, "gauss")).flip(-1)  # [I, J, D + 1]
        x = h.reshape(h.shape[0], -1, J).permute(1, 2, 0)
        return torch.nn.functional.conv1d(x, taps).permute(2, 0, 1).reshape(Tn, *lanes, I)

    hist[:Dm - past] = 0  # (the steps the kernels are not given: zeros)

    def kernels(h, w_, d_):
        return delay_gauss(h[Dm - past:], w_, d_, gauss_coef(width, Dm, torch.float32), Dm, past)

    outs = []
    for f, dt in ((kernels, torch.float32), (torch_path, torch.float64)):
        args = [v.to(dt).requires_grad_() for v in (hist, w, d)]
        out = f(*args)
        outs.append([v.detach().double() for v in (out, *torch.autograd.grad((out * go.to(dt)).sum(), args))])
    outs[1][1][:Dm - past] = 0  # (the history's gradient: of the steps given)
    eps, n_bt = torch.finfo(torch.float32).eps, Tn * math.prod(lanes)
    coef = min(gauss_coef(width, Dm, torch.float64), 1e6)
    bounds = ((Dm + 1) * J, (Dm + 1) * I, n_bt * (Dm + 1), n_bt * (Dm + 1) * (1 + 2 * coef * max(Dm, 1)))
    for name, u, v, n in zip(("out", "history", "w", "d"), *outs, bounds):
        assert u.shape == v.shape
        assert float((u - v).abs().max()) <= 4 * n * eps * max(float(v.abs().max()), 1.0), name


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gauss_synaptic_delays_in_16_bit_round_once_per_term(dtype):
    """A Triton layer in bfloat16/float16 with learnable gauss synaptic delays (its taps and current made
    in 16-bit, summed in float32) against the torch backend in float64 from the same 16-bit weights,
    delays and spikes: within the 16-bit rounding of each term (taps x inputs of them). (Triton's
    interpreter multiplies bfloat16 wrongly: the kernels take 16-bit operands in float32 there.)"""
    torch.manual_seed(33)
    text = _text(f"delay synaptic max {D} learnable").replace("    synapses W_rec from spike to x\n", "")
    tri = flexdsl.loads(text, backend="triton").to(dtype)
    ref = flexdsl.loads(text, backend="torch").double()
    ref.load_state_dict(tri.state_dict())
    x = (torch.rand(T, B, F) < 0.5).to(dtype)
    with torch.no_grad():
        got, want = tri.current(x), ref.current(x.double())
    assert got.dtype == dtype
    n = (D + 1) * F
    bound = 4 * n * torch.finfo(dtype).eps * max(float(want.abs().max()), 1.0)
    assert float((got.double() - want).abs().max()) <= bound


@needs_triton
def test_gauss_synaptic_delays_in_the_kernels_carry_their_history_across_calls():
    """Learnable gauss synaptic delays on the Triton backend keep the last max steps for the next call
    (none materialized after a reset: the kernels read the steps before as 0): calls of 1, 2 (fewer
    steps than the maximum), 3 and the rest equal one call, and both equal the torch backend."""
    torch.manual_seed(29)
    text = _text(f"delay synaptic max {D} learnable").replace("    synapses W_rec from spike to x\n", "")
    tri = flexdsl.loads(text, backend="triton")
    ref = flexdsl.loads(text, backend="torch")
    ref.load_state_dict(tri.state_dict())
    x = (torch.rand(T, B, F) < 0.5).float()
    whole = tri.current(x)
    tri.reset()
    parts = torch.cat([tri.current(x[a:b]) for a, b in ((0, 1), (1, 3), (3, 6), (6, T))])
    ops = layer_ops("lif", T, B, F * (D + 1), H)
    assert_close(parts, whole, ops=ops, floor=1.0)
    assert_close(whole, ref.current(x), ops=ops, floor=1.0)


@needs_triton
@pytest.mark.parametrize("line", [f"delay synaptic max {D} learnable", f"delay axonal max {D} learnable",
                                  f"delay synaptic max {D}"])
def test_delays_of_a_triton_layer_compile(line):
    """Under torch.compile a Triton layer's delays run as torch's operations (the delay kernels are the
    eager path; a trace of their launches failed): the compiled current equals the eager one, and the
    delays' gradient arrives."""
    torch.manual_seed(30)
    text = _text(line).replace("    synapses W_rec from spike to x\n", "")
    kw = {} if "learnable" in line else {"delays": {"W_in": torch.randint(0, D + 1, (H, F))}}
    m = flexdsl.loads(text, backend="triton", **kw)
    x = (torch.rand(T, B, F) < 0.5).float()
    eager = m.current(x)
    m.reset()
    out = torch.compile(m.current, backend="aot_eager")(x)
    assert_close(out, eager, ops=layer_ops("lif", T, B, F * (D + 1), H), floor=1.0)
    out.sum().backward()
    assert m.W_in.grad is not None and ("learnable" not in line or m.W_in_delay.grad is not None)


@needs_triton
def test_synaptic_gauss_delays_run_without_a_convolution(monkeypatch):
    """Learnable synaptic delays (gauss: every connection reads every step back) on the Triton backend
    read the history in place (`delay_conv`): no convolution runs, and the gradients of the input, the
    weights and the delays arrive."""
    torch.manual_seed(27)
    text = _text(f"delay synaptic max {D} learnable").replace("    synapses W_rec from spike to x\n", "")
    tri = flexdsl.loads(text, backend="triton")
    monkeypatch.setattr(torch.nn.functional, "conv1d", lambda *a, **k: pytest.fail("a convolution ran"))
    x = (torch.rand(T, B, F) < 0.5).float().requires_grad_()
    tri.current(x).sum().backward()
    assert x.grad is not None and tri.W_in.grad is not None and tri.W_in_delay.grad.abs().sum() > 0


@needs_triton
def test_per_element_gauss_delays_run_without_a_convolution(monkeypatch):
    """Learnable axonal delays (gauss) on the Triton backend read the history in place: no depthwise
    convolution runs, and the gradients of the input and of the delays arrive."""
    torch.manual_seed(26)
    text = _text(f"delay axonal max {D} learnable").replace("    synapses W_rec from spike to x\n", "")
    tri = flexdsl.loads(text, backend="triton")

    def refuse(*a, **k):
        raise AssertionError("a convolution ran")

    monkeypatch.setattr(torch.nn.functional, "conv1d", refuse)
    x = (torch.rand(T, B, F) < 0.5).float().requires_grad_()
    tri.current(x).sum().backward()
    assert x.grad is not None and tri.W_in_delay.grad is not None and tri.W_in_delay.grad.abs().sum() > 0


@needs_triton
@pytest.mark.parametrize("line", [f"delay synaptic max {D}", f"delay synaptic max {D} learnable linear"])
def test_sparse_synaptic_delays_run_in_the_kernels_without_a_dense_kernel(line, monkeypatch):
    """Whole-step and linear (two-step) synaptic delays on the Triton backend gather each connection's
    steps from the history: no convolution, no [n_post, n_pre, max + 1] kernel, no product per delay."""
    torch.manual_seed(25)
    text = _text(line).replace("    synapses W_rec from spike to x\n", "")
    kw = {} if "learnable" in line else {"delays": {"W_in": torch.randint(0, D + 1, (H, F))}}
    tri = flexdsl.loads(text, backend="triton", **kw)

    def refuse(*a, **k):
        raise AssertionError("a dense path ran")

    monkeypatch.setattr(torch.nn.functional, "conv1d", refuse)
    monkeypatch.setattr(torch.nn.functional, "linear", refuse)
    x = (torch.rand(T, B, F) < 0.5).float().requires_grad_()
    cur = tri.current(x)
    cur.sum().backward()
    assert x.grad is not None and tri.W_in.grad is not None
