"""The layer level (`.layer` files, `flexdsl.feedforward`, `flexdsl.recurrent` on the layer plan):
outputs and gradients against independent references (SpikingJelly's `Linear` + `LIFNode`, a
hand loop), the plan's derived equations, and every bad layer a located error at load."""

from __future__ import annotations

import warnings

import pytest
import torch

import flexdsl
from flexdsl.frontend import ast as A
from flexdsl.frontend.parse import parse_layer
from tests.tolerances import assert_close

warnings.filterwarnings("ignore", module="spikingjelly")
from spikingjelly.activation_based import neuron as sj_neuron  # noqa: E402
from spikingjelly.activation_based import surrogate as sj_surrogate  # noqa: E402

FF = """layer FF:
    neuron lif
    input spikes size 12
    synapses W from spikes to x:
        bias b
"""


def _sj_reference(W: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor):
    """Linear then SpikingJelly's LIFNode (tau=2, hard reset, sigmoid(alpha=4)) over [T, B, F]."""
    lif = sj_neuron.LIFNode(tau=2.0, surrogate_function=sj_surrogate.Sigmoid(alpha=4.0), step_mode="m")
    return lif(torch.nn.functional.linear(x, W, b))


# every backend with a training program: the built-in ones and the NumPy backend of tests/numpy_backend
# (a backend that is one folder and one registry line)
pytestmark = pytest.mark.usefixtures("numpy_backend")
BACKENDS = ["torch", "cpu", "numpy"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_feedforward_layer_file_equals_linear_then_spikingjelly_lif(backend):
    torch.manual_seed(0)
    m = flexdsl.loads(FF, hidden=9, backend=backend).double()
    x = torch.rand(7, 3, 12, dtype=torch.float64)
    y = m(x)
    W = m.W.detach().clone().requires_grad_()
    b = m.b.detach().clone().requires_grad_()
    ref = _sj_reference(W, b, x)
    assert torch.equal(y, ref)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    (ref * g).sum().backward()
    # T=7 steps of a few operations each, then a sum over T*B=21 rows of products of 12 terms
    assert_close(m.W.grad, W.grad, ops=7 * 8 + 21 + 12)
    assert_close(m.b.grad, b.grad, ops=7 * 8 + 21)


def test_feedforward_api_is_the_same_layer_as_its_file():
    torch.manual_seed(1)
    f = flexdsl.feedforward("lif", 12, 9)
    m = flexdsl.loads(FF.replace("bias b", "bias bias"), hidden=9)
    m.load_state_dict(f.state_dict())
    x = torch.rand(5, 2, 12)
    assert torch.equal(f(x), m(x))
    assert "W" in dict(f.named_parameters()) and "bias" in dict(f.named_parameters())


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_to_one_and_masked_synapses_compute_what_they_say(backend):
    torch.manual_seed(2)
    text = """layer L:
    neuron lif
    size 6
    input a size 6
    input c size 4
    synapses Wa from a to x:
        connect one_to_one
    synapses Wc from c to x:
        connect mask
"""
    mask = torch.rand(6, 4) > 0.5
    m = flexdsl.loads(text, masks={"Wc": mask}, backend=backend).double()
    assert tuple(m.Wa.shape) == (6,) and tuple(m.Wc.shape) == (6, 4)
    assert bool((m.Wc[~mask] == 0).all())  # masked entries start at 0
    with torch.no_grad():
        m.Wc.normal_()
    a, c = torch.rand(5, 2, 6, dtype=torch.float64), torch.rand(5, 2, 4, dtype=torch.float64)
    want = flexdsl.load("lif", backend="torch").double()(a * m.Wa + c @ (m.Wc * mask).T)
    assert torch.equal(m(a, c), want)


def test_a_recurrent_layer_file_is_flexdsl_recurrent():
    torch.manual_seed(3)
    m = flexdsl.load("rlif.layer", hidden=10, in_features=7)
    r = flexdsl.recurrent("lif", 7, 10)
    assert type(m) is type(r)
    r.load_state_dict(m.state_dict())
    x = torch.rand(6, 2, 7)
    assert torch.equal(m(x), r(x))
    # the plan the scan runs from: the recurrent synapse in the loop, the input product before it
    assert r.plan.scan is not None and r.plan.scan.dense and r.plan.synapse("W_in").fused
    assert "W_rec" in r.layer_text and "bias bias" in r.layer_text


@pytest.mark.parametrize("build", [
    lambda: flexdsl.recurrent("lif", 7, 10, connectivity="one_to_one"),
    lambda: flexdsl.recurrent("examples/song_lif.neuron", 7, 10),
    lambda: flexdsl.feedforward("lif", 7, 10, delay=2),
    lambda: flexdsl.feedforward("lif", 7, 10, rule="stdp_song"),
], ids=["recurrent_library", "recurrent_file", "feedforward_delay", "feedforward_rule"])
def test_a_layers_text_loads_again_into_the_same_layer(build, monkeypatch, tmp_path):
    """`m.layer_text` names the neuron as a layer file can (a library model by its name, a file by its
    path: it named the model's class, `neuron LIF`, which no layer file can load): loaded again, from
    another directory, with the same weights, the same outputs."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    torch.manual_seed(5)
    m = build()
    monkeypatch.chdir(tmp_path)
    again = flexdsl.loads(m.layer_text)
    assert type(again) is type(m)
    again.load_state_dict(m.state_dict())
    x = (torch.rand(6, 2, 7) < 0.5).float()
    assert torch.equal(again(x), m(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_recurrent_layer_against_a_hand_loop_float64(backend):
    """x[t] = W_in u[t] + b + W_rec s[t-1] into LIF (tau=2, hard reset), by hand."""
    torch.manual_seed(4)
    m = flexdsl.load("rlif.layer", hidden=5, in_features=3, backend=backend).double()
    u = torch.rand(8, 2, 3, dtype=torch.float64) * 2
    y = m(u)
    v = torch.zeros(2, 5, dtype=torch.float64)
    s = torch.zeros(2, 5, dtype=torch.float64)
    out = []
    for t in range(8):
        cur = u[t] @ m.W_in.T + m.bias + s @ m.W_rec.T
        v = v + (cur - v) / 2.0
        s = (v >= 1.0).double()
        v = torch.where(s > 0, torch.zeros_like(v), v)
        out.append(s)
    assert torch.equal(y, torch.stack(out).detach())


def test_the_plan_derives_the_gradients_and_says_where_they_run():
    m = flexdsl.load("rlif.layer", hidden=4, in_features=3)
    eq = "\n".join(m.plan.equations)
    assert "dL/dW_rec = sum_(t,batch) dL/dx[t]^T spike[t-1]" in eq
    assert "(in the loop)" in eq and "(before the loop, all steps at once)" in eq
    from flexdsl.ir.layer import derive_current

    assert derive_current("w*pre") == ("product", "product")
    with pytest.raises(NotImplementedError):
        derive_current("w*pre**2")


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_state_is_kept_and_chunked_calls_equal_one_call(backend):
    torch.manual_seed(5)
    m = flexdsl.loads(FF, hidden=9, backend=backend)
    x = torch.rand(8, 2, 12)
    whole = m(x)
    m.reset()
    parts = torch.cat([m(x[:3]), m(x[3:])])
    assert torch.equal(whole, parts)
    m.reset()
    m.step_mode = "s"
    steps = torch.stack([m(x[t]) for t in range(8)])
    assert torch.equal(whole, steps)


BAD = [
    ("    synapses W from spikes to y\n", "no input `y`", 4),
    ("    synapses W from nope to x\n", "neither an input", 4),
    ("    synapses W from v to x\n", "not an output", 4),
    ("    synapses W from spikes to x:\n        connect one_to_one\n", "one_to_one", 5),
    ("    synapses W from spikes to x:\n        connect sparse\n", "unknown connectivity", 5),
    ("    synapses W from spikes to x:\n        state tr = 0\n", "synaptic state", 5),
    ("    synapses W from nope to x:\n        delay 3\n", "neither an input", 4),
    ("    synapses W from spikes to x:\n        on pre:\n            trace += 1\n", "not a state", 6),
    ("    synapses W from spikes to x:\n        on spike:\n            W += 1\n", "unknown synaptic event", 5),
    ("    synapses tau from spikes to x\n", "a param of the neuron", 4),
    ("    synapses W from big to x\n    input big size 2000000000\n", "weights (the limit", 4),
    ("    synapses W from spikes to x\n    synapses W2 from spike to x\n    synapses W3 from spike to x\n",
     "at most one recurrent", 6),
]


@pytest.mark.parametrize("syn,msg,line", BAD, ids=[b[1] for b in BAD])
def test_a_layer_whose_pieces_do_not_fit_is_a_located_error(syn, msg, line):
    text = "layer L:\n    neuron lif\n    input spikes size 3\n" + syn
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.loads(text, hidden=4)
    assert msg in e.value.reason and e.value.line == line, str(e.value)
    assert "^" in str(e.value)


def test_sizes_and_masks_given_at_load_are_checked():
    text = "layer L:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W from s to x:\n        connect mask\n"
    with pytest.raises(flexdsl.FlexDSLError, match="no mask was given") as e:
        flexdsl.loads(text)
    assert e.value.line == 6
    with pytest.raises(flexdsl.FlexDSLError, match=r"has shape \(3, 4\)"):
        flexdsl.loads(text, masks={"W": torch.ones(3, 4)})
    with pytest.raises(flexdsl.FlexDSLError, match="but 5 was given at load"):
        flexdsl.loads(text, hidden=5, masks={"W": torch.ones(4, 3)})
    with pytest.raises(flexdsl.FlexDSLError, match="no size") as e:
        flexdsl.loads("layer L:\n    neuron lif\n    size 4\n    input s\n    synapses W from s to x\n")
    assert e.value.line == 4
    m = flexdsl.loads(text.replace("    input s size 3\n", "    input s\n"), in_features=3,
                      masks={"W": torch.ones(4, 3)})
    with pytest.raises(flexdsl.FlexDSLError, match=r"input `s` has shape \(2, 5\)"):
        m(torch.rand(2, 5))


def test_the_neuron_line_is_resolved_beside_the_layer_file(tmp_path):
    from flexdsl._paths import NEURONS_DIR

    (tmp_path / "mine.neuron").write_text((NEURONS_DIR / "lif.neuron").read_text())
    p = tmp_path / "l.layer"
    p.write_text('layer L:\n    neuron "mine.neuron"\n    size 3\n    input s size 2\n    synapses W from s to x\n')
    m = flexdsl.load(p)
    assert m(torch.rand(4, 1, 2)).shape == (4, 1, 3)
    p.write_text('layer L:\n    neuron "missing.neuron"\n    size 3\n    input s size 2\n    synapses W from s to x\n')
    with pytest.raises(flexdsl.FlexDSLError, match="no such file") as e:
        flexdsl.load(p)
    assert e.value.line == 2


def test_layer_syntax_positions():
    lay = parse_layer(FF, "ff.layer")
    syn = lay.items[-1]
    assert (syn.pre_pos.line, syn.pre_pos.column) == (4, 21)
    assert syn.bias == "b"


def test_a_feedforward_layer_compiles_as_one_graph_with_the_eager_values():
    torch.manual_seed(6)
    f = flexdsl.feedforward("lif", 12, 8, backend="torch")
    x = torch.rand(5, 3, 12)
    ref = f(x)
    ref.sum().backward()
    g_ref = f.W.grad.clone()
    f.zero_grad()
    f.reset()
    y = torch.compile(f, fullgraph=True)(x)
    assert torch.equal(y, ref)
    y.sum().backward()
    # the same products and the neuron's derived backward: 5 steps, a sum over 15 rows of 12 terms
    assert_close(f.W.grad, g_ref, ops=5 * 8 + 15 + 12)


def test_a_second_process_builds_a_layer_without_sympy(tmp_path):
    """The layer's plan is data in the disk cache: a process that has seen the layer builds it (and
    runs it) without importing sympy, with the first process's results."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, json, torch, flexdsl; torch.manual_seed(0); "
            "m = flexdsl.load('rlif.layer', hidden=5, in_features=3, backend='torch'); "
            "y = m(torch.rand(4, 2, 3)); print(json.dumps(['sympy' in sys.modules, y.tolist(), m.plan.equations]))")
    env = {**os.environ, "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    root = Path(__file__).resolve().parent.parent
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    (used1, y1, eq1), (used2, y2, eq2) = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert used1 is True and used2 is False and y1 == y2 and eq1 == eq2


@pytest.mark.parametrize("doc,start", [("docs/language.md", "# rlif.layer (in the library"),
                                       ("README.md", "layer RLIF:")])
def test_the_layers_the_docs_show_load(doc, start, tmp_path):
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / doc).read_text()
    i = text.index(start)
    p = tmp_path / "shown.layer"
    shown = text[i:text.index("```", i)]
    p.write_text(shown)
    sized = any(isinstance(it, A.LayerSize) for it in parse_layer(shown).items)  # (else the sizes come at load)
    m = flexdsl.load(p) if sized else flexdsl.load(p, hidden=8, in_features=700)
    assert isinstance(m, flexdsl.RecurrentModule)
    assert m(torch.rand(2, 1, 700)).shape[-1] == m.hidden


