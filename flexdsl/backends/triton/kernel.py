"""Launching the generated kernels: a `Kernel` takes its arguments in ABI order and keeps the
compiled kernels of its launches (by specialization key, so that a later launch skips Triton's
per-call argument binding); a `LaunchPlan` is one launch with everything fixed but the call's
own tensors, recorded from a first launch per call signature. `LAUNCHES` counts launches by kind
("fwd", "bwd", "bwd_rc"): tests check that the Triton path really ran.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ...errors import FlexDSLError
from ...settings import env_choice
from ..ops import wrap_kernel

LAUNCHES: Counter = Counter()

_INTERPRET: list[bool] = []
_WRAPPING: list[bool] = []


@contextmanager
def wrapping() -> Iterator[None]:
    """Launch through `torch.library.wrap_triton` (the body of a `triton_op`, which Inductor
    traces with tensors that have no data: no launch plans, no compiled-kernel cache)."""
    _WRAPPING.append(True)
    try:
        yield
    finally:
        _WRAPPING.pop()


def wrapped() -> bool:
    """Whether launches go through `wrap_triton` now."""
    return bool(_WRAPPING)


def interpret() -> bool:
    """TRITON_INTERPRET=1 (read once: it must be set before triton is imported anyway)."""
    if not _INTERPRET:
        _INTERPRET.append(os.environ.get("TRITON_INTERPRET", "0") == "1")
    return _INTERPRET[0]


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device_index: int) -> int:
    """The current CUDA stream's handle (what Triton's own launcher asks for; cheaper than
    torch.cuda.current_stream(), which builds a Stream object)."""
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def first_order(what: str, where: str, hint: str) -> None:
    """Called at the top of a Triton backward: its gradients are a kernel's, not differentiable; under
    create_graph=True (grad mode on in a backward) a second derivative through them would silently
    miss their part (zeros, or a partial sum), so it is a located error (`where`: the model or layer)."""
    if torch.is_grad_enabled():
        raise FlexDSLError("second-order gradients (create_graph=True) cannot go through the Triton kernels of "
                           f"{what}: their backward is a kernel, and its results are not differentiable", where,
                           hint=hint)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host (`triton.cdiv` is a constexpr function in recent Triton: ~10 µs a host call)."""
    return (a + b - 1) // b


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (>= 1), as `triton.next_power_of_2`, without its host-call cost."""
    return 1 << max(n - 1, 0).bit_length()


def device_of(ts) -> torch.device:
    for t in ts:
        if t is not None:
            return t.device
    return torch.device("cpu")


def bits(vals: Sequence[float]) -> bytes:
    """Floats as a cache key: their bits (0.0 and -0.0 differ, a NaN equals itself), so that a
    key always determines what the cached value was computed from."""
    return struct.pack(f"{len(vals)}d", *vals)


def spec(t: Any) -> Any:
    """What Triton specializes a non-constexpr argument on."""
    if t is None:
        return None
    if type(t) is float:
        return 0
    if type(t) is int:  # (Triton passes ints beyond 32 bits as i64: another kernel)
        return (t == 1, t % 16 == 0, -0x80000000 <= t <= 0x7FFFFFFF)
    if not isinstance(t, torch.Tensor):  # a block-load descriptor: its dtype, block and padding
        return (t.base.dtype, tuple(t.block_shape), getattr(t, "padding", None))
    return (t.dtype, t.data_ptr() % 16 == 0)


class Compiled:
    """A Triton kernel's compiled kernels by specialization key, so that a later launch with the
    same key skips Triton's per-call argument binding (tens of microseconds a launch). Through
    `wrap_triton`, in the interpreter, or with FLEXDSL_TRITON_FAST_LAUNCH=0: the public launch."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.cache: dict[tuple, Any] = {}
        self.fast = env_choice("FLEXDSL_TRITON_FAST_LAUNCH") != "0"

    def run_full(self, grid: tuple[int, ...], full: list, key: tuple, device_index: int, **opts: Any) -> None:
        """Launch with every argument in signature order (constexprs too); `key` must determine
        Triton's specialization of the launch (with the launch options `opts`)."""
        if _WRAPPING:
            wrap_kernel(self.fn)[grid](*full, **opts)
            return
        if interpret() or not self.fast:
            self.fn[grid](*full, **opts)
            return
        ck = self.cache.get(key)
        if ck is None:
            ck = self.fn[grid](*full, **opts)
            if hasattr(ck, "run"):
                self.cache[key] = ck
            return
        g = (*grid, 1, 1)
        try:
            stream = _stream(device_index)
            ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, ck.launch_metadata(grid, stream, *full),
                   None, None, *full)
        except (TypeError, AttributeError):  # another Triton's launcher API: use the public path
            self.fast = False
            self.fn[grid](*full, **opts)


