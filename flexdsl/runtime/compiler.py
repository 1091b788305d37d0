"""The runtime's compiled model, cached per model text.

`compile_model()` returns a `Compiled`: the pipeline's `IR` of one model (`store/pipeline.py`:
the text and its stages, computed on first use) and what running it needs: each backend's
artefact, from the disk cache when a process has seen the model before, loaded into a program
once per process; the host-side values of a call (the derived params, evaluated from the IR's
host program by `ir/host.py`); the generated sources for inspection. Notebooks display it
through the display registry (`runtime/display.py`) that `flexdsl.docs` fills.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import FlexDSLError, did_you_mean
from ..frontend.options import NONE, LoadOptions
from ..frontend.parse import normalize
from ..ir.host import check_values, derived_values
from ..library import resolve
from ..store import cache
from ..store.generated import forget, load_module
from ..store.pipeline import IR
from . import display

if TYPE_CHECKING:
    from ..backends.base import Backend, Program


class Compiled(IR):
    """The compiled artefacts of one model.

    Parsing and checking happen at construction; the sympy stages (lowering, the backward,
    the schedule) and each backend's artefact are made on first use.
    """

    def __init__(self, text: str, filename: str, detach_reset: bool, options: LoadOptions = NONE) -> None:
        super().__init__(text, filename, detach_reset, options)
        self._programs: dict[str, Program] = {}
        self._lock = threading.Lock()
        self._derived_cache: dict[bytes, list[float]] = {}

    # ------------------------------------------------------------------ backends
    def key(self, backend: Backend) -> str:
        """The cache key of a backend's artefact of this model."""
        return self.cache_key(backend.name, backend.version())

    def artefact(self, backend: Backend | str) -> cache.Artefact:
        """The backend's generated source and metadata (from the disk cache when present)."""
        b = _backend(backend)
        return cache.get_or_make(self.key(b), lambda: b.emit(self))

    def program(self, backend: Backend | str) -> Program:
        """The backend's artefact, loaded (once per process)."""
        b = _backend(backend)
        p = self._programs.get(b.name)
        if p is None:
            with self._lock:
                p = self._programs.get(b.name)
                if p is None:
                    p = _load_program(b, self.key(b), lambda: self.artefact(b))
                    self._programs[b.name] = p
        return p

    # ------------------------------------------------------------------ derived params
    @cached_property
    def derived_names(self) -> list[str]:
        """The names of the params the step derives from the declared ones (matrix exponentials
        of coupled linear states), which every program takes after the declared params."""
        return list(self.host.derived)

    def with_derived(self, params: Sequence[Any]) -> list[Any]:
        """The declared params' values followed by the derived params' values (computed once per
        call from the host program: floats when every param is a float, else tensors with
        autograd to the declared params, in their floating dtype)."""
        if not self.derived_names:
            return params if isinstance(params, list) else list(params)
        params = list(params)
        import torch

        tensors = [p for p in params if isinstance(p, torch.Tensor)]
        if not tensors and not torch.compiler.is_compiling():  # (a trace keeps tensors, and no cache)
            floats = [float(p) for p in params]
            key = struct.pack(f"{len(floats)}d", *floats)  # (the bits: 0.0 and -0.0 are different keys)
            hit = self._derived_cache.get(key)
            if hit is None:
                with torch.no_grad():
                    vals = derived_values(self.host, floats)
                hit = [float(v) for v in vals]
                if len(self._derived_cache) > 64:
                    self._derived_cache.clear()
                self._derived_cache[key] = hit
            return params + hit
        dtype = tensors[0].dtype if tensors else torch.float64
        for t in tensors[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
        if not dtype.is_floating_point:
            dtype = torch.float64
        device = tensors[0].device if tensors else None
        args = [p if isinstance(p, torch.Tensor) else torch.full((), float(p), dtype=torch.float64, device=device)
                for p in params]  # (filled on the device: a copy from the host waits for its queued work)
        return params + [v.to(dtype).contiguous() for v in derived_values(self.host, args)]

    def check_values(self, params: Sequence[Any]) -> dict[str, Any]:
        """The step's checked param-only values for these declared params (label -> value; see
        `ir.host.HostProgram.checks`): derived params and invariants must be finite, a label
        `statement|denominator i` also nonzero."""
        return check_values(self.host, params)

    # ------------------------------------------------------------------ inspection (docs/language.md, section 8)
    @property
    def method(self) -> str | None:
        return self.step.method

    @property
    def step_equations(self) -> list[Any]:
        """The discretized step: SSA assignments, in order."""
        return self.step.equations()

    @property
    def backward_equations(self) -> list[Any]:
        """The derived vector-Jacobian product of one step: SSA assignments, in order."""
        return self.backward.equations()

    def source(self, backend: str) -> str:
        """The code `backend` generates for this model (`flexdsl show --backend NAME`)."""
        from .. import backends

        if backend not in backends.names():
            raise FlexDSLError(f"no backend named {backend!r}", self.filename,
                               hint=did_you_mean(str(backend), backends.names()) or
                               "backends: " + ", ".join(backends.names()))
        return self.artefact(backend).source

    @property
    def reference_module(self) -> ModuleType:
        """The reference backend's generated module (`core`, `surrogate`: one step as torch code)."""
        from .. import backends

        return self.program(backends.REFERENCE).module  # type: ignore[attr-defined]

    @cached_property
    def backward_source(self) -> str:
        """`core_backward`, the derived VJP of one step, as the reference backend prints it."""
        from .. import backends

        return _backend(backends.REFERENCE).backward_source(self.step, self.backward)  # type: ignore[attr-defined]

    @cached_property
    def core_backward(self):
        """`core_backward(*inputs, *states, *grads, *params)`: the derived VJP as torch code."""
        from .. import backends

        ref = _backend(backends.REFERENCE)
        return load_module(f"{ref.name}backward", self.key(ref), self.source(ref.name) + self.backward_source).core_backward

    def __getattr__(self, name: str) -> Any:
        """`<backend>_source` for any registered backend (`source(name)`), and the reference
        backend's `<name>_module`, `<name>_backward_source`, `<name>_backward` (the names these
        had before the registry said which backend is the reference)."""
        if name.startswith("__") or "_" not in name:
            raise AttributeError(name)
        from .. import backends

        for b in backends.names():
            rest = name[len(b) + 1:] if name.startswith(b + "_") else None
            if rest == "source":
                return self.source(b)
            if b == backends.REFERENCE and rest in _REFERENCE_ALIASES:
                return getattr(self, _REFERENCE_ALIASES[rest])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<flexdsl.Compiled {self.name} from {self.filename!r}>"

    def __reduce__(self):
        # pickled as its text: unpickling (in any process) compiles it again, from the caches
        return compile_text, (self.text, self.filename, self.detach_reset, self.options)

    # ------------------------------------------------------------------ documentation (flexdsl.docs)
    def latex(self, part: str = "equations", environment: str = "align*") -> str:
        """The equations as LaTeX for a paper: "equations" (as written), "step" or "backward"."""
        return display.render("latex-source", self, part, environment)

    def _repr_latex_(self) -> str | None:
        return display.show("latex", self)

    def _repr_html_(self) -> str | None:
        return display.show("html", self)


_REFERENCE_ALIASES = {"module": "reference_module", "backward_source": "backward_source", "backward": "core_backward"}


def _backend(b: Backend | str) -> Backend:
    if isinstance(b, str):
        from .. import backends

        return backends.get(b)
    return b


# Programs are shared by every Compiled of the same key (a model text loaded twice registers
# its custom ops once).
_PROGRAMS: OrderedDict[str, Program] = OrderedDict()
_PROGRAMS_LOCK = threading.Lock()
_PROGRAMS_SIZE = 256  # (the least recently loaded go: a model loaded again gets its program back from the caches)


def _load_program(b: Backend, k: str, artefact) -> Program:
    with _PROGRAMS_LOCK:
        p = _PROGRAMS.get(f"{b.name}:{k}")
        if p is None:
            p = b.load(artefact(), k)
            _PROGRAMS[f"{b.name}:{k}"] = p
            while len(_PROGRAMS) > _PROGRAMS_SIZE:
                old = _PROGRAMS.popitem(last=False)[1]
                mod = getattr(old, "module", None) or getattr(old, "mod", None)
                if isinstance(mod, ModuleType):
                    forget(mod)
        else:
            _PROGRAMS.move_to_end(f"{b.name}:{k}")
        return p


_CACHE: OrderedDict[tuple[str, str, bool, LoadOptions], Compiled] = OrderedDict()
_LOCK = threading.Lock()
_CACHE_SIZE = 256


def compile_model(model: str | Path, detach_reset: bool = False, options: LoadOptions = NONE) -> Compiled:
    """Compile a model given as a path, a library stem, or text (cached per text and options)."""
    text, filename = resolve(model)
    return compile_text(text, filename, detach_reset, options)


def reset_detached(value: Any, filename: str) -> bool | tuple[str, ...]:
    """`detach_reset` as the compiler keys it: a bool, or the sorted names of the states whose reset
    sees the spike detached (`detach_reset="v"`: the membrane's reset only, as e-prop's LIF and ALIF)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple | set | frozenset) and value and all(isinstance(v, str) for v in value):
        return tuple(sorted(set(value)))
    if isinstance(value, bool | int) and not isinstance(value, list | tuple):
        return bool(value)
    raise FlexDSLError(f"detach_reset must be True, False or the name(s) of states, not {value!r}", filename,
                       hint="e.g. detach_reset=True (every reset), or detach_reset='v' (only v's)")


def compile_text(text: str, filename: str = "<string>", detach_reset: bool = False,
                 options: LoadOptions = NONE) -> Compiled:
    """Compile model text; `filename` names it in errors and generated code (cached per text,
    `detach_reset` and the load-time options)."""
    text = normalize(text)  # line breaks as errors count them
    detach_reset = reset_detached(detach_reset, filename)
    key = (text, filename, detach_reset, options)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    try:
        c = Compiled(text, filename, detach_reset, options)
    except RecursionError:
        raise FlexDSLError("an expression is nested too deeply to compile", filename,
                           hint="split long expressions into several `let` statements") from None
    with _LOCK:
        _CACHE[key] = c
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return c
