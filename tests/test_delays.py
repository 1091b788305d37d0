"""Fixed synaptic delays of feed-forward layers (`delay` lines): outputs and gradients against a
hand-written loop over a history of the inputs, the layer's kept history across calls, and every
bad delay a located error."""

from __future__ import annotations

import pytest
import torch

import flexdsl
from tests.tolerances import assert_close

pytestmark = pytest.mark.usefixtures("numpy_backend")
T, B, F, H, D = 9, 2, 5, 4, 3


def _layer(kind: str, neuron: str = "lif", connect: str = "dense") -> str:
    line = "        delay 3\n" if kind == "uniform" else f"        delay {kind} max {D}\n"
    return (f"layer L:\n    neuron {neuron}\n    size {H}\n    input s size {F if connect != 'one_to_one' else H}\n"
            f"    synapses W from s to x:\n        connect {connect}\n{line}        bias b\n")


def _hand(kind: str, x: torch.Tensor, W: torch.Tensor, b: torch.Tensor, d: torch.Tensor | None) -> torch.Tensor:
    """The currents `[T, B, H]`, one step and one connection at a time, from a history of zeros."""
    xx = torch.cat([torch.zeros(D, *x.shape[1:], dtype=x.dtype), x])
    out = []
    for t in range(x.shape[0]):
        rows = []
        for i in range(H):
            if kind == "dendritic":
                td = t - int(d[i])
                rows.append(xx[D + td] @ W[i] + b[i] if td >= 0 else torch.zeros(x.shape[1], dtype=x.dtype))
                continue
            acc = b[i].expand(x.shape[1])
            for j in range(x.shape[-1]):
                lag = 3 if kind == "uniform" else int(d[j] if kind == "axonal" else d[i, j])
                acc = acc + W[i, j] * xx[D + t - lag, :, j]
            rows.append(acc)
        out.append(torch.stack(rows, -1))
    return torch.stack(out)


SHAPES = {"uniform": None, "axonal": (F,), "synaptic": (H, F), "dendritic": (H,)}


@pytest.mark.parametrize("backend", ["torch", "numpy"])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_fixed_delays_equal_a_hand_loop_with_gradients(kind, backend):
    torch.manual_seed(1)
    shape = SHAPES[kind]
    d = torch.randint(0, D + 1, shape) if shape else None
    m = flexdsl.loads(_layer(kind, "li"), backend=backend, **({"delays": {"W": d}} if d is not None else {}))
    m = m.double()
    x = torch.rand(T, B, F, dtype=torch.float64, requires_grad=True)
    y = m(x)
    W = m.W.detach().clone().requires_grad_()
    bb = m.b.detach().clone().requires_grad_()
    ref = flexdsl.load("li", backend="torch").double()(_hand(kind, x, W, bb, d))
    # T steps of the leaky integrator (a few operations each) after a sum of F products
    assert_close(y, ref, ops=T * 6 + F + 1)
    g = torch.randn_like(y)
    gx, gw, gb = torch.autograd.grad((y * g).sum(), [x, m.W, m.b])
    rx, rw, rb = torch.autograd.grad((ref * g).sum(), [x, W, bb])
    for a, r in ((gx, rx), (gw, rw), (gb, rb)):
        assert_close(a, r, ops=T * (6 + F + 2) + T * B)


@pytest.mark.parametrize("kind", list(SHAPES))
def test_the_kept_history_makes_chunks_and_single_steps_one_call(kind):
    torch.manual_seed(2)
    shape = SHAPES[kind]
    d = torch.randint(0, D + 1, shape) if shape else None
    m = flexdsl.loads(_layer(kind), backend="torch", **({"delays": {"W": d}} if d is not None else {}))
    x = torch.rand(T, B, F) * 2
    whole = m(x)
    m.reset()
    parts = torch.cat([m(x[:2]), m(x[2:3]), m(x[3:])])
    m.reset()
    m.step_mode = "s"
    steps = torch.stack([m(x[t]) for t in range(T)])
    assert torch.equal(whole, parts) and torch.equal(whole, steps)
    m.reset()
    m.step_mode = "m"
    assert torch.equal(m(x), whole)  # reset(): the history is zeros again


def test_one_to_one_synapses_take_delays_per_neuron():
    torch.manual_seed(3)
    d = torch.tensor([0, 3, 1, 2])
    m = flexdsl.loads(_layer("axonal", "li", "one_to_one"), backend="torch", delays={"W": d}).double()
    x = torch.rand(T, B, H, dtype=torch.float64)
    xx = torch.cat([torch.zeros(D, B, H, dtype=torch.float64), x])
    xd = torch.stack([torch.stack([xx[D + t - int(d[i]), :, i] for i in range(H)], -1) for t in range(T)])
    ref = flexdsl.load("li", backend="torch").double()(xd * m.W.detach() + m.b.detach())
    assert_close(m(x), ref, ops=T * 6 + 2)


BAD = [
    ("        delay -2\n", {}, "negative", 6),
    ("        delay 2.5\n", {}, "whole number", 6),
    ("        delay 2 ms\n", {}, "a time", 6),
    ("        delay tau\n", {}, "a number of steps", 6),
    ("        delay axonal max 3\n", {"W": torch.tensor([0, 1, 4])}, "outside 0 to 3", 6),
    ("        delay axonal max 3\n", {"W": torch.tensor([0, -1, 2])}, "outside 0 to 3", 6),
    ("        delay axonal max 3\n", {"W": torch.tensor([0.0, float("nan"), 1.0])}, "not a whole number", 6),
    ("        delay axonal max 3\n", {"W": torch.tensor([0, 1])}, "have shape (2,)", 6),
    ("        delay synaptic max 3\n", {"V": torch.zeros(4, 3)}, "delays were given for `V`", 1),
    ("        delay 1\n        delay 2\n", {}, "second `delay`", 7),
]


