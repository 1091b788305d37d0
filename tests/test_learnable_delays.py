"""Learnable delays of feed-forward layers (`delay KIND max D learnable [gauss|linear]`): outputs and
gradients (inputs, weights, delays) against the `dcls` package's `Dcls1d` (DCLS's Gaussian, "gauss",
and linear, "v1", kernels) in float64, dendritic delays against a hand loop, whole steps against the
fixed-delay path, the bounds through training, and bad lines as located errors."""

from __future__ import annotations

import math

import pytest
import torch

import flexdsl
from tests.tolerances import assert_close

T, B, F, H, D = 11, 3, 5, 4, 6


def _text(kind: str, interp: str = "gauss", neuron: str = "li", bias: bool = True) -> str:
    return (f"layer L:\n    neuron {neuron}\n    size {H}\n    input s size {F}\n    synapses W from s to x:\n"
            f"        delay {kind} max {D} learnable {interp}\n" + ("        bias b\n" if bias else ""))


def _dcls(m, kind: str, version: str, sigma: float):
    """DCLS's Dcls1d holding the layer's weights, bias and delays: a position p is the delay
    D - (p + (D + 1) // 2) under a left padding of D steps; DCLS's width is |SIG| + 0.27."""
    from DCLS.construct.modules import Dcls1d

    dc = Dcls1d(F, H, kernel_count=1, dilated_kernel_size=D + 1, bias=True, version=version).double()
    d = m.W_delay.detach() if kind == "synaptic" else m.W_delay.detach().expand(H, F)
    with torch.no_grad():
        dc.weight.copy_(m.W.detach().unsqueeze(-1))
        dc.bias.copy_(m.b.detach())
        dc.P.copy_((D - d - (D + 1) // 2).reshape(dc.P.shape))
        if version == "gauss":
            dc.SIG.fill_(sigma - 0.27)
    return dc


# DCLS normalizes its kernel by (sum + 1e-7) where flexdsl takes the softmax (exactly normalized): the
# two differ by at most 1e-7 / sum relative (the sum over the taps is >= 0.18 for a width >= 0.27)
DCLS_REL = 1e-5


@pytest.mark.parametrize("interp,version", [("gauss", "gauss"), ("linear", "v1")])
@pytest.mark.parametrize("kind", ["synaptic", "axonal"])
def test_learnable_delays_equal_dcls_outputs_and_gradients(kind, interp, version):
    pytest.importorskip("DCLS", reason="the reference: pip install dcls")
    torch.manual_seed(7)
    m = flexdsl.loads(_text(kind, interp), backend="torch").double()
    with torch.no_grad():  # (delays away from whole steps: DCLS's linear kernel has no gradient on them)
        m.W_delay.copy_(torch.rand_like(m.W_delay) * (D - 0.2) + 0.1)
        m.W_delay.sub_((m.W_delay - m.W_delay.round()).abs().lt(0.05).double() * 0.1)
    sigma = 1.7 if interp == "gauss" else 1.0
    if interp == "gauss":
        m.set_delay_width(sigma)
    dc = _dcls(m, kind, version, sigma)
    x = torch.rand(T, B, F, dtype=torch.float64, requires_grad=True)
    y = m(x)
    cur = dc(torch.nn.functional.pad(x.permute(1, 2, 0), (D, 0))).permute(2, 0, 1)
    ref = flexdsl.load("li", backend="torch").double()(cur)
    scale = float(ref.detach().abs().max())
    assert float((y - ref).abs().max()) <= DCLS_REL * scale
    g = torch.randn_like(y)
    gx, gw, gb, gd = torch.autograd.grad((y * g).sum(), [x, m.W, m.b, m.W_delay])
    rx, rw, rb, rp = torch.autograd.grad((ref * g).sum(), [x, dc.weight, dc.bias, dc.P])
    rd = -rp.reshape(H, F)  # (d = const - p)
    if kind == "axonal":
        rd = rd.sum(0)
    for a, r in ((gx, rx), (gw, rw[..., 0]), (gb, rb), (gd, rd)):
        assert float((a - r).abs().max()) <= DCLS_REL * float(r.abs().max()), (a, r)


def _hand_dendritic(x, W, b, d, sigma):
    """Each neuron's current `W x + b` delayed by `d[i]` under the normalized Gaussian over 0..D."""
    cur = torch.einsum("tbf,hf->tbh", x, W) + b
    out = torch.zeros_like(cur)
    for i in range(H):
        g = [math.exp(-((k - float(d[i])) ** 2) / (2 * sigma ** 2)) for k in range(D + 1)]
        s = sum(g)
        for t in range(T):
            for k in range(D + 1):
                if t - k >= 0:
                    out[t, :, i] = out[t, :, i] + g[k] / s * cur[t - k, :, i]
    return out


def test_learnable_dendritic_delays_equal_a_hand_loop():
    torch.manual_seed(8)
    m = flexdsl.loads(_text("dendritic"), backend="torch").double()
    m.set_delay_width(1.3)
    x = torch.rand(T, B, F, dtype=torch.float64)
    ref = flexdsl.load("li", backend="torch").double()(_hand_dendritic(x, m.W.detach(), m.b.detach(),
                                                                       m.W_delay.detach(), 1.3))
    assert_close(m(x), ref, ops=T * 6 + F + 2 * (D + 1) + 4)


def test_gradients_of_the_delays_are_the_derivative_of_the_output():
    """Central differences of the loss in each delay (float64), gauss and linear."""
    torch.manual_seed(9)
    for interp in ("gauss", "linear"):
        m = flexdsl.loads(_text("axonal", interp), backend="torch").double()
        with torch.no_grad():
            m.W_delay.copy_(torch.tensor([0.3, 1.6, 2.45, 4.2, 5.7], dtype=torch.float64))
        x = torch.rand(T, B, F, dtype=torch.float64)
        w = torch.randn(T, B, H, dtype=torch.float64)

        def loss(m=m, x=x, w=w) -> torch.Tensor:
            m.reset()
            return (m(x) * w).sum()

        (g,) = torch.autograd.grad(loss(), [m.W_delay])
        for j in range(F):
            with torch.no_grad():
                m.W_delay[j] += 1e-6
                up = float(loss())
                m.W_delay[j] -= 2e-6
                down = float(loss())
                m.W_delay[j] += 1e-6
            assert abs((up - down) / 2e-6 - float(g[j])) <= 1e-6 * max(1.0, abs(float(g[j])))


@pytest.mark.parametrize("kind", ["synaptic", "axonal", "dendritic"])
def test_width_zero_is_the_fixed_delays_of_the_rounded_values(kind):
    torch.manual_seed(10)
    m = flexdsl.loads(_text(kind, neuron="lif"), backend="torch")
    m.round_delays()
    assert float(m.W_delay_width) == 0.0 and torch.equal(m.W_delay, m.W_delay.round())
    fixed = flexdsl.loads(_text(kind, neuron="lif").replace(" learnable gauss", ""), backend="torch",
                          delays={"W": m.W_delay.detach().long()})
    fixed.load_state_dict({k: v for k, v in m.state_dict().items() if k != "W_delay_width"}
                          | {"W_delay": m.W_delay.detach().long()})
    x = (torch.rand(T, B, F) < 0.4).float()
    assert torch.equal(m(x), fixed(x))
    m.reset()
    m.set_delay_width(0.0)  # (set_delay_width(0): whole steps as well)
    with torch.no_grad():
        m.W_delay.add_(0.3)  # rounds back to the same steps
    fixed.reset()
    assert torch.equal(m(x), fixed(x))


def test_learnable_delays_stay_in_their_bounds_through_training():
    torch.manual_seed(11)
    m = flexdsl.loads(_text("synaptic", neuron="lif"), backend="torch")
    opt = torch.optim.SGD(m.parameters(), lr=1e4)
    x = (torch.rand(T, B, F) < 0.5).float()
    for _ in range(3):
        m.reset()
        loss = (m(x) * torch.randn(T, B, H)).sum() + (m.W_delay * torch.randn(H, F)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert float(m.W_delay.min()) >= 0.0 and float(m.W_delay.max()) <= D
    assert bool((m.W_delay == 0).any()) and bool((m.W_delay == D).any())  # (the steps pushed them past both)
    with torch.no_grad():  # a hand-written update, past the maximum: the next call runs the maximum
        m.W_delay.fill_(D + 5.0)
    m.reset()
    y = m(x)
    assert float(m.W_delay.max()) == D
    m.reset()
    assert torch.equal(y, m(x))


@pytest.mark.parametrize("interp", ["gauss", "linear"])
def test_chunks_and_single_steps_equal_one_call(interp):
    torch.manual_seed(12)
    m = flexdsl.loads(_text("synaptic", interp, neuron="lif"), backend="torch").double()
    x = torch.rand(T, B, F, dtype=torch.float64) * 2
    whole = m(x)
    m.reset()
    parts = torch.cat([m(x[:4]), m(x[4:5]), m(x[5:])])
    m.reset()
    m.step_mode = "s"
    steps = torch.stack([m(x[t]) for t in range(T)])
    # the same sums over the same history, in another grouping of the convolution
    assert_close(parts, whole, ops=F * (D + 1) + 4, floor=1.0)
    assert_close(steps, whole, ops=F * (D + 1) + 4, floor=1.0)


def test_learnable_axonal_delays_export_to_nir_once_rounded():
    pytest.importorskip("nir")
    torch.manual_seed(13)
    m = flexdsl.loads(_text("axonal", neuron="lif", bias=False), backend="torch")
    x = torch.rand(6, 1, F)
    with pytest.raises(flexdsl.FlexDSLError, match="round_delays") as e:
        flexdsl.nir.export(m, x, dt=1e-3)
    assert e.value.line == 6
    m.round_delays()
    g = flexdsl.nir.export(m, x, dt=1e-3)
    assert g.nodes["W_delay"].delay.tolist() == pytest.approx((m.W_delay.detach().double() * 1e-3).tolist())


BAD = [
    ("        delay axonal learnable\n", {}, "need a maximum", 6),
    ("        delay synaptic\n", {}, "need a maximum", 6),
    ("        delay 3 learnable\n", {}, "needs a kind and a maximum", 6),
    ("        delay synaptic max 3 learnable gaus\n", {}, "unknown relaxation `gaus`", 6),
    ("        delay synaptic max 0 learnable\n", {}, "nothing to learn", 6),
    ("        delay axonal max 3 learnable\n", {"W": torch.tensor([0.5, 3.5, 1.0])}, "3.5 steps, outside 0 to 3", 6),
    ("        delay axonal max 3 learnable\n", {"W": torch.tensor([0.5, float("nan"), 1.0])}, "nan steps", 6),
    ("        delay axonal max 3 learnable\n", {"W": torch.tensor([-0.5, 1.0, 1.0])}, "outside 0 to 3", 6),
    ("        delay axonal max 3 learnable\n", {"W": torch.zeros(4, 3)}, "have shape (4, 3)", 6),
]


@pytest.mark.parametrize("line,delays,msg,at", BAD, ids=[b[2] for b in BAD])
def test_bad_learnable_delays_are_located_errors(line, delays, msg, at):
    text = f"layer L:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W from s to x:\n{line}"
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.loads(text, delays=delays) if delays else flexdsl.loads(text)
    assert msg in e.value.reason and e.value.line == at, str(e.value)
    if "gaus`" in msg:
        assert "gauss" in (e.value.hint or "")


def test_bad_widths_are_located_errors_at_the_call():
    gauss = flexdsl.loads(_text("axonal"))
    with pytest.raises(flexdsl.FlexDSLError, match="must be a number of steps >= 0") as e:
        gauss.set_delay_width(-1.0)
    assert e.value.line == 6
    gauss.W_delay_width.fill_(float("nan"))
    with pytest.raises(flexdsl.FlexDSLError, match="width"):
        gauss(torch.rand(T, B, F))
    linear = flexdsl.loads(_text("axonal", "linear"))
    linear.W_delay_width.fill_(0.5)
    with pytest.raises(flexdsl.FlexDSLError, match="1, or 0"):
        linear(torch.rand(T, B, F))


def test_a_layer_page_shows_the_delayed_equations_and_a_modules_delays(tmp_path):
    """`flexdsl doc x.layer`: the page's equations read the delayed step, s_j(t - d_ij), in the
    Markdown (LaTeX) and the HTML (MathML); from a module, the histogram of its delays."""
    import flexdsl.docs

    path = tmp_path / "delayed.layer"
    path.write_text(_text("synaptic", neuron="lif").replace("layer L:", "layer Delayed:\n    \"\"\"Delays.\"\"\""))
    res = flexdsl.docs.build([str(path)], tmp_path / "site")
    assert not res.failed, res.failed
    md = (tmp_path / "site" / "delayed.md").read_text()
    assert r"s_{j}{\left(t - d_{\mathrm{ij}} \right)}" in md and "learnable in [0, 6] steps (gauss)" in md
    html = (tmp_path / "site" / "delayed.html").read_text()
    assert "<math" in html and "$" not in html.split("<pre")[0]
    assert "<mi>d</mi><mi>ij</mi>" in html
    assert "Delayed" in (tmp_path / "site" / "index.html").read_text()
    m = flexdsl.load(str(path))
    with torch.no_grad():
        m.W_delay.copy_(torch.full_like(m.W_delay, 2.2))
    page = flexdsl.docs.render_layer(m, tmp_path / "out")
    assert "delayed.W_delays.png" in page and (tmp_path / "out" / "delayed.W_delays.png").is_file()


def test_a_width_for_a_layer_without_gauss_delays_and_a_kernel_too_large_are_located_errors():
    with pytest.raises(flexdsl.FlexDSLError, match="no learnable delays of the gauss relaxation"):
        flexdsl.loads(_text("axonal", "linear")).set_delay_width(1.0)
    text = ("layer L:\n    neuron lif\n    size 1000\n    input s size 1000\n    synapses W from s to x:\n"
            "        delay synaptic max 3000 learnable\n")
    with pytest.raises(flexdsl.FlexDSLError, match="need a kernel of 1,000 x 1,000 x 3,001") as e:
        flexdsl.loads(text)
    assert e.value.line == 6


def test_feedforward_takes_the_delay_line_as_keywords():
    """`flexdsl.feedforward(..., delay=, max_delay=, learnable_delays=, delays=)` is the layer file with
    that `delay` line: the same module (same parameters, same outputs)."""
    torch.manual_seed(14)
    d = torch.rand(H, F) * D
    a = flexdsl.feedforward("lif", F, H, delay="synaptic", max_delay=D, learnable_delays="linear", delays=d,
                            backend="torch")
    b = flexdsl.loads(_text("synaptic", "linear", neuron="lif").replace("bias b", "bias bias"), backend="torch",
                      delays={"W": d})
    b.load_state_dict(a.state_dict())
    x = torch.rand(T, B, F) * 2
    assert torch.equal(a(x), b(x)) and torch.equal(a.W_delay, d)
    assert "x_in[t-2, j]" in flexdsl.feedforward("lif", F, H, delay=2).plan.equations[0]
    with pytest.raises(flexdsl.FlexDSLError, match="need a maximum"):
        flexdsl.feedforward("lif", F, H, delay="axonal")
