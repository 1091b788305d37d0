"""The pipeline: parse -> check -> lower -> derive -> schedule, one model at a time.

`IR(text, filename, detach_reset, options)` parses, applies the load-time options
(`frontend/options.py`: a surrogate, the learnable params) and checks at construction (sympy-free:
the definitions of the units a model writes come from the disk cache once sympy has given them);
each later stage runs on first use and is kept. It is the object a backend's `emit` receives:

    ir.checked     the checked model (frontend)               ir.step       the discretized step (ir.lower)
    ir.backward    its derived VJP (ir.derive)                ir.hoisted    the step's param-only part (ir.schedule.hoist)
    ir.schedule    hoisting and the save/recompute plan       ir.host       the host program (ir.host): derived
                   shared by the kernel backends                            params and checked param-only values

`ir.host` is kept in the disk cache (JSON), so that a process that loads a model seen before
evaluates its derived params without sympy. `cache_key(*parts)` is the cache key of something
made from this model (a backend's artefact: its name and tool versions as parts); it keys the
options too, since they change the compiled model.
"""

from __future__ import annotations

import json
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from .._sympy import load as sympy_ready
from ..errors import FlexDSLError
from ..frontend.check import CheckedModel, check
from ..frontend.layer import CheckedLayer
from ..frontend.options import NONE, LoadOptions, apply, relocate
from ..frontend.parse import parse
from ..ir.host import HostProgram
from ..ir.layer import LayerPlan, plan_layer
from . import cache

if TYPE_CHECKING:
    from ..ir.derive import BackwardModel
    from ..ir.lower import StepModel
    from ..ir.schedule import Hoisted, Schedule


@lru_cache(maxsize=1)
def _sympy_version() -> str:
    from importlib.metadata import version

    return version("sympy")


def unit_definition(name: str, make) -> list:
    """A unit's definition (from sympy.physics.units), kept in the disk cache: the store the
    pipeline gives the checker (`frontend.dims.unit`), and the runtime to values with units."""
    k = cache.key("unit", name, _sympy_version())
    return cache.get_or_make(k, lambda: cache.Artefact("unit", "", {"definition": make()})).meta["definition"]


def _check_detached(ck: CheckedModel, names: tuple[str, ...]) -> None:
    """`detach_reset` given as state names: each a state the `on spike:` block resets."""
    from ..errors import did_you_mean

    reset = [st.target for st in ck.on_spike]
    for n in names:
        if n not in reset:
            what = "a state of" if n in {s.name for s in ck.states} else "not a state of"
            raise FlexDSLError(f"detach_reset names `{n}`, which is {what} {ck.name} reset at a spike",
                               ck.filename, ck.ast.pos.line, ck.ast.pos.column, ck.ast.source,
                               did_you_mean(n, reset) or (f"the states reset at a spike: {', '.join(reset)}" if reset
                                                          else "this model has no `on spike:` block"))


class IR:
    """One model through the compiler: its text and each stage, computed on first use (see the
    module docstring)."""

    def __init__(self, text: str, filename: str, detach_reset: bool, options: LoadOptions = NONE) -> None:
        self.text = text
        self.filename = filename
        self.detach_reset = detach_reset
        self.options = options
        neuron = parse(text, filename)
        try:
            self.checked: CheckedModel = check(apply(neuron, options), unit_definition)
        except FlexDSLError as e:
            raise relocate(e, options) from None
        self.checked.options = options
        if isinstance(detach_reset, tuple):
            _check_detached(self.checked, detach_reset)

    @property
    def name(self) -> str:
        return self.checked.name

    def cache_key(self, *parts: str) -> str:
        """The cache key of something made from this model (e.g. a backend's name and version)."""
        return cache.key(*parts, self.text, self.filename, str(self.detach_reset), self.options.key())

    @cached_property
    def step(self) -> StepModel:
        """The discretized step (sympy SSA assignments)."""
        sympy_ready()
        from ..ir.lower import lower

        try:
            return lower(self.checked, self.detach_reset)
        except FlexDSLError as e:
            raise relocate(e, self.options) from None

    @cached_property
    def backward(self) -> BackwardModel:
        """The derived vector-Jacobian product of one step."""
        sympy_ready()
        from ..ir.derive import derive

        return derive(self.step)

    @cached_property
    def hoisted(self) -> Hoisted:
        """The step split into param-only values and the per-step body (no backward needed)."""
        sympy_ready()
        from ..ir.schedule import hoist

        return hoist(self.step)

    @cached_property
    def schedule(self) -> Schedule:
        """Hoisting and the save/recompute plan, shared by the backends."""
        sympy_ready()
        from ..ir.schedule import make_schedule

        return make_schedule(self.step, self.backward, self.hoisted)

    @cached_property
    def host(self) -> HostProgram:
        """What the host computes from the params before a call (derived params, checked
        param-only values), from the disk cache when a process has seen the model before."""

        def make() -> cache.Artefact:
            sympy_ready()
            from ..ir.host import host_program

            return cache.Artefact("host", "", host_program(self.step, self.hoisted).to_dict())

        return HostProgram.from_dict(cache.get_or_make(self.cache_key("host"), make).meta)

    def __repr__(self) -> str:
        return f"<flexdsl IR {self.name} from {self.filename!r}>"


def layer_plan(layer: CheckedLayer, neuron: IR) -> LayerPlan:
    """A layer's plan (`ir/layer.py`), from the disk cache when a process has seen the layer
    (keyed by the layer's structure and its neuron's compiled model)."""
    shape = {"name": layer.name, "size": layer.size, "inputs": [[n, k] for n, k, _ in layer.inputs],
             "direct": list(layer.direct),
             "synapses": [[s.name, s.pre, s.port_index, s.recurrent, s.pre_index, s.pre_size, s.connect, s.bias,
                           s.delay_kind, s.delay, s.delay_interp] for s in layer.synapses]}

    def make() -> cache.Artefact:
        sympy_ready()
        return cache.Artefact("layer", "", plan_layer(layer).to_dict())

    k = neuron.cache_key("layer", json.dumps(shape, sort_keys=True))
    return LayerPlan.from_dict(cache.get_or_make(k, make).meta)


__all__ = ["IR", "layer_plan", "unit_definition"]
