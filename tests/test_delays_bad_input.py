"""Delays under bad input and at their edges (issue 33's bad input, as an attacker tries it): every
refusal a located `FlexDSLError`, never a bare exception, a NaN or a silently dropped delay; the
numbers at the edges (a tiny width, a call of no steps, a NIR round trip) against hand-derived values."""

from __future__ import annotations

import pytest
import torch

import flexdsl
from flexdsl import FlexDSLError
from flexdsl.runtime.delays import Delay


def _ff(line: str, neuron: str = "li") -> str:
    return (f"layer L:\n    neuron {neuron}\n    size 4\n    input s size 3\n    synapses W from s to x:\n"
            f"        {line}\n")


def _rec(in_line: str, rec_line: str = "") -> str:
    syn_in = "    synapses W_in from s to x:\n" + (f"        {in_line}\n" if in_line else "") + "        bias b\n"
    syn_rec = "    synapses W_rec from spike to x" + (f":\n        {rec_line}\n" if rec_line else "\n")
    return "layer R:\n    neuron lif\n    size 4\n    input s size 3\n" + syn_in + syn_rec


def _line_of(text: str, words: str) -> int:
    return next(i + 1 for i, line in enumerate(text.splitlines()) if words in line)


# ---------------------------------------------------------------------------------------------- NIR
@pytest.mark.parametrize("line", ["delay axonal max 3", "delay 3"])
def test_a_recurrent_layer_exports_its_input_delays_as_a_delay_node(line):
    """Axonal (or uniform) delays of a recurrent layer's input synapses are a NIR `Delay` node before
    its input Affine, and the graph loaded back gives the layer's spikes (it dropped them before)."""
    pytest.importorskip("nir")
    torch.manual_seed(5)
    kw = {"delays": {"W_in": torch.tensor([3, 1, 2])}} if "axonal" in line else {}
    m = flexdsl.loads(_rec(line), backend="torch", **kw)
    with torch.no_grad():
        m.W_in.copy_(torch.rand(4, 3) * 3)
        m.W_rec.copy_(torch.randn(4, 4) * 2)
    x = (torch.rand(12, 2, 3) < 0.5).float()
    y = m(x)
    m.reset()
    g = flexdsl.nir.export(m, x, dt=1e-3)
    delays = [n for n in g.nodes.values() if type(n).__name__ == "Delay"]
    assert len(delays) == 1
    want = [3, 1, 2] if "axonal" in line else [3, 3, 3]
    assert [round(v / 1e-3) for v in delays[0].delay.reshape(-1).tolist()] == want
    assert torch.equal(flexdsl.nir.load(g)(x), y)
    # the same layer with its delays set to 0 spikes otherwise: the delays are in the graph
    assert y.sum() > 0


@pytest.mark.parametrize("in_line, rec_line, words", [("delay synaptic max 3", "", "delay synaptic"),
                                                      ("delay dendritic max 3", "", "delay dendritic"),
                                                      ("", "delay axonal max 2", "delay axonal max 2"),
                                                      ("", "delay 2", "delay 2")])
def test_delays_nir_cannot_hold_are_refused_at_their_line(in_line, rec_line, words):
    pytest.importorskip("nir")
    text = _rec(in_line, rec_line)
    m = flexdsl.loads(text, backend="torch")
    with pytest.raises(FlexDSLError) as e:
        flexdsl.nir.export(m, torch.zeros(3, 1, 3), dt=1e-3)
    assert e.value.line == _line_of(text, words)


# ------------------------------------------------------------------------------- assigned delays
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_learnable_delay_made_non_finite_is_a_located_error(bad):
    """Assigned, or left by a gradient step: a clamp would keep NaN (every output NaN) or make inf
    the maximum silently."""
    text = _ff("delay axonal max 3 learnable")
    m = flexdsl.loads(text)
    m(torch.rand(2, 1, 3))
    with torch.no_grad():
        m.W_delay[1] = bad
    with pytest.raises(FlexDSLError, match="learnable delay of `W` is") as e:
        m(torch.rand(5, 2, 3))
    assert e.value.line == _line_of(text, "delay axonal")
    # a NaN gradient taken by an optimizer: the next call says so too
    m = flexdsl.loads(text)
    m(torch.rand(5, 2, 3)).sum().backward()
    m.W_delay.grad.fill_(float("nan"))
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    with pytest.raises(FlexDSLError, match="nan"):
        m(torch.rand(5, 2, 3))


