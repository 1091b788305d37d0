"""The backends and their registry. Takes the pipeline's IR (`store.pipeline.IR`); gives each
target's `Artefact` (readable source and metadata, `emit`) and the `Program` that runs it
(`load`), through the interface of `base.py`; `printer.py` and `naming.py` are shared by the
code printers.

    backends.register("numpy", NumpyBackend())     # a new backend: one module + this line
    backends.get("torch")                          # the backend object
    backends.choose("auto", inputs)                # what `backend="auto"` picks for these inputs
    backends.able(Need(scans=True))                # the names of the backends that can do this

Built-in backends are imported on first use, so `flexdsl check` never imports triton.
`backend="auto"` tries the backends registered with `auto=True`, most preferred first, and
takes the first whose declared `capabilities` fit the call (device type, dtype, layer scan,
noise) and that is available and accepts the inputs. What a backend has not declared, asked of
it by name, is refused (`refusal`: the message names the backends that can).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from ..errors import FlexDSLError
from .base import UNDECLARED, Backend, Capabilities, Need


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


def unregister(name: str) -> None:
    """Remove a backend added by `register` (a test's, when the test is done)."""
    with _LOCK:
        _FACTORIES.pop(name, None)
        _LOADED.pop(name, None)
        if name in _AUTO:
            _AUTO.remove(name)


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


def capabilities(b: Backend) -> Capabilities:
    """What `b` declares (a backend without a declaration: any device and dtype, no layer scans;
    layer scans only with a `load_scan`)."""
    caps = getattr(b, "capabilities", UNDECLARED)
    if caps.scans and not hasattr(b, "load_scan"):
        caps = dataclasses.replace(caps, scans=False)
    return caps


def able(need: Need) -> list[str]:
    """The registered backends that declare `need` and are available here, in registry order."""
    out = []
    for n in names():
        b = get(n)
        if capabilities(b).lacks(need) is None and b.available():
            out.append(n)
    return out


def refusal(name: str, need: Need) -> str | None:
    """Why backend `name` cannot do `need` (what it has not declared), naming the backends that
    can; None: it declares it."""
    why = capabilities(get(name)).lacks(need)
    if why is None:
        return None
    can = [n for n in able(need) if n != name]
    others = ", ".join(f"`{n}`" for n in can)
    return f"backend `{name}` {why}; " + (f"{others} {'does' if len(can) == 1 else 'do'}" if can
                                          else "no registered backend does")


def choose(name: str, inputs: Sequence[Any], need: Need | None = None) -> Backend:
    """The backend that runs these inputs: `name`, or for "auto" the first preferred backend
    whose capabilities fit `need` (default: the inputs' device type and dtype) and that is
    available and accepts them; the reference backend where none does."""
    if name != "auto":
        return get(name)
    need = need if need is not None else Need.of(inputs[0])
    for n in _AUTO:
        b = get(n)
        if capabilities(b).lacks(need) is None and b.accepts(inputs) and b.available():
            return b
    return get(REFERENCE)


def _kernel_backend(name: str, x: Any, declared: str) -> Any:
    """The backend a layer named `name` runs inputs like `x` on (auto: the Triton kernels for CUDA
    tensors) where it declares `Capabilities.<declared>` and runs `x`, else None."""
    try:
        b = choose(name, [x], Need.of(x))
    except FlexDSLError:
        return None
    caps = capabilities(b)
    if not getattr(caps, declared) or caps.lacks(Need.of(x)) is not None or not b.available():
        return None
    if name == "auto" and not x.is_cuda:
        return None
    return b


def delay_kernel(name: str, x: Any, op: str = "product") -> Callable | None:
    """The sparse-delay product (`op="product"`: `delay_product(hist, d, a, c, D)`) or the per-element
    relaxed delays (`"spread"`: `delay_spread(hist, taps)`) or the learnable gauss synaptic delays
    (`"gauss"`: `delay_gauss(hist, w, d, coef, D, past)`) of the backend a layer named `name` runs
    inputs like `x` on (auto: the Triton kernels for CUDA tensors), or None where that backend has
    none (the torch path then)."""
    b = _kernel_backend(name, x, "delays")
    return None if b is None else getattr(b, f"delay_{op}")


def plastic_kernel(name: str, x: Any) -> Callable | None:
    """The online plastic layer's kernel maker (`make(ir, rule_ir, rule_key, port, source)`: the
    backend's `plastic_program(ir, key, rule_ir, rule_key, port, source, x)`, see `triton/plastic.py`;
    None where it cannot run on `x`) of the backend a layer named `name` runs inputs like `x` on (auto:
    the Triton kernels for CUDA tensors), or None where that backend has none (the step-by-step loop
    then)."""
    b = _kernel_backend(name, x, "plastic")
    if b is None:
        return None

    def make(ir: Any, rule_ir: Any, rule_key: str, port: int, source: int) -> Any:
        return b.plastic_program(ir, ir.key(b), rule_ir, rule_key, port, source, x)  # type: ignore[attr-defined]
    return make


def sparse_kernel(name: str, x: Any) -> Any:
    """The sparse-input operations of the backend a layer named `name` runs inputs like `x` on (auto:
    the Triton kernels for CUDA tensors): `compact(x2)`, `current(x2, compacted, wt, b)` and
    `program(ir, port, source)` (the fused kernel; see `triton/sparse.py`), or None where that backend
    has none (the dense product then)."""
    b = _kernel_backend(name, x, "sparse")
    if b is None:
        return None
    ops = b.sparse_ops()  # type: ignore[attr-defined]
    return SimpleNamespace(compact=ops.compact, current=ops.current, Workspace=ops.Workspace,
                           program=lambda ir, port, source: ops.program(ir, ir.key(b), port, source))


__all__ = ["register", "unregister", "names", "delay_kernel", "plastic_kernel", "sparse_kernel", "auto_names", "get", "choose", "capabilities", "able", "refusal",
           "Backend", "Capabilities", "Need", "REFERENCE"]
