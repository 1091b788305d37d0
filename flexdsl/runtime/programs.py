"""Which program runs a call: the backend that `backend="auto"` picks for the inputs' device
and dtype, and that backend's program for the model.

Picking and loading a program is compile-time work: it takes locks, imports a backend's
libraries, reads and writes the disk cache, executes generated code, builds a kernel library
and registers custom ops. None of that can be traced by `torch.compile`'s Dynamo, and none of
it belongs in a graph. So under a trace, `program_for` does it in `_resolve`, which Dynamo
runs once at trace time and whose result it takes as a constant
(`torch.compiler.assume_constant_result`): the trace sees a dict lookup and the program's
`run`, and a first call that is compiled works in a fresh process with empty caches. Before
returning, `_resolve` also gives the program its trace-time preparation (`prepare_trace`, where
a program has one: the custom ops that make its time loop one graph node).

Eagerly, the choice is remembered per model, device type and dtype (a few dict lookups per
call).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .. import backends
from ..backends import recurrent as scans
from ..backends.base import Need, ScanSpec, transformed
from ..errors import FlexDSLError

if TYPE_CHECKING:
    from ..backends.base import Program
    from .compiler import Compiled

class _Resolved:
    """Programs by key as attributes, set by `_resolve` and read by the traced code. Not a dict:
    Dynamo takes a dict it has read in a trace as it was then, so a second model's program,
    resolved later in the same trace, would be missing from it; an attribute is read anew."""


_RESOLVED = _Resolved()
# a name per Compiled (what a trace passes to `_resolve`: Dynamo converts only constants)
_REGISTRY: weakref.WeakValueDictionary[str, Compiled] = weakref.WeakValueDictionary()
# per Compiled: (backend, device type, dtype) -> program (the eager path)
_CHOSEN: weakref.WeakKeyDictionary[Compiled, dict[tuple, Program]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
# the programs whose backend declares no backward (by id: programs live as long as their Compiled):
# a call with gradients on one is refused (`refuse_training`), decided once with the program
UNTRAINED: set[int] = set()


def register(c: Compiled) -> str:
    """The name under which a trace finds `c` (kept by the module that runs it, so that `c`
    lives as long as the name is used)."""
    k = f"{id(c):x}"
    with _LOCK:
        _REGISTRY[k] = c
    return k


def program_for(c: Compiled, name: str, backend: str, x0: torch.Tensor) -> Program:
    """The program that runs a call of `c` (registered as `name`) on inputs like `x0` (its
    device type and dtype)."""
    if torch.compiler.is_compiling():
        return getattr(_RESOLVED, _resolve(name, backend, x0.device.type, x0.dtype))
    if transformed(x0):  # under a torch.func transform: chosen for these inputs, not remembered
        b = backends.choose(backend, [x0])
        program = c.program(b)
        if not backends.capabilities(b).training:
            UNTRAINED.add(id(program))
        return program
    chosen = _CHOSEN.get(c)
    if chosen is not None:
        p = chosen.get((backend, x0.device.type, x0.dtype))
        if p is not None:
            return p
    return _choose(c, backend, x0.device.type, x0.dtype)


def _choose(c: Compiled, backend: str, device_type: str, dtype: torch.dtype, compiling: bool = False) -> Program:
    like = torch.empty(0, dtype=dtype, device=device_type)  # what the backends' `accepts` look at
    need = Need.of(like, noise=c.checked.stochastic, compile=compiling)
    if backend != "auto":
        refuse(c, backend, need)
    b = backends.choose(backend, [like], need)
    program = c.program(b)
    c.derived_names  # noqa: B018 - computed once here, read by every call
    with _LOCK:
        _CHOSEN.setdefault(c, {})[(backend, device_type, dtype)] = program
        if not backends.capabilities(b).training:
            UNTRAINED.add(id(program))
    return program


def refuse(c: Compiled, backend: str, need: Need) -> None:
    """A located error where the backend named `backend` has not declared `need` (the message
    names the backends that have)."""
    why = backends.refusal(backend, need)
    if why is not None:
        raise FlexDSLError(why, c.filename, hint="use backend='auto' (the backend that fits the call), or one of "
                           "those named")


def refuse_training(c: Compiled, backend: str, tensors: Callable[[], Sequence[Any]]) -> None:
    """A located error where a call needs gradients (of any of `tensors()`) from a backend that
    declares no backward."""
    if backend == "auto" or backends.capabilities(backends.get(backend)).training or not torch.is_grad_enabled():
        return
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors()):
        refuse(c, backend, Need(training=True))


def _assume_constant_result(fn):
    """`torch.compiler.assume_constant_result`, without importing Dynamo when flexdsl is
    imported (a second, and sympy): the decorator only marks the function, and Dynamo reads the
    mark when a trace meets a call (tests/test_compile.py checks that it still does)."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result
def _resolve(name: str, backend: str, device_type: str, dtype: torch.dtype) -> str:
    """Run by Dynamo at trace time, outside the graph (its arguments are constants): choose and
    load the program of the Compiled registered as `name`, prepare it for the trace, and return
    its name in `_RESOLVED`."""
    c = _REGISTRY[name]
    program = _choose(c, backend, device_type, dtype, compiling=True)
    prepare = getattr(program, "prepare_trace", None)
    if prepare is not None:
        prepare(c)
    k = f"p{id(program)}"
    with _LOCK:
        setattr(_RESOLVED, k, program)
    return k


def recurrent_for(c: Compiled, name: str, backend: str, like: torch.Tensor, port: int, source: int,
                  dense: bool) -> Any:
    """The recurrent scan of `c` (registered as `name`) for a layer's call on tensors like `like`
    (`backend`: a backend's name, or "auto": `backends.recurrent.choose`), loaded at trace time
    under torch.compile like `program_for`."""
    if torch.compiler.is_compiling():
        return getattr(_RESOLVED, _resolve_recurrent(name, backend, like.device.type, like.dtype, port, source, dense))
    return scans.program(ScanSpec(c, port, source, dense), scans.choose(backend, like))


@_assume_constant_result
def _resolve_recurrent(name: str, backend: str, device_type: str, dtype: torch.dtype, port: int, source: int,
                       dense: bool) -> str:
    """`_resolve` for a recurrent layer's scan (with its custom ops: `backends.recurrent_ops.register_ops`)."""
    c = _REGISTRY[name]
    like = torch.empty(0, dtype=dtype, device=device_type)
    need = Need.of(like, scans=True, noise=c.checked.stochastic, compile=True)
    if backend != "auto":
        refuse(c, backend, need)
    program = scans.program(ScanSpec(c, port, source, dense), scans.choose(backend, like, need))
    c.derived_names  # noqa: B018 - computed here, read by the trace
    k = f"rec{id(program)}"
    with _LOCK:
        setattr(_RESOLVED, k, program)
    return k


__all__ = ["program_for", "recurrent_for", "register", "refuse", "refuse_training"]
