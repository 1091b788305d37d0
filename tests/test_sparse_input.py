"""Sparse inputs (`flexdsl.feedforward(..., sparse_input=True)`, `runtime/sparse.py`,
`backends/triton/sparse.py`, run here by Triton's interpreter): the product taken from the input's
nonzero entries (fused with the neuron's steps for inference, a differentiable product for
training) gives the dense layer's results, measured against the dense layer in float64 on the
torch backend: spikes identical, states and gradients within the float32 error of the sums."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

import flexdsl
from flexdsl import FlexDSLError
from flexdsl.backends.triton.kernel import LAUNCHES

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="Triton needs a GPU or TRITON_INTERPRET=1")
EPS32 = torch.finfo(torch.float32).eps
DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # (the interpreter runs CPU tensors)
SCALE = {"alif": 150.0}  # the weights' scale at which a layer of the model spikes (default 20)


def _pair(model: str, n_in: int = 40, n_out: int = 12, **kw):
    """The sparse layer (Triton, float32) and the same layer dense on torch in float64."""
    torch.manual_seed(0)
    m = flexdsl.feedforward(model, n_in, n_out, backend="triton", sparse_input=kw.pop("sparse", True), **kw)
    with torch.no_grad():
        m.W.mul_(SCALE.get(model, 20.0))
    ref = flexdsl.feedforward(model, n_in, n_out, backend="torch", **kw)
    ref.load_state_dict(m.state_dict())
    return m.to(DEV), ref.double().to(DEV)


def _spikes(shape, rate: float, seed: int = 1, graded: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(*shape, generator=g) < rate).float()
    return (x * (0.5 + torch.rand(*shape, generator=g)) if graded else x).to(DEV)


def _bound(m, x: torch.Tensor, T: int) -> float:
    # float32 error of a state after T steps: each step's current a sum of n_in terms (n_in * eps of
    # the terms' magnitudes) plus the step's own arithmetic, carried over T steps
    w = m.W.detach().abs().double()
    terms = (x.abs().double() @ w.t()).max().item()
    return 8 * T * x.shape[-1] * EPS32 * max(terms, 1.0)


@pytest.mark.parametrize("model", ["lif", "alif", "izhikevich", "if"])
def test_inference_fused_equals_dense_float64(model):
    m, ref = _pair(model)
    x = _spikes((10, 3, 40), 0.04)
    before = LAUNCHES["sparse_fwd"], LAUNCHES["fwd"]
    with torch.no_grad():
        outs = [m(x[:4]), m(x[4:])]  # two calls: the states carry over
        refs = [ref(x[:4].double()), ref(x[4:].double())]
    assert m.sparse_report()["W"][0] == "sparse fused"
    assert LAUNCHES["sparse_fwd"] - before[0] == 2 and LAUNCHES["fwd"] == before[1]  # (one kernel a call)
    spikes = torch.cat([o if not isinstance(o, tuple) else o[0] for o in outs])
    spikes_ref = torch.cat([o if not isinstance(o, tuple) else o[0] for o in refs])
    assert spikes.sum() > 0, "the test needs a layer that spikes"
    assert torch.equal(spikes.double(), spikes_ref)
    bound = _bound(m, x, 10)
    for name, v in ref.neuron._states.items():
        assert (m.neuron._states[name].double() - v).abs().max().item() <= bound * max(1.0, v.abs().max().item())


def test_training_product_gradients_equal_dense_float64():
    m, ref = _pair("lif")
    x = _spikes((8, 2, 2, 40), 0.03, seed=3).requires_grad_(True)
    x64 = x.detach().double().requires_grad_(True)
    g = torch.randn(8, 2, 2, 12, generator=torch.Generator().manual_seed(5)).to(DEV)
    before = LAUNCHES["sparse_gather"]
    out = m(x)
    assert LAUNCHES["sparse_gather"] == before + 1 and m.sparse_report()["W"][0] == "sparse"
    (out * g).sum().backward()
    out64 = ref(x64)
    (out64 * g.double()).sum().backward()
    assert out.sum() > 0 and torch.equal(out.double(), out64.detach())
    for a, b in ((m.W.grad, ref.W.grad), (m.bias.grad, ref.bias.grad), (x.grad, x64.grad)):
        scale = max(b.abs().max().item(), 1.0)
        assert (a.double() - b).abs().max().item() <= 8 * 8 * 40 * EPS32 * scale * 10


def test_dense_fallback_above_the_density_and_always(monkeypatch):
    x = _spikes((6, 3, 40), 0.3, seed=7)
    m, ref = _pair("lif")
    with torch.no_grad():
        y, y64 = m(x), ref(x.double())
    assert m.sparse_report()["W"] == ("dense fused", pytest.approx((x != 0).float().mean().item()))
    assert torch.equal(y.double(), y64)
    m.reset()
    ref.reset()
    m.sparse_input = "always"  # (no count read back: sparse whatever the density)
    with torch.no_grad():
        y = m(x)
    assert m.sparse_report()["W"][0] == "sparse fused" and torch.equal(y.double(), y64)
    monkeypatch.setenv("FLEXDSL_SPARSE_DENSITY", "0.5")
    m.sparse_input = True
    m.reset()
    with torch.no_grad():
        m(x)
    assert m.sparse_report()["W"][0] == "sparse fused"


def test_masked_graded_bias_free_and_not_fused(monkeypatch):
    mask = (torch.rand(12, 40, generator=torch.Generator().manual_seed(2)) < 0.5).float()  # (moved with the layer)
    m, ref = _pair("lif", connectivity="mask", mask=mask, bias=False)
    x = _spikes((7, 3, 40), 0.04, seed=4, graded=True)
    monkeypatch.setenv("FLEXDSL_SPARSE_FUSED", "0")
    before = LAUNCHES["sparse_fwd"]
    with torch.no_grad():
        y, y64 = m(x), ref(x.double())
    assert LAUNCHES["sparse_fwd"] == before and m.sparse_report()["W"][0] == "sparse"
    assert y.sum() > 0 and torch.equal(y.double(), y64)
    bound = _bound(m, x, 7)
    assert (m.neuron.v.double() - ref.neuron.v).abs().max().item() <= bound


def test_single_steps_equal_one_call():
    # (taken sparse in every call: a step's own count could choose the dense product, whose sums run
    # in another order than the gather's)
    m, _ = _pair("lif", sparse="always")
    x = _spikes((6, 2, 40), 0.05, seed=9)
    with torch.no_grad():
        whole = m(x)
        v_whole = m.neuron.v.clone()
        m.reset()
        m.step_mode = "s"
        m.neuron.step_mode = "s"
        steps = torch.stack([m(x[t]) for t in range(6)])
    assert torch.equal(whole, steps)
    assert torch.allclose(m.neuron.v, v_whole, rtol=0, atol=0)


def test_torch_backend_and_pickle_keep_the_dense_path():
    torch.manual_seed(0)
    m = flexdsl.feedforward("lif", 40, 12, backend="torch", sparse_input=True).to(DEV)
    x = _spikes((5, 2, 40), 0.05)
    with torch.no_grad():
        m(x)
    assert m.sparse_report() == {}  # (no backend takes it sparse on the torch path)
    t, _ = _pair("lif")
    with torch.no_grad():
        t(x)
    back = pickle.loads(pickle.dumps(t))
    assert back.sparse_input is True and not any(k.startswith("_sparse_") and k != "_sparse_input"
                                                 for k in back.__dict__)


def test_bad_sparse_input_is_a_located_error(monkeypatch):
    with pytest.raises(FlexDSLError, match="sparse_input='yes'"):
        flexdsl.feedforward("lif", 4, 3, sparse_input="yes")
    with pytest.raises(FlexDSLError, match="plasticity rule"):
        flexdsl.feedforward("lif", 4, 3, rule="stdp_additive", sparse_input=True)
    with pytest.raises(FlexDSLError, match="no dense or masked synapse"):
        flexdsl.feedforward("lif", 4, 4, connectivity="one_to_one", sparse_input=True)
    with pytest.raises(FlexDSLError, match="feed-forward layers only"):
        flexdsl.load("rlif.layer", hidden=5, in_features=4, sparse_input=True)
    m = flexdsl.feedforward("lif", 4, 3, backend="triton", sparse_input=True).to(DEV)
    monkeypatch.setenv("FLEXDSL_SPARSE_DENSITY", "2")
    with pytest.raises(FlexDSLError, match="FLEXDSL_SPARSE_DENSITY"):
        m(torch.zeros(2, 1, 4, device=DEV))


@pytest.mark.parametrize("grad", [False, True])
def test_a_wrong_guess_changes_no_result(grad):
    # each call queues the path the last one took before its count is back; the count decides:
    # sparse and dense inputs in turn give the dense float64 layer's results whatever came before
    m, ref = _pair("lif")
    xs = [_spikes((5, 2, 40), r, seed=i) for i, r in enumerate((0.02, 0.3, 0.3, 0.02, 0.02, 0.3))]
    want = ["sparse", "dense", "dense", "sparse", "sparse", "dense"]
    for k, (x, path) in enumerate(zip(xs, want)):
        with torch.set_grad_enabled(grad):
            y = m(x)
        with torch.no_grad():
            y64 = ref(x.double())
        assert m.sparse_report()["W"][0] == path + ("" if grad else " fused")
        assert torch.equal(y.detach().double(), y64)
        bound = _bound(m, x, 5 * (k + 1))  # (the state carries over every call so far)
        assert (m.neuron.v.detach().double() - ref.neuron.v).abs().max().item() <= bound


@pytest.mark.parametrize("sparse", [True, "always"])
@pytest.mark.parametrize("grad", [False, True])
def test_a_weight_written_through_data_is_seen_by_the_next_call(grad, sparse):
    # `m.W.data.clamp_(...)` or `p.data -= lr * p.grad` changes no version: W^T kept between calls
    # (keyed on it) gave the old weights' results; the dense float64 layer with the written weights
    m, ref = _pair("lif", sparse=sparse)
    x = _spikes((5, 2, 40), 0.03)
    with torch.set_grad_enabled(grad):
        m(x)  # (a first call with the first weights)
    for p, q in zip(m.parameters(), ref.parameters()):
        p.data.clamp_(-0.5, 0.5)
        q.data.clamp_(-0.5, 0.5)
    m.reset()
    ref.reset()
    with torch.set_grad_enabled(grad):
        y = m(x)
    with torch.no_grad():
        y64 = ref(x.double())
    assert m.sparse_report()["W"][0].startswith("sparse")
    assert torch.equal(y.detach().double(), y64)
    assert (m.neuron.v.detach().double() - ref.neuron.v).abs().max().item() <= _bound(m, x, 5)
