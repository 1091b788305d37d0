"""The public functions: load, loads, recurrent, compile, library."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .library import library
from .runtime.compiler import Compiled, compile_model

if TYPE_CHECKING:
    from .runtime.module import NeuronModule
    from .runtime.recurrent import RecurrentModule


def compile(model: str | Path, detach_reset: bool = False) -> Compiled:  # noqa: A001 - the API name
    """The compiled artefacts of a model (a path, a library stem, or model text); every error
    of the model, the lowering's included, is raised here."""
    c = compile_model(model, detach_reset)
    c.step  # noqa: B018 - lower now, so that errors surface at compile time
    return c


def load(
    model: str | Path,
    *,
    step_mode: str = "m",
    backend: str = "auto",
    detach_reset: bool = False,
    store_state_seqs: bool = False,
    param_shapes: Mapping[str, Sequence[int]] | None = None,
    check_finite: bool = False,
    **params: Any,
) -> NeuronModule:
    """A trainable torch.nn.Module from a `.neuron` path or a library stem; keyword
    arguments other than the options override params (checked against `where`).
    `check_finite=True` (also `m.check_finite = True` later) raises a located error at the first
    NaN or inf of a call, naming the state, the step and the element."""
    from .runtime.module import NeuronModule

    c = compile_model(model, detach_reset)
    return NeuronModule(c, params, step_mode, backend, store_state_seqs, param_shapes, check_finite)


def loads(text: str, **kwargs: Any) -> NeuronModule:
    """Like `load`, from model text."""
    if "\n" not in text:
        text = text + "\n"
    return load(text, **kwargs)


def recurrent(
    model: str | Path | NeuronModule,
    in_features: int | None,
    hidden: int,
    *,
    connectivity: str = "all",
    mask: Any = None,
    source: str | None = None,
    port: str | None = None,
    bias: bool = True,
    step_mode: str = "m",
    backend: str = "auto",
    detach_reset: bool = False,
    param_shapes: Mapping[str, Sequence[int]] | None = None,
    **params: Any,
) -> RecurrentModule:
    """A recurrent layer of `hidden` neurons of `model` (a path, a library stem, or a loaded
    module): at every step the model's input `port` (default: its first input) receives
    `W_in x[t] + W_rec s[t-1] + bias`, `s` being the output `source` (default: `spike`).
    `connectivity="all"` (W_rec [hidden, hidden], times `mask` if given) or `"one_to_one"`
    (W_rec [hidden]); `in_features=None` adds the input (of size hidden) without W_in. Keyword
    arguments other than the options override the model's params. The time loop is compiled:
    the Triton kernels on CUDA, the torch backend elsewhere."""
    from .runtime.recurrent import recurrent as make

    return make(model, in_features, hidden, connectivity=connectivity, mask=mask, source=source, port=port,
                bias=bias, step_mode=step_mode, backend=backend, detach_reset=detach_reset,
                param_shapes=param_shapes, **params)


__all__ = ["compile", "load", "loads", "recurrent", "library"]
