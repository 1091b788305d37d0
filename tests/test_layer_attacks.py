"""Layer and rule files as an attacker writes them: every refusal a located `FlexDSLError` (never a
bare OverflowError, KeyError or allocator error), `flexdsl check` refusing what the load refuses."""

from __future__ import annotations

import pytest
import torch

import flexdsl
from flexdsl import FlexDSLError
from flexdsl.runtime.layertext import module_names

LAYER = "layer L:\n    neuron lif\n    size {size}\n    input s size {inp}\n    synapses {name} from s to x\n"


@pytest.mark.parametrize("size, inp", [("1e309", "3"), ("9" * 5000, "3"), ("4", "1e400")])
def test_sizes_beyond_any_float_are_located_errors(size, inp):
    with pytest.raises(FlexDSLError, match="positive whole number") as e:
        flexdsl.loads(LAYER.format(size=size, inp=inp, name="W"))
    assert e.value.line in (3, 4)


@pytest.mark.parametrize("name", ["forward", "training", "parameters", "plan", "to", "reset", "plastic", "_W",
                                  "class", "state_dict"])
def test_a_weight_named_like_the_modules_own_attribute_is_refused(name):
    """(`synapses forward ...` replaced the module's call: a bare KeyError at load, `check` said ok)"""
    with pytest.raises(FlexDSLError) as e:
        flexdsl.loads(LAYER.format(size=4, inp=3, name=name))
    assert e.value.line == 5


def test_a_weight_named_like_another_groups_delays_is_refused():
    text = ("layer L:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W from s to x:\n"
            "        delay axonal max 3\n    synapses W_delay from s to x\n")
    with pytest.raises(FlexDSLError, match="delays or mask") as e:
        flexdsl.loads(text)
    assert e.value.line == 7


def test_the_reserved_names_cover_the_modules_attributes():
    """The names a layer file's weight may not take: every public attribute a layer module has (its
    class's and those its __init__ sets), but its own weights'."""
    from flexdsl.frontend.layer import _RESERVED

    for m in (flexdsl.feedforward("lif", 3, 2), flexdsl.recurrent("lif", 3, 2),
              flexdsl.load("rlif.layer", hidden=3, in_features=2),
              flexdsl.feedforward("lif", 3, 2, rule="stdp_additive"), flexdsl.feedforward("lif", 3, 2, sparse_input=True),
              flexdsl.recurrent("lif", 3, 2, learning="eprop", readout=2)):
        names = {n for n in dir(m) if not n.startswith("_")} | {n for n in vars(m) if not n.startswith("_")}
        synapses = {s.name for s in m._layer.synapses} | {s.bias for s in m._layer.synapses if s.bias}
        assert names - module_names() - set(_RESERVED) - synapses == set()


def test_a_bound_that_reads_the_weight_twice_is_a_located_error():
    for bounds in ("w <= w", "0 <= w <= w"):
        text = f"rule R:\n    weight w where {bounds}\n    on pre:\n        w += 1\n"
        with pytest.raises(FlexDSLError, match="numbers and params only") as e:
            flexdsl.load_rule(text)
        assert e.value.line == 2