@pytest.mark.parametrize("line,delays,msg,at", BAD, ids=[b[2] for b in BAD])
def test_bad_delays_are_located_errors(line, delays, msg, at):
    text = f"layer L:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W from s to x:\n{line}"
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.loads(text, delays=delays) if delays else flexdsl.loads(text)
    assert msg in e.value.reason and e.value.line == at, str(e.value)


def test_delays_changed_after_load_are_checked_and_a_new_batch_needs_reset():
    m = flexdsl.loads("layer L:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W from s to x:\n"
                      "        delay axonal max 3\n")
    m(torch.rand(5, 2, 3))
    with pytest.raises(flexdsl.FlexDSLError, match="call m.reset") as e:
        m(torch.rand(5, 7, 3))
    assert e.value.line == 6
    m.reset()
    m.W_delay.fill_(9)
    with pytest.raises(flexdsl.FlexDSLError, match="9 steps, outside 0 to 3"):
        m(torch.rand(5, 7, 3))


def test_axonal_delays_export_as_nir_delay_nodes_and_load_back():
    torch.manual_seed(4)
    text = ("layer L:\n    neuron lif\n    size 3\n    input s size 4\n    synapses W from s to x:\n"
            "        delay axonal max 5\n        bias b\n")
    ff = flexdsl.loads(text, delays={"W": torch.tensor([0, 2, 5, 1])})
    net = torch.nn.Sequential(ff, torch.nn.Linear(3, 2))
    g = flexdsl.nir.export(net, torch.rand(6, 1, 4), dt=1e-3)
    assert type(g.nodes["0.W_delay"]).__name__ == "Delay"
    assert g.nodes["0.W_delay"].delay.tolist() == pytest.approx([0.0, 0.002, 0.005, 0.001])
    back = flexdsl.nir.load(g)
    x = torch.rand(8, 2, 4) * 3
    want = net(x)
    # spikes equal (NIR's threshold is the float32 below flexdsl's `>=`), then a Linear of 3 terms
    assert_close(back(x), want, ops=3 + 4 + 8)
    back.reset()
    steps = flexdsl.nir.load(g, step_mode="s")
    assert_close(torch.stack([steps(x[t]) for t in range(8)]), want, ops=3 + 4 + 8)
    with pytest.raises(flexdsl.FlexDSLError, match="NIR cannot express") as e:
        flexdsl.nir.export(flexdsl.loads(text.replace("axonal", "synaptic"), delays={"W": torch.zeros(3, 4)}),
                           torch.rand(6, 1, 4), dt=1e-3)
    assert e.value.line == 6


def test_a_nir_delay_node_runs_as_whole_steps_of_dt():
    import nir
    import numpy as np

    d = np.array([0.0, 0.003, 0.001])
    g = nir.NIRGraph(nodes={"input": nir.Input(input_type=np.array([3])), "d": nir.Delay(delay=d),
                            "output": nir.Output(output_type=np.array([3]))},
                     edges=[("input", "d"), ("d", "output")])
    net = flexdsl.nir.load(g, dt=1e-3)
    x = torch.rand(6, 2, 3)
    want = torch.zeros_like(x)
    for j, k in enumerate([0, 3, 1]):  # x[t - k] of each channel, zeros before the first step
        want[k:, :, j] = x[:6 - k, :, j]
    assert torch.equal(net(x), want)
    with pytest.raises(flexdsl.FlexDSLError, match="not a whole number of steps"):
        flexdsl.nir.load(g, dt=2e-3)


def test_delays_in_time_units_are_whole_steps_of_the_neurons_dt():
    """`delay 2 ms` on a neuron with `dt` (lif_ode: 0.1 ms): 20 steps, the same layer as `delay 20`; with
    dt = 0.5 ms given at load, 4 steps; a time that is no whole number of steps, a unit that is no time,
    and a neuron without `dt` are located errors."""
    def text(line: str, neuron: str = "lif_ode", port: str = "I") -> str:
        return (f"layer L:\n    neuron {neuron}\n    size 3\n    input s size 2\n    synapses W from s to {port}:\n"
                f"        {line}\n")
    torch.manual_seed(5)
    a = flexdsl.loads(text("delay 2 ms"), backend="torch").double()
    b = flexdsl.loads(text("delay 20"), backend="torch").double()
    b.load_state_dict(a.state_dict())
    x = torch.rand(30, 2, 2, dtype=torch.float64) * 50
    assert torch.equal(a(x), b(x))
    assert "s[t-20, j]" in a.plan.equations[0]
    assert "s[t-4, j]" in flexdsl.loads(text("delay 2 ms"), dt=0.5).plan.equations[0]
    m = flexdsl.loads(text("delay axonal max 3 ms"), delays={"W": torch.tensor([30, 7])})
    assert m.W_delay.tolist() == [30, 7]
    for line, neuron, port, msg in [("delay 0.25 ms", "lif_ode", "I", "2.5 steps of dt = 0.1"),
                                    ("delay 2 mV", "lif_ode", "I", "not a time"),
                                    ("delay 2 ms", "lif", "x", "has no `dt` param"),
                                    ("delay 2 ms", "li", "x", "without a unit"),  # (dt = 0.001: s? a step?)
                                    ("delay axonal max 3 ms", "alif", "x", "without a unit")]:
        with pytest.raises(flexdsl.FlexDSLError, match=msg) as e:
            flexdsl.loads(text(line, neuron, port))
        assert e.value.line == 6
