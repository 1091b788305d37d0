"""sympy, imported by one thread at a time.

sympy's modules import each other in cycles: two threads importing them at once see
half-initialized modules (ImportError "partially initialized module", AttributeError, even a
RecursionError) and can leave sympy so for the rest of the process. Every flexdsl code path
that reaches sympy goes through `load()` first (the stages of the pipeline, unit definitions,
the emitters, the docs, NIR): the first import runs in one thread while the others wait, and
later calls cost a dict lookup. flexdsl's own modules that import sympy at their top are
imported only after it.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

_LOCK = threading.Lock()
_LOADED: dict[str, ModuleType] = {}


def load(name: str = "sympy") -> ModuleType:
    """The module `name` of sympy (the package itself by default), imported whole under one
    process-wide lock the first time."""
    mod = _LOADED.get(name)
    if mod is None:
        with _LOCK:
            mod = _LOADED.get(name)
            if mod is None:
                importlib.import_module("sympy")
                mod = importlib.import_module(name)
                _LOADED[name] = mod
    return mod


__all__ = ["load"]
