"""The backends and their registry. Takes the pipeline's IR (`store.pipeline.IR`); gives each
target's `Artefact` (readable source and metadata, `emit`) and the `Program` that runs it
(`load`), through the interface of `base.py`; `printer.py` and `naming.py` are shared by the
code printers.

    backends.register("numpy", NumpyBackend())     # a new backend: one module + this line
    backends.get("torch")                          # the backend object
    backends.choose("auto", inputs)                # what `backend="auto"` picks for these inputs

Built-in backends are imported on first use, so `flexdsl check` never imports triton.
`backend="auto"` tries the backends registered with `auto=True`, most preferred first, and
takes the first that is available and accepts the inputs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .base import Backend


def _torch() -> Backend:
    from .torch import TorchBackend

    return TorchBackend()


def _cpu() -> Backend:
    from .cpu import CpuBackend

    return CpuBackend()


def _triton() -> Backend:
    from .triton import TritonBackend

    return TritonBackend()


_FACTORIES: dict[str, Callable[[], Backend]] = {"triton": _triton, "cpu": _cpu, "torch": _torch}
REFERENCE = "torch"  # the backend every other is tested against, and whose code `flexdsl show` prints by default
_AUTO: list[str] = ["triton", "cpu", "torch"]  # preference order for backend="auto"
_LOADED: dict[str, Backend] = {}
_LOCK = threading.Lock()


def register(name: str, backend: Backend | Callable[[], Backend], *, auto: bool = False) -> None:
    """Add a backend (an object, or a factory called on first use). With `auto=True`,
    `backend="auto"` considers it before the built-in ones."""
    with _LOCK:
        _LOADED.pop(name, None)
        if callable(backend) and not hasattr(backend, "emit"):
            _FACTORIES[name] = backend
        else:
            _FACTORIES[name] = lambda b=backend: b
        if auto and name not in _AUTO:
            _AUTO.insert(0, name)


def names() -> list[str]:
    """The registered backend names (`"auto"` is not one of them)."""
    return list(_FACTORIES)


def auto_names() -> list[str]:
    """The backends `backend="auto"` considers, most preferred first."""
    return list(_AUTO)


def get(name: str) -> Backend:
    b = _LOADED.get(name)
    if b is None:
        with _LOCK:
            b = _LOADED.get(name)
            if b is None:
                b = _FACTORIES[name]()
                _LOADED[name] = b
    return b


def choose(name: str, inputs: Sequence[Any]) -> Backend:
    """The backend that runs these inputs: `name`, or for "auto" the first preferred backend
    that is available and accepts them (torch accepts everything)."""
    if name != "auto":
        return get(name)
    for n in _AUTO:
        b = get(n)
        if b.accepts(inputs) and b.available():
            return b
    return get("torch")


__all__ = ["register", "names", "auto_names", "get", "choose", "Backend"]