@pytest.mark.parametrize("line, value", [("delay axonal max 3 learnable", torch.tensor([0.5, 1.5])),
                                         ("delay dendritic max 3 learnable", torch.tensor([0.5, 1.5])),
                                         ("delay synaptic max 3 learnable", torch.ones(4, 1)),
                                         ("delay axonal max 3", torch.tensor([0, 1, 2, 3])),
                                         ("delay synaptic max 3", torch.ones(1, 3, dtype=torch.long))])
def test_delays_assigned_in_another_shape_are_errors_never_a_broadcast(line, value):
    text = _ff(line)
    m = flexdsl.loads(text, backend="torch")
    m.W_delay = torch.nn.Parameter(value) if value.is_floating_point() else value
    with pytest.raises(FlexDSLError, match="W_delay") as e:
        m(torch.rand(5, 2, 3))
    assert e.value.line == _line_of(text, "delay")


@pytest.mark.parametrize("width", ["x", None, [1.0]])
def test_a_width_that_is_not_a_number_is_a_located_error(width):
    m = flexdsl.loads(_ff("delay axonal max 3 learnable"))
    with pytest.raises(FlexDSLError, match="number of steps"):
        m.set_delay_width(width)


# ------------------------------------------------------------------------------------ numbers at edges
@pytest.mark.parametrize("dtype, width", [(torch.float32, 1e-20), (torch.float32, 1e-30), (torch.float64, 1e-160),
                                          (torch.float64, 1e-200)])
def test_a_tiny_gauss_width_gives_the_gaussians_limit(dtype, width):
    """σ → 0: the taps of a whole delay are one-hot, those of a half step split evenly (both steps are
    as near); computed as `exp(-(k-d)²/2σ²)` they were 0 * inf = NaN (and σ² = 0 a ZeroDivisionError)."""
    torch.manual_seed(2)
    m = flexdsl.loads(_ff("delay axonal max 3 learnable"), delays={"W": torch.tensor([0.0, 1.5, 3.0])}).to(dtype)
    m.set_delay_width(width)
    x = torch.rand(7, 2, 3, dtype=dtype, requires_grad=True)
    cur = m.current(x)
    xp = torch.cat([torch.zeros(3, 2, 3, dtype=dtype), x.detach()])  # x[t - k] = xp[3 + t - k]
    delayed = torch.stack([xp[3:, :, 0], 0.5 * (xp[2:-1, :, 1] + xp[1:-2, :, 1]), xp[:-3, :, 2]], -1)
    want = delayed @ m.W.detach().T
    assert torch.allclose(cur.detach(), want, rtol=4 * torch.finfo(dtype).eps * 3, atol=4 * torch.finfo(dtype).eps * 3)
    cur.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(m.W_delay.grad).all()


@pytest.mark.parametrize("line", ["delay synaptic max 3 learnable", "delay axonal max 3 learnable",
                                  "delay dendritic max 3 learnable", "delay synaptic max 3 learnable linear"])
def test_a_call_of_no_steps_returns_nothing_and_keeps_the_buffer(line):
    torch.manual_seed(4)
    m = flexdsl.loads(_ff(line, "lif"), backend="torch")
    x = torch.rand(6, 2, 3) * 2
    whole = m(x)
    m.reset()
    a = m(x[:3])
    empty = m(x[:0])
    b = m(x[3:])
    assert empty.shape == (0, 2, 4)
    assert torch.equal(torch.cat([a, b]), whole)


# ------------------------------------------------------------------------------- the Delay layer
def test_the_delay_layer_refuses_a_batch_change_and_bad_delays():
    d = Delay(torch.tensor([1, 2, 0]), 3)
    d(torch.rand(6, 2, 3))
    with pytest.raises(FlexDSLError, match="reset"):
        d(torch.rand(6, 5, 3))
    d.reset()
    assert d(torch.rand(6, 5, 3)).shape == (6, 5, 3)
    with torch.no_grad():
        d.delay.fill_(7)
    with pytest.raises(FlexDSLError, match="outside 0 to 3"):
        d(torch.rand(6, 5, 3))
    for bad in (torch.tensor([-1, 2]), torch.tensor([0.5, 2.0]), torch.tensor([float("nan")])):
        with pytest.raises(FlexDSLError):
            Delay(bad)
    with pytest.raises(FlexDSLError, match="input of shape"):
        Delay(torch.tensor([1, 2, 0]))(torch.rand(4, 2, 5))


