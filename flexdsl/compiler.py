"""The pipeline: parse -> check -> lower -> (derive) -> emit, cached per model text.

`compile_model()` returns a `Compiled`: the artefacts of one model (checked model, the
discretized step, generated sources) plus the executable generated torch functions. The
backward and the Triton source are derived lazily, on first use.
"""

from __future__ import annotations

import linecache
import threading
from collections import OrderedDict
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import diskcache
from .check import CheckedModel, check
from .errors import FlexDSLError
from .library import resolve
from .parse import parse

if TYPE_CHECKING:
    from .derive import BackwardModel
    from .lower import StepModel


class Compiled:
    """The compiled artefacts of one model (see LANGUAGE.md §7).

    Parsing and checking happen at construction; the sympy stages (lowering, the backward)
    run on first use. The generated torch source is also kept in a disk cache, so a later
    process loads a model it has seen without importing sympy at all.
    """

    def __init__(self, text: str, filename: str, detach_reset: bool) -> None:
        self.text = text
        self.filename = filename
        self.detach_reset = detach_reset
        self.checked: CheckedModel = check(parse(text, filename))

    @cached_property
    def step(self) -> StepModel:
        """The discretized step (sympy SSA assignments)."""
        from .lower import lower

        return lower(self.checked, self.detach_reset)

    @cached_property
    def torch_source(self) -> str:
        """The generated PyTorch source of `core` (from the disk cache when present)."""
        name = f"{_ident(self.name)}_{diskcache.key(self.text, self.filename, str(self.detach_reset))}.py"
        src = diskcache.read("torch", name)
        if src is None:
            from .emit_torch import emit_torch

            src = emit_torch(self.step)
            diskcache.write("torch", name, src)
        return src

    @cached_property
    def torch_module(self) -> ModuleType:
        """The generated torch source, executed (imports torch on first use)."""
        return _load_generated(self.torch_source, f"core_{self.checked.name}")

    @property
    def name(self) -> str:
        return self.checked.name

    @property
    def method(self) -> str | None:
        return self.step.method

    @property
    def step_equations(self) -> list[Any]:
        """The discretized step: SSA assignments, in order."""
        return self.step.equations()

    @cached_property
    def backward(self) -> BackwardModel:
        from .derive import derive

        return derive(self.step)

    @property
    def backward_equations(self) -> list[Any]:
        """The derived vector-Jacobian product of one step: SSA assignments, in order."""
        return self.backward.equations()

    @cached_property
    def torch_backward_source(self) -> str:
        from .emit_torch import emit_torch_backward

        return emit_torch_backward(self.step, self.backward)

    @cached_property
    def torch_backward(self):
        mod = _load_generated(self.torch_source + self.torch_backward_source, f"core_backward_{self.name}")
        return mod.core_backward

    @cached_property
    def triton_source(self) -> str:
        try:
            from .emit_triton import emit_triton
        except ImportError:
            raise FlexDSLError("the Triton backend is not available in this version of flexdsl") from None
        return emit_triton(self.step, self.backward)

    def __repr__(self) -> str:
        return f"<flexdsl.Compiled {self.name} from {self.filename}>"


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name.lower())


_counter = [0]


def _load_generated(source: str, name: str) -> ModuleType:
    """Execute source that flexdsl generated itself (validated names, printed sympy)."""
    _counter[0] += 1
    fname = f"<flexdsl-generated {name} #{_counter[0]}>"
    linecache.cache[fname] = (len(source), None, source.splitlines(True), fname)
    mod = ModuleType(name)
    mod.__file__ = fname
    exec(compile(source, fname, "exec"), mod.__dict__)  # noqa: S102 - generated code only
    return mod


_CACHE: OrderedDict[tuple[str, str, bool], Compiled] = OrderedDict()
_LOCK = threading.Lock()
_CACHE_SIZE = 256


def compile_model(model: str | Path, detach_reset: bool = False) -> Compiled:
    """Compile a model given as a path, a library stem, or text (cached per text)."""
    text, filename = resolve(model)
    key = (text, filename, bool(detach_reset))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    try:
        c = Compiled(text, filename, bool(detach_reset))
    except RecursionError:
        raise FlexDSLError("an expression is nested too deeply to compile", filename,
                           hint="split long expressions into several `let` statements") from None
    with _LOCK:
        _CACHE[key] = c
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return c
