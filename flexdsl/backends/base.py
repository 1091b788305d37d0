"""The backend interface: what every backend implements, and what the module calls.

A backend turns the compiled model (`IR`: the step, its backward and their schedule) into an
`Artefact` (readable source plus metadata; cached on disk by the runtime), loads an artefact
into a `Program`, and a program runs a multi-step call with explicit states and params:

    art = backend.emit(ir)                       # once per model (then from the disk cache)
    prog = backend.load(art, key)                # once per process
    res = prog.run(inputs, states, params, store_seqs=False)

`inputs` are tensors `[T, *shape]`; `states` and `params` are, in declaration order, tensors
(broadcastable to the step's shape) or Python floats. `run` never reads or writes module
state: `NeuronModule` passes everything and keeps what comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..store.cache import Artefact

if TYPE_CHECKING:
    import torch

    from ..frontend.check import CheckedModel
    from ..ir.derive import BackwardModel
    from ..ir.lower import StepModel
    from ..ir.schedule import Hoisted, Schedule


class IR(Protocol):
    """What a backend's emitter may read (a `Compiled` model; its stages run on first use)."""

    name: str
    filename: str
    text: str
    detach_reset: bool
    checked: CheckedModel
    step: StepModel
    backward: BackwardModel
    hoisted: Hoisted
    schedule: Schedule


@dataclass
class RunResult:
    outputs: list[torch.Tensor]  # [T, *shape] each, in `output` order
    states: list[torch.Tensor]  # final states, [*shape] each
    seqs: list[torch.Tensor] | None = None  # [T, *shape] per state, with store_seqs


class Program(Protocol):
    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool) -> RunResult: ...


class Backend(Protocol):
    name: str

    def available(self) -> bool:
        """Whether it can run in this process (its libraries import)."""
        ...

    def accepts(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Whether `backend="auto"` should use it for these inputs."""
        ...

    def version(self) -> str:
        """The versions of the tools its artefacts depend on (part of the cache key)."""
        ...

    def emit(self, ir: IR) -> Artefact: ...

    def load(self, artefact: Artefact, key: str) -> Program: ...


__all__ = ["Artefact", "Backend", "IR", "Program", "RunResult"]