def test_the_delay_layer_delays_each_value_of_a_per_sample_shape():
    """NIR's Delay is element-wise: delays of shape (2, 3) on inputs [T, B, 2, 3], against a hand loop."""
    dl = torch.tensor([[1, 2, 0], [0, 0, 3]])
    x = torch.rand(8, 2, 2, 3)
    out = Delay(dl)(x)
    for i in range(2):
        for j in range(3):
            k = int(dl[i, j])
            want = torch.cat([torch.zeros(k, 2), x[:8 - k, :, i, j]])
            assert torch.equal(out[:, :, i, j], want)


# ------------------------------------------------------------------------------------- the builders
def test_learnable_delays_without_a_maximum_are_a_located_error_from_the_builder():
    with pytest.raises(FlexDSLError, match="maximum"):
        flexdsl.feedforward("lif", 3, 4, learnable_delays=True)
    with pytest.raises(FlexDSLError, match="maximum"):
        flexdsl.feedforward("lif", 3, 4, delay="axonal", learnable_delays=True)
    m = flexdsl.feedforward("lif", 3, 4, delay="axonal", max_delay=5, learnable_delays="linear")
    assert "delay axonal max 5 learnable linear" in m.layer_text
    assert m.W_delay.shape == (3,)


def test_eprop_refuses_delays_at_their_line():
    text = _rec("delay axonal max 3")
    with pytest.raises(FlexDSLError, match="delays") as e:
        flexdsl.loads(text, learning="eprop")
    assert e.value.line == _line_of(text, "delay axonal")


def test_a_nir_delay_of_a_per_sample_shape_loads_and_says_what_went_wrong():
    """NIR's Delay is element-wise: a node of shape (2, 3) loads and delays each value (it failed at
    load); a batch change without reset() and a delay assigned out of range name the node and say
    why (not "does not fit its input")."""
    nir = pytest.importorskip("nir")
    import numpy as np

    d = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    g = nir.NIRGraph(nodes={"input": nir.Input(input_type={"input": np.array([2, 3])}),
                            "d": nir.Delay(delay=d * 1e-3),
                            "output": nir.Output(output_type={"output": np.array([2, 3])})},
                     edges=[("input", "d"), ("d", "output")])
    net = flexdsl.nir.load(g, dt=1e-3)
    x = torch.rand(8, 2, 2, 3)
    y = net(x)
    for i in range(2):
        for j in range(3):
            k = int(d[i, j])
            assert torch.equal(y[:, :, i, j], torch.cat([torch.zeros(k, 2), x[:8 - k, :, i, j]]))
    with pytest.raises(FlexDSLError, match=r"NIR node `d` \(Delay\): the 3 steps") as e:
        net(torch.rand(8, 5, 2, 3))
    assert "reset()" in str(e.value)


def test_the_builder_takes_delays_by_synapse_name_too():
    t = torch.tensor([1.0, 2.0, 0.0, 3.0])
    a = flexdsl.feedforward("lif", 4, 3, delay="axonal", max_delay=5, learnable_delays=True, delays={"W": t})
    b = flexdsl.feedforward("lif", 4, 3, delay="axonal", max_delay=5, learnable_delays=True, delays=t)
    assert torch.equal(a.W_delay.detach(), t) and torch.equal(b.W_delay.detach(), t)
    with pytest.raises(FlexDSLError, match="delays were given for `V`"):
        flexdsl.feedforward("lif", 4, 3, delay="axonal", max_delay=5, delays={"V": t.long()})


@pytest.mark.parametrize("kind", ["synaptic", "axonal", "dendritic"])
@pytest.mark.parametrize("recurrent", [False, True])
def test_linear_delays_at_whole_steps_take_the_one_sided_derivative(kind, recurrent):
    """The linear relaxation is piecewise linear in d: at a whole d (0, max, or clamped there) its
    gradient is the one-sided derivative of the step above (at max, below), as the two-step reads give
    it; autograd of max(0, 1 - |k - d|) summed both sides (twice it inside, the wrong sign at 0).
    Against one-sided finite differences of the layer (float64, h = 1e-6: exact on a linear piece)."""
    D = 3 if recurrent else 4
    name = "W_rec_delay" if recurrent else "W_delay"
    head = "layer L:\n    neuron li\n    size 2\n    input s size 2\n"
    text = head + (f"    synapses W_in from s to x\n    synapses W_rec from v to x:\n        delay {kind} max {D} "
                   "learnable linear\n" if recurrent else
                   f"    synapses W from s to x:\n        delay {kind} max {D} learnable linear\n")
    torch.manual_seed(0)
    x = torch.rand(6, 1, 2, dtype=torch.float64)
    m = flexdsl.loads(text, backend="torch").double()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n in ("W", "W_in", "W_rec"):
                p.fill_(0.3 if n == "W_rec" else 1.0)

    def loss(v: float) -> torch.Tensor:
        m.reset()
        with torch.no_grad():
            getattr(m, name).fill_(v)
        return m(x).sum()

    h = 1e-6
    for d in (0.0, 2.0, 2.5, float(D)):
        m.zero_grad()
        loss(d).backward()
        got = float(getattr(m, name).grad.sum())
        fd = float(loss(d + h) - loss(d)) / h if d < D else float(loss(d) - loss(d - h)) / h
        assert abs(got - fd) <= 1e-6 * max(1.0, abs(fd)), (d, got, fd)


