"""A layer as text and as a plan: the `.layer` text that `flexdsl.recurrent` and
`flexdsl.feedforward` describe (shown as `m.layer_text`), checked against the loaded neuron and
planned (`frontend/layer.py`, `ir/layer.py`, cached by `store.pipeline.layer_plan`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

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
    checked = check_layer(layer, neuron.compiled.checked, hidden, in_features, reserved=module_names())
    return checked, layer_plan(checked, neuron.compiled)


# the layer modules' own public names (their classes' and what their __init__ sets; SpikingJelly's
# MemoryModule's, a base of the recurrent layer where it is installed): tests/test_layer_attacks.py keeps
# this equal to the modules
_LAYER_NAMES = (
    "training", "size", "neuron", "step_mode", "in_features", "hidden", "connectivity", "port", "source", "backend",
    "plastic", "sparse_input", "mask", "feedback", "readout", "rules", "as_sequential", "current", "detach",
    "layer_text", "plan", "reset", "reset_parameters", "plastic_change", "last_dw", "modulators", "learning",
    "set_delay_width", "round_delays", "sparse_report",
    "functional_forward", "get_reset_value", "materialize_states", "memories", "multi_step_forward",
    "multi_step_functional_forward", "named_memories", "register_memory", "set_reset_value", "single_step_forward",
    "single_step_functional_forward", "supported_step_mode")


@functools.lru_cache(maxsize=1)
def module_names() -> frozenset[str]:
    """The names a layer module has (torch's nn.Module's and the layer modules' own): no weight or bias
    of a layer file may take one (`synapses forward ...` would replace the module's call)."""
    import torch

    return frozenset({n for n in dir(torch.nn.Module) if not n.startswith("_")} | set(_LAYER_NAMES))


def allocate(layer: CheckedLayer, shape: Sequence[int], what: str, pos: Any = None) -> Any:
    """Uninitialized weights of `shape` for a layer module: a located error (at `pos`) where the
    memory is not there, not the allocator's."""
    import math

    import torch

    try:
        return torch.empty(tuple(shape))
    except RuntimeError as e:  # (the allocator's "can't allocate memory")
        gib = math.prod(shape) * torch.get_default_dtype().itemsize / 2**30
        raise layer.error(f"{what} need {math.prod(shape):,} values ({gib:.1f} GiB), which could not be allocated: "
                          f"{str(e).splitlines()[0][:120]}", pos, "a smaller layer") from None


def model_ref(neuron: NeuronModule) -> str:
    """How a generated layer text (`m.layer_text`) names its neuron so that the text loads again: a
    library model by its name (`lif`), a file by its path (quoted); a neuron given as text by its name
    (that text is not a file a layer can name: load the layer with the neuron's module)."""
    from pathlib import Path

    from .._paths import NEURONS_DIR

    c = neuron.compiled
    path = Path(c.filename)
    if not c.filename.startswith("<") and path.is_file():
        if path.resolve().parent == NEURONS_DIR.resolve():
            return path.stem
        return f'"{path.resolve()}"' if '"' not in str(path.resolve()) else c.name
    return c.name if c.name.isidentifier() else "model"


def _layer_name(kind: str, model: str) -> str:
    """`recurrent_lif`, `feedforward_song_lif` ...: a layer name from the neuron's reference."""
    import re
    from pathlib import Path

    stem = re.sub(r"\W", "_", Path(model.strip('"')).stem) if model.startswith('"') else model
    return f"{kind}_{stem}"


def recurrent_text(model: str, inputs: Sequence[str], in_features: int | None, hidden: int, connect: str,
                   source: str, port: str, bias: bool) -> str:
    """The layer `flexdsl.recurrent(...)` describes, as a `.layer` file writes it (`m.layer_text`)."""
    x = _free_name("x_in", inputs)
    lines = [f"layer {_layer_name('recurrent', model)}:", f"    neuron {model}", f"    size {hidden}"]
    if in_features is not None:
        lines += [f"    input {x} size {in_features}", f"    synapses W_in from {x} to {port}" + (":" if bias else "")]
        lines += ["        bias bias"] if bias else []
    lines += [f"    synapses W_rec from {source} to {port}" + (":" if connect != "dense" else "")]
    lines += [f"        connect {connect}"] if connect != "dense" else []
    return "\n".join(lines) + "\n"


def feedforward_text(model: str, inputs: Sequence[str], in_features: int, hidden: int, connect: str, port: str,
                     bias: bool, delay: str | None = None, rule: str | None = None) -> str:
    """The layer `flexdsl.feedforward(...)` describes, as a `.layer` file writes it (`delay`: the
    synapses' `delay` line after the keyword, e.g. "3" or "synaptic max 20 learnable")."""
    x = _free_name("x_in", inputs)
    lines = [f"layer {_layer_name('feedforward', model)}:", f"    neuron {model}", f"    size {hidden}",
             f"    input {x} size {in_features}", f"    synapses W from {x} to {port}:"]
    lines += [f"        connect {connect}"] + (["        bias bias"] if bias else [])
    lines += [f"        delay {delay}"] if delay is not None else []
    lines += [f"        rule {rule}"] if rule is not None else []
    return "\n".join(lines) + "\n"


def rule_words(rule: Any, plasticity: Any, error, rule_params_given: bool = False) -> str | None:
    """The `rule` line of `flexdsl.feedforward(rule=, plasticity=)`: a library rule's name bare, a
    path quoted, then the semantics."""
    import os
    import re
    from pathlib import Path

    if rule is None:
        if plasticity != "window" or rule_params_given:  # (the default; anything else belongs to a rule)
            raise error(f"plasticity={plasticity!r}{' and rule_params=' if rule_params_given else ''} given without "
                        "rule=: they set a plasticity rule's semantics and params",
                        "pass rule='stdp_additive' (a library rule's name, or a .rule file's path)")
        return None
    if isinstance(rule, os.PathLike):
        rule = os.fspath(rule)
    if not isinstance(rule, str) or not rule or '"' in rule or "\n" in rule:
        raise error(f"rule={rule!r}: give a library rule's name or a `.rule` file's path", None)
    if not isinstance(plasticity, str):
        raise error(f"plasticity={plasticity!r}: 'window' or 'online'", None)
    ref = rule if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule) else f'"{Path(rule).resolve()}"'
    return f"{ref} {plasticity}"


def delay_words(delay: Any, max_delay: Any, learnable: Any) -> str | None:
    """The `delay` line of `flexdsl.feedforward(delay=, max_delay=, learnable_delays=)`: an int is
    every connection's steps; a kind ("axonal", "synaptic", "dendritic") takes `max_delay`; learnable
    ones True (gauss) or the relaxation's name. Values of the right form that do not fit (a negative
    delay) are written as given: the layer's checks locate them; text that is no word or number (a
    newline would add lines to the layer), a kind misspelt, `max_delay` with a whole delay: errors."""
    import re

    from ..errors import FlexDSLError, did_you_mean

    def refuse(what: str, v: Any, hint: str) -> FlexDSLError:
        return FlexDSLError(f"{what}={v!r}: {hint}", "<flexdsl.feedforward>",
                            hint="delay=3 (steps), delay='2 ms', delay='axonal' with max_delay=20")

    kinds = ("axonal", "synaptic", "dendritic")
    for what, v in (("delay", delay), ("max_delay", max_delay), ("learnable_delays", learnable)):
        if isinstance(v, str) and not re.fullmatch(r"[A-Za-z0-9_.+\- ]+", v):
            raise refuse(what, v, "give a number of steps, a time, or a word")
    if isinstance(delay, str) and delay.strip().isalpha() and delay.strip() not in (*kinds, "uniform"):
        raise refuse("delay", delay, f"no delay kind `{delay}`; " + (f"did you mean `{delay.strip().lower()}`?"
                     if delay.strip().lower() in kinds else did_you_mean(delay.strip(), kinds) or
                     f"the kinds: {', '.join(kinds)}"))
    if isinstance(delay, int | float) and not isinstance(delay, bool) and max_delay is not None:
        raise refuse("max_delay", max_delay, f"a maximum is for delays per connection or neuron (a kind), and "
                     f"delay={delay!r} is every connection's")
    if delay is None:  # (max_delay or learnable_delays alone: synaptic delays; learnable ones need their max)
        if max_delay is not None or learnable:
            return "synaptic" + (f" max {max_delay}" if max_delay is not None else "") + (
                f" learnable {learnable if isinstance(learnable, str) else 'gauss'}" if learnable else "")
        return None
    if isinstance(delay, int) and not isinstance(delay, bool):
        return f"{delay}" + (" learnable" if learnable else "")
    words = f"{delay}" + (f" max {max_delay}" if max_delay is not None else "")
    return words + (f" learnable {learnable if isinstance(learnable, str) else 'gauss'}" if learnable else "")


def _free_name(name: str, taken: Sequence[str]) -> str:
    while name in taken:
        name = name + "_"
    return name


__all__ = ["LayerAttrs", "allocate", "delay_words", "feedforward_text", "module_names", "plan", "recurrent_text"]
