"""A layer as text and as a plan: the `.layer` text that `flexdsl.recurrent` and
`flexdsl.feedforward` describe (shown as `m.layer_text`), checked against the loaded neuron and
planned (`frontend/layer.py`, `ir/layer.py`, cached by `store.pipeline.layer_plan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..frontend.layer import CheckedLayer, check_layer
from ..frontend.parse import parse_layer
from ..ir.layer import LayerPlan
from ..store.pipeline import layer_plan
from .module import NeuronModule


def plan(text: str, filename: str, neuron: NeuronModule, hidden: int | None = None,
         in_features: Mapping[str, int] | None = None) -> tuple[CheckedLayer, LayerPlan]:
    """A layer's text checked against its (loaded) neuron, and its plan."""
    layer = parse_layer(text, filename)
    checked = check_layer(layer, neuron.compiled.checked, hidden, in_features)
    return checked, layer_plan(checked, neuron.compiled)


def recurrent_text(model: str, inputs: Sequence[str], in_features: int | None, hidden: int, connect: str,
                   source: str, port: str, bias: bool) -> str:
    """The layer `flexdsl.recurrent(...)` describes, as a `.layer` file writes it (`m.layer_text`)."""
    x = _free_name("x_in", inputs)
    lines = [f"layer recurrent_{model}:", f"    neuron {model}", f"    size {hidden}"]
    if in_features is not None:
        lines += [f"    input {x} size {in_features}", f"    synapses W_in from {x} to {port}" + (":" if bias else "")]
        lines += ["        bias bias"] if bias else []
    lines += [f"    synapses W_rec from {source} to {port}" + (":" if connect != "dense" else "")]
    lines += [f"        connect {connect}"] if connect != "dense" else []
    return "\n".join(lines) + "\n"


def feedforward_text(model: str, inputs: Sequence[str], in_features: int, hidden: int, connect: str, port: str,
                     bias: bool) -> str:
    """The layer `flexdsl.feedforward(...)` describes, as a `.layer` file writes it."""
    x = _free_name("x_in", inputs)
    lines = [f"layer feedforward_{model}:", f"    neuron {model}", f"    size {hidden}",
             f"    input {x} size {in_features}", f"    synapses W from {x} to {port}:"]
    lines += [f"        connect {connect}"] + (["        bias bias"] if bias else [])
    return "\n".join(lines) + "\n"


def _free_name(name: str, taken: Sequence[str]) -> str:
    while name in taken:
        name = name + "_"
    return name


__all__ = ["feedforward_text", "plan", "recurrent_text"]