class Kernel(Compiled):
    """One generated kernel with its ABI order: a launch takes a value list per role."""

    def __init__(self, fn, args, warps: int) -> None:
        super().__init__(fn)
        groups: dict[str, int] = {}
        self.index: list[tuple[str, int]] = []
        for a in args:
            i = groups.get(a.role, 0)
            groups[a.role] = i + 1
            self.index.append((a.role, i))
        self.constexpr = [a.constexpr for a in args]
        self.warps = warps

    def launch(self, grid: tuple[int], values: dict[str, list], key: tuple, device: torch.device) -> None:
        """Launch with the arguments in ABI order. `key` must determine Triton's specialization
        of this launch (the dtypes and 16-byte alignment of the tensors that are not fresh
        allocations, ints ==1 / %16, which args are None, the constexpr values): with it, a
        cache of compiled kernels skips Triton's per-call argument binding."""
        self.launch_full(grid, [values[r][i] for r, i in self.index], key, device)

    def launch_full(self, grid: tuple[int], full: list, key: tuple, device: torch.device) -> None:
        """Launch with the full argument list, in ABI order."""
        self.run_full(grid, full, (self.warps, *key), device.index or 0, num_warps=self.warps)


class Launcher(Compiled):
    """A hand-written (static) kernel launched with keyword arguments; its key is derived from
    the arguments themselves (`spec` of each, the constexpr values, warps and stages): a recurrent
    layer's call makes six such launches."""

    def __init__(self, fn) -> None:
        super().__init__(fn)
        params = getattr(fn, "params", None)  # (not in the interpreter, which launches the public way)
        self.names: list[str] = [p.name for p in params] if params is not None else []
        self.const = [bool(p.is_constexpr) for p in params] if params is not None else []
        # a parameter's default where the call leaves it out (as Triton's own launch does)
        self.defaults = {p.name: p.default for p in params if getattr(p, "has_default", False)} if params else {}
        self.fast = self.fast and params is not None

    def __call__(self, grid: tuple[int, ...], num_warps: int = 4, num_stages: int = 3, **kw: Any) -> None:
        if not self.names:
            self.fn[grid](**kw, num_warps=num_warps, num_stages=num_stages)
            return
        defaults = self.defaults
        full = [kw[n] if n in kw else defaults[n] for n in self.names]
        key = (num_warps, num_stages, *((v if c else spec(v)) for v, c in zip(full, self.const))) if self.fast else ()
        dev = device_of(v for v in full if isinstance(v, torch.Tensor))
        self.run_full(grid, full, key, dev.index or 0, num_warps=num_warps, num_stages=num_stages)


class LaunchPlan:
    """A kernel launch with everything fixed but the call's own tensors: the argument list,
    where each call's tensors go (`slots`: position -> (kind, index)), the grid and the
    specialization key. Recorded from a first launch per call signature (shape, dtype, flags,
    float params and states), so that a later call only allocates its outputs, fills the slots
    and launches."""

    def __init__(self, kernel: Kernel, values: dict[str, list], per_call: tuple[str, ...], grid: tuple[int],
                 key: tuple) -> None:
        self.kernel, self.grid, self.key = kernel, grid, key
        self.full = [values[r][i] for r, i in kernel.index]
        # each slot by its ABI role and index, never by the tensor's identity: one tensor may fill
        # two slots of the call that records the plan (m(a, a), one gradient for two outputs) and
        # two different tensors in a later call
        self.slots = [(j, r, i) for j, (r, i) in enumerate(kernel.index)
                      if r in per_call and self.full[j] is not None]
        for j, _, _ in self.slots:
            self.full[j] = None

    def launch(self, tensors: dict[str, list], device: torch.device) -> None:
        full = self.full.copy()
        for j, kind, i in self.slots:
            full[j] = tensors[kind][i]
        self.kernel.launch_full(self.grid, full, self.key, device)


class LaunchPlans:
    """The launch plans of one program, by call signature (a bounded cache)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self.plans: dict[tuple, LaunchPlan] = {}

    def get(self, sig: tuple | None) -> LaunchPlan | None:
        return self.plans.get(sig) if sig is not None else None

    def remember(self, sig: tuple, plan: LaunchPlan) -> None:
        if len(self.plans) > self.size:
            self.plans.clear()
        self.plans[sig] = plan

    def clear(self) -> None:
        self.plans.clear()


__all__ = ["wrapping", "wrapped", "first_order", "Compiled", "Kernel", "Launcher", "LaunchPlan", "LaunchPlans", "LAUNCHES", "interpret", "spec", "bits", "cdiv", "next_pow2", "prod",
           "device_of"]