@pytest.mark.parametrize("kw, words", [(dict(delay="2\n        bias zz"), "a word"),
                                       (dict(delay=3, max_delay=5), "every connection"),
                                       (dict(delay="Synaptic", max_delay=3), "did you mean `synaptic`"),
                                       (dict(delay="axonal", max_delay="4:"), "a word")])
def test_feedforward_refuses_delay_arguments_that_are_not_a_delays_words(kw, words):
    """`delay=` was pasted into the layer text as given: a newline added lines (a bias the caller turned
    off), `max_delay` beside a whole delay was dropped, a capitalised kind got the parser's message."""
    with pytest.raises(flexdsl.FlexDSLError, match=words):
        flexdsl.feedforward("lif", 3, 4, bias=False, **kw)


@pytest.mark.parametrize("kind", ["axonal", "synaptic", "dendritic"])
def test_fixed_delays_assigned_as_whole_floats_run_as_those_steps(kind):
    """`m.W_delay = torch.ones(...)` (float, whole, in range) passed the check, then the gather failed."""
    text = f"layer L:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W from s to x:\n        delay {kind} max 3\n"
    torch.manual_seed(0)
    a = flexdsl.loads(text, backend="torch")
    b = flexdsl.loads(text, backend="torch")
    b.load_state_dict(a.state_dict())
    shape = tuple(a.W_delay.shape)
    a.W_delay = torch.full(shape, 2.0)
    b.W_delay = torch.full(shape, 2, dtype=torch.long)
    x = torch.rand(6, 2, 3) * 3
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize("recurrent", [False, True])
def test_fixed_synaptic_delays_with_a_bias_keep_autocasts_dtype(recurrent):
    """The per-delay products' sum plus a float32 bias came out float32 under bf16 autocast: a
    recurrent layer's backward then failed (a bare dtype error), a feed-forward one returned float32."""
    txt = ("layer R:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W_in from s to x:\n"
           "        delay synaptic max 3\n        bias b\n" + ("    synapses W_rec from spike to x\n" if recurrent else ""))
    torch.manual_seed(1)
    m = flexdsl.loads(txt, backend="torch")
    x = (torch.rand(8, 2, 3) < 0.5).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = m.current(x) if not recurrent else None
        y = m(x)
    y.float().sum().backward()
    assert m.W_in.grad is not None and torch.isfinite(m.W_in.grad).all()
    if c is not None:
        assert c.dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------- signs
@pytest.mark.parametrize("line, neuron, shown", [
    ("delay -1 ms", "lif_ode", "-1 ms"),   # (was "must be a number of steps", hint `delay 3`)
    ("delay -0.1 ms", "lif_ode", "-0.1 ms"),
    ("delay -2", "li", "-2"),
    ("delay axonal max -2", "li", "-2"),
])
def test_a_negative_delay_says_it_is_negative(line, neuron, shown):
    text = _ff(line, neuron).replace("to x:", "to I:" if neuron == "lif_ode" else "to x:")
    with pytest.raises(FlexDSLError) as e:
        flexdsl.loads(text)
    assert f"is negative ({shown})" in e.value.reason and e.value.line == 6
    assert e.value.column == text.splitlines()[5].index("-") + 1
    assert f"`delay {shown[1:]}`" in e.value.hint


@pytest.mark.parametrize("line, neuron", [("delay -0", "li"), ("delay -0 ms", "lif_ode"), ("delay -0.0", "li")])
def test_minus_zero_is_a_delay_of_zero(line, neuron):
    """`delay -0` was refused as "negative (-0)"."""
    text = _ff(line, neuron).replace("to x:", "to I:" if neuron == "lif_ode" else "to x:")
    torch.manual_seed(0)
    m = flexdsl.loads(text, backend="torch").double()
    torch.manual_seed(0)
    ref = flexdsl.loads(text.replace(line, "delay 0"), backend="torch").double()
    x = torch.rand(5, 2, 3, dtype=torch.float64)
    with torch.no_grad():
        ref.W.copy_(m.W)
    assert torch.equal(m(x), ref(x))
