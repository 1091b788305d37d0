"""A layer as text and as a plan: the `.layer` text that `flexdsl.recurrent` and
`flexdsl.feedforward` describe (shown as `m.layer_text`), checked against the loaded neuron and
planned (`frontend/layer.py`, `ir/layer.py`, cached by `store.pipeline.layer_plan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..frontend.layer import CheckedLayer, check_layer
from ..frontend.parse import parse_layer
from ..ir.layer import LayerPlan
from ..store.pipeline import layer_plan
from .module import STEP_MODES, NeuronModule


class LayerAttrs:
    """What every layer module shows the same way: its plan, and a step mode its neuron follows."""

    @property
    def plan(self) -> LayerPlan:
        """The layer's plan (`ir/layer.py`): its synapses, what runs before, in and after the time
        loop, and the derived equations (`print(*m.plan.equations, sep="\\n")`)."""
        return self.__dict__["_plan"]

    @property
    def step_mode(self) -> str:
        return self.__dict__.get("_step_mode", "m")

    @step_mode.setter
    def step_mode(self, value: str) -> None:
        """'m' ([T, *batch, features] per call) or 's' (one step per call); the neuron follows
        (so that SpikingJelly's set_step_mode and NIR export see one mode)."""
        if value not in STEP_MODES:
            raise self._layer_error(f"step_mode must be 's' or 'm', not {value!r}")  # type: ignore[attr-defined]
        self.__dict__["_step_mode"] = value
        neuron = self._modules.get("neuron")  # type: ignore[attr-defined]
        if neuron is not None:
            neuron.step_mode = value


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


__all__ = ["LayerAttrs", "feedforward_text", "plan", "recurrent_text"]