def test_a_layers_weights_together_have_one_limit_and_allocation_failures_are_located(monkeypatch):
    text = ("layer L:\n    neuron lif\n    size 65536\n    input s size 65535\n    input t size 65535\n"
            "    synapses W from s to x\n    synapses V from t to x\n")
    with pytest.raises(FlexDSLError, match="together"):
        flexdsl.loads(text)

    def fail(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 64000000000 bytes")

    monkeypatch.setattr(torch, "empty", fail)
    for t in (LAYER.format(size=40, inp=30, name="W"), LAYER.format(size=40, inp=30, name="W")
              + "    synapses W_rec from spike to x\n"):
        with pytest.raises(FlexDSLError, match="could not be allocated"):
            flexdsl.loads(t)


def test_check_resolves_a_layers_rule(tmp_path):
    from flexdsl.cli import main

    bad = tmp_path / "norule.layer"
    bad.write_text("layer L:\n    neuron lif\n    size 4\n    input s size 3\n    synapses W from s to x:\n"
                   "        rule nosuchrule\n")
    good = tmp_path / "rule.layer"
    good.write_text(bad.read_text().replace("nosuchrule", "stdp_additive online"))
    assert main(["check", str(bad)]) == 1
    assert main(["check", str(good)]) == 0


@pytest.mark.parametrize("text, words", [("", "neuron NAME:"), ("# only a comment\n", "neuron NAME:"),
                                         ("neuron N:\n    input x\n    state v\u0430 = 0\n", "U+0430")])
def test_empty_files_and_look_alike_letters_get_a_hint(text, words):
    with pytest.raises(FlexDSLError) as e:
        flexdsl.loads(text)
    assert e.value.hint and words in e.value.hint


@pytest.mark.parametrize("name", ["sparse_input", "plastic", "modulators"])
def test_a_feedforward_option_set_on_a_recurrent_layer_is_refused(name):
    """`r.sparse_input = True` on a recurrent layer was kept as a plain attribute and ignored (the scan
    never reads it): a silent no-op a user would take for a change. A located error, the module unchanged."""
    r = flexdsl.recurrent("lif", 3, 4)
    with pytest.raises(FlexDSLError, match=name):
        setattr(r, name, True)
    assert name not in r.__dict__
    ff = flexdsl.feedforward("lif", 3, 4)
    ff.sparse_input = True  # (the feed-forward layer has it)
    assert ff.sparse_input is True


@pytest.mark.parametrize("model", ["rlif.layer", "ff_lif.layer"])
@pytest.mark.parametrize("kw", [dict(hidden="4"), dict(hidden=4.0), dict(hidden=torch.tensor(4)), dict(hidden=-3),
                                dict(hidden=True), dict(in_features={"spikes": 3.0}), dict(in_features={"spikes": "3"})])
def test_sizes_given_at_load_are_positive_ints_or_a_located_error(model, kw):
    """Sizes given at load (not written in the file) were not checked: bare TypeErrors, a JSON error,
    or "need -9 values ... could not be allocated" for a negative size."""
    kw = {"hidden": 4, "in_features": 3, **kw}
    with pytest.raises(FlexDSLError) as e:
        flexdsl.load(model, **kw)
    assert "positive int" in str(e.value) and e.value.filename.endswith(model) and e.value.line >= 1


def test_an_input_named_like_the_neurons_output_is_refused():
    """`input spike` and `synapses W_rec from spike to x` read the input, not the fed-back spikes:
    the layer looked recurrent and was built feed-forward, silently."""
    text = ("layer Shadow:\n    neuron lif\n    size 4\n    input spike size 4\n"
            "    synapses W_in from spike to x\n    synapses W_rec from spike to x\n")
    with pytest.raises(FlexDSLError, match="output `spike`") as e:
        flexdsl.loads(text)
    assert e.value.line == 4 and e.value.hint


def test_check_takes_the_size_of_a_one_to_one_input_where_the_layer_leaves_it_out(tmp_path):
    """A layer without `size` and a one_to_one synapse from an input of written size 5 loads with
    hidden=5; `flexdsl check` refused it (it took the size as 1)."""
    from flexdsl.runtime.layer import describe

    p = tmp_path / "o2o.layer"
    p.write_text("layer L:\n    neuron lif\n    input s size 5\n    synapses W from s to x:\n        connect one_to_one\n")
    checked, _ = describe(p)
    assert checked.size == 5
    assert flexdsl.load(p, hidden=5)(torch.rand(3, 1, 5)).shape == (3, 1, 5)


@pytest.mark.parametrize("line", ['neuron "{p}"', 'neuron lif\n    input s size 4\n    synapses W from s to x:\n'
                                                  '        rule "{p}"'])
def test_a_layers_text_names_only_model_and_rule_files(line, tmp_path):
    """`neuron "/any/file"` read any file and the parse error showed its first line: text given to
    flexdsl.loads could read out a file. A layer names `.neuron` and `.rule` files only."""
    secret = tmp_path / "secret.txt"
    secret.write_text("API_TOKEN=not-a-real-secret\n")
    text = "layer L:\n    " + line.format(p=secret) + "\n    size 3\n"
    if "input s" not in text:
        text += "    input s size 4\n    synapses W from s to x\n"
    with pytest.raises(FlexDSLError, match="not a `.(neuron|rule)` file") as e:
        flexdsl.loads(text)
    assert "API_TOKEN" not in str(e.value)