def test_a_feedforward_layer_exports_to_nir_as_affine_then_neuron_and_loads_back():
    torch.manual_seed(7)
    ff = flexdsl.feedforward("lif", 4, 3)
    net = torch.nn.Sequential(ff, torch.nn.Linear(3, 2))
    g = flexdsl.nir.export(net, torch.rand(5, 1, 4), dt=1e-3)
    kinds = {k: type(v).__name__ for k, v in g.nodes.items()}
    assert kinds["0.W"] == "Affine" and kinds["0.neuron"] == "LIF"
    assert ff.W.grad is None and isinstance(net[0], flexdsl.FeedForwardModule)  # (the network is unchanged)
    back = flexdsl.nir.load(g)
    x = torch.rand(6, 2, 4) * 2
    want = net(x)
    got = back(x)
    # spikes equal (NIR's threshold is the float32 below flexdsl's `>=`), then one Linear of 3 terms
    assert_close(got, want, ops=3 + 8)
    text = "layer L:\n    neuron lif\n    size 3\n    input a size 3\n    synapses W from a to x:\n        connect one_to_one\n"
    with pytest.raises(flexdsl.FlexDSLError, match="no nn.Linear form") as e:
        flexdsl.nir.export(flexdsl.loads(text), torch.rand(5, 1, 3), dt=1e-3)
    assert e.value.line == 5


def test_a_recurrent_layer_file_keeps_its_names_and_answers_to_the_usual_ones():
    torch.manual_seed(8)
    text = ("layer R:\n    neuron lif\n    size 6\n    input u size 4\n    synapses A from u to x:\n        bias c\n"
            "    synapses B from spike to x\n")
    m = flexdsl.loads(text)
    assert sorted(dict(m.named_parameters())) == ["A", "B", "c"]
    assert m.W_in is m.A and m.W_rec is m.B and m.bias is m.c
    r = flexdsl.recurrent("lif", 4, 6)
    rename = {"A": "W_in", "B": "W_rec", "c": "bias"}
    r.load_state_dict({rename.get(k, k): v for k, v in m.state_dict().items()})
    x = torch.rand(5, 2, 4)
    assert torch.equal(m(x), r(x))
    with pytest.raises(flexdsl.FlexDSLError, match="cannot be None"):
        m.W_rec = None
    with pytest.raises(flexdsl.FlexDSLError, match="names the layer's W_in") as e:
        flexdsl.loads(text.replace("synapses A ", "synapses W_rec "))
    assert e.value.line == 5
