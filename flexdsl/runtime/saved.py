"""What a saved tensor becomes in a rewritten network's keep session (`runtime/recompute.py`): each
class is a handle autograd holds instead of the tensor, and `unpack_hook` gives the tensor back.

- `_Kept`: the tensor as it is, with the version check autograd makes (the hooks turn its own off);
- `_Bits`: a 0/1 tensor as bits; `_Pending`: a product's input whose 0/1 check runs on the device;
- `_Handle` on a `_Recipe`: left out, made again by the same operations in the backward (and, for
  a flexdsl kernel's input, donated to its backward as the gradient's buffer);
- `_Indices`: a max-pool's indices, made again from its input; `_Outer`: handed to the hooks of a
  context around the network. `Report` counts what each forward kept.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..backends import packed


class _Recipe:
    """How to make a tensor of the forward again: its geometry in its storage, the version it had
    when recorded, and `make()` (the recomputation, cached until its last expected reader)."""

    def __init__(self, out: torch.Tensor, make: Callable[[], torch.Tensor], reads: Sequence[Any],
                 source: Any = None) -> None:
        self.ref = weakref.ref(out)
        self.source = source  # (a handle on the recipe this one reads, whose cache it expects)
        self.ptr = out.untyped_storage().data_ptr()
        self.geometry = (tuple(out.shape), out.stride(), out.storage_offset())
        self.version = out._version
        self.dtype = out.dtype
        self.make = make
        self.reads = [(t, t._version) for t in reads if isinstance(t, torch.Tensor)]
        self.pending = 0  # readers not served yet (handles, recipes built on this one)
        self.cached: torch.Tensor | None = None

    def matches(self, t: torch.Tensor) -> bool:
        out = self.ref()
        return out is not None and t._version == self.version and t.dtype == self.dtype

    def value(self) -> torch.Tensor:
        """The recorded tensor, made again (same operations, same values: the same bits)."""
        v = self.cached
        if v is None:
            for t, ver in self.reads:
                if t._version != ver:
                    raise RuntimeError(
                        "flexdsl recompute: a tensor the backward recomputes from (a weight, bias or normalization "
                        f"statistic of shape {tuple(t.shape)}) was modified in place between the forward and the "
                        "backward (version " f"{t._version}, was {ver}); run the backward before changing it")
            with torch.no_grad():
                v = self.make()
            size, stride, offset = self.geometry
            if tuple(v.shape) != size or v.stride() != stride or v.storage_offset() != offset:
                need = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1 if all(size) else offset
                base = v.new_empty((max(need, 0),)).as_strided(size, stride, offset)
                base.copy_(v)
                v = base
            self.cached = v
        self.pending -= 1
        if self.pending <= 0:
            self.cached = None
        return v


class _Handle:
    """A saved tensor left out: its recipe and its own geometry in the recipe's storage."""

    __slots__ = ("recipe", "size", "stride", "offset", "donate")

    def __init__(self, recipe: _Recipe, t: torch.Tensor) -> None:
        self.recipe, self.size, self.stride, self.offset = recipe, tuple(t.shape), t.stride(), t.storage_offset()
        self.donate = packed.TAKES_DONATIONS[0]  # (saved by a flexdsl kernel's op, whose backward takes them)
        recipe.pending += 1

    def value(self) -> torch.Tensor:
        r = self.recipe
        v = r.value().as_strided(self.size, self.stride, self.offset)
        if self.donate and r.cached is None and (self.size, self.stride, self.offset) == r.geometry:
            packed.donate(v)  # (made for this reader alone, dead after it: its backward may write into it)
        return v


class _Bits:
    """A saved 0/1 tensor kept as bits. One read by two readers of one backward (a max-pool's op and
    the recomputation of its indices, `shared`) is unpacked once: the second takes the first's."""

    __slots__ = ("bits", "shape", "dtype", "shared", "last")

    def __init__(self, t: torch.Tensor, outer: Any = None) -> None:
        self.bits: Any = packed.pack(t)
        if outer is not None:  # (a context around the network sees the bits)
            self.bits = _Outer(outer, outer[0](self.bits))
        self.shape, self.dtype = t.shape, t.dtype
        self.shared, self.last = False, None

    def value(self) -> torch.Tensor:
        v = self.last
        if v is not None:
            self.last = None
            return v
        bits = self.bits.value() if isinstance(self.bits, _Outer) else self.bits
        v = packed.unpack(bits, self.shape, self.dtype)
        if self.shared:
            self.last = v
        return v


class _Kept:
    """A tensor kept as it is, with the version autograd would check (hooks turn its check off):
    changed in place before the backward reads it, the same error as autograd's."""

    __slots__ = ("t", "version")

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.version = t, t._version

    def value(self) -> torch.Tensor:
        t = self.t
        if t._version != self.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{t.type()} {list(t.shape)}] is at version {t._version}; expected version {self.version} instead")
        return t


class _Flags:
    """Pinned host flags that the device's 0/1 checks are copied into (read without waiting)."""

    host: torch.Tensor | None = None
    free: list[int] = []
    abandoned: list[tuple[Any, int]] = []  # (event, slot) of checks nobody waits for any more

    @classmethod
    def take(cls) -> int | None:
        if cls.abandoned:
            still = []
            for ev, slot in cls.abandoned:
                (cls.free.append(slot) if ev.query() else still.append((ev, slot)))
            cls.abandoned = still
        if cls.host is None:
            try:
                cls.host = torch.zeros(256, dtype=torch.bool, pin_memory=True)
            except RuntimeError:  # (no pinned memory: check now)
                return None
            cls.free = list(range(256))
        return cls.free.pop() if cls.free else None

    @classmethod
    def give(cls, slot: int) -> None:
        cls.free.append(slot)


class _Pending:
    """A product's input whose 0/1 check is queued (on a GPU: on the device, read back into a pinned
    flag without waiting; on the CPU: made at once): kept as it is until the check has finished
    (polled, never waited for), then as bits if it holds only 0 and 1, else as it is (handed to the
    hooks of a context around the network, if any, as everything kept as it is)."""

    __slots__ = ("t", "ref", "version", "owner", "slot", "event", "flag", "bits", "held", "shape", "dtype")

    def __init__(self, t: torch.Tensor, owner: dict | None, slot: int) -> None:
        self.t, self.version, self.owner, self.slot = t, t._version, owner, slot
        self.ref = weakref.ref(t)  # (which tensor it is, also once settled as bits)
        self.bits, self.held, self.shape, self.dtype = None, None, t.shape, t.dtype
        ok = ((t == 0) | (t == 1)).all()
        self.event: Any = None
        self.flag: bool | None = None
        if slot >= 0:
            assert _Flags.host is not None
            _Flags.host[slot].copy_(ok, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.flag = bool(ok)

    def settle(self, report: Report | None, outer: Any = None) -> bool:
        """Whether the check has finished (then the input is kept as bits or as it is)."""
        if self.flag is None:
            if self.slot < 0:
                return True
            if not self.event.query():
                return False
            assert _Flags.host is not None
            self.flag = bool(_Flags.host[self.slot])
            _Flags.give(self.slot)
            self.slot = -1
        binary, t = self.flag, self.t
        if t is None:
            return True
        if self.owner is not None:
            self.owner["_flexdsl_real_inputs"] = 0 if binary else self.owner.get("_flexdsl_real_inputs", 0) + 1
        if binary and t._version == self.version and t.is_contiguous():
            self.bits = packed.pack(t)
            if outer is not None:  # (a context around the network sees the bits, as a product's own)
                self.bits = _Outer(outer, outer[0](self.bits))
            packed.mark_binary(t)
            self.t = None
            if report is not None:
                report.packed(t)
        else:
            self._as_it_is(report, outer)
        return True

    def _as_it_is(self, report: Report | None, outer: Any) -> None:
        t = self.t
        if t is None:
            return
        if report is not None:
            report.kept(t)
        if outer is not None:
            self.held = _Outer(outer, outer[0](t))
            self.t = None

    def give_up(self, report: Report | None = None, outer: Any = None) -> None:
        """The forward ended before the check did: the input stays as it is (its flag is free again
        once the device has written it)."""
        if self.slot >= 0:
            _Flags.abandoned.append((self.event, self.slot))
            self.slot = -1
        self._as_it_is(report, outer)

    def value(self) -> torch.Tensor:
        if self.bits is not None:
            bits = self.bits.value() if isinstance(self.bits, _Outer) else self.bits
            return packed.unpack(bits, self.shape, self.dtype)
        if self.held is not None:
            return self.held.value()
        t = self.t
        assert t is not None
        if t._version != self.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{t.type()} {list(t.shape)}] is at version {t._version}; expected version {self.version} instead")
        return t


class _Outer:
    """A tensor kept as it is, handed to the hooks of a context around the network (they still apply)."""

    __slots__ = ("hooks", "held")

    def __init__(self, hooks: Any, held: Any) -> None:
        self.hooks, self.held = hooks, held

    def value(self) -> torch.Tensor:
        return self.hooks[1](self.held)


class _Indices:
    """A max-pool's indices left out: made again, in the backward, by the same max-pool of the same
    input (the one its op saved, as kept or as bits): the same indices."""

    __slots__ = ("module", "input", "shape", "version")

    @staticmethod
    def of(module: nn.Module, held: Any, in_shape: tuple, t: torch.Tensor) -> _Indices | None:
        """The indices `t` the pool's op saved after its input (of `in_shape`, kept as `held`), or None
        where `t` does not look like them (another rank, other leading sizes, not contiguous)."""
        n = next(v for c, v in _POOLS.items() if isinstance(module, c))
        if t.dim() != len(in_shape) or tuple(t.shape[:-n]) != tuple(in_shape[:-n]) or not t.is_contiguous():
            return None
        i = _Indices.__new__(_Indices)
        i.module, i.input, i.shape, i.version = module, held, tuple(t.shape), t._version
        return i

    def value(self) -> torch.Tensor:
        x = unpack_hook(self.input)
        n = next(v for c, v in _POOLS.items() if isinstance(self.module, c))
        with torch.no_grad():
            idx = _pool(self.module, n, x)[1]
        assert tuple(idx.shape) == self.shape
        return idx


_POOLS: dict[type, int] = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3}


def _pool(m: Any, n: int, x: torch.Tensor) -> Any:
    f = getattr(torch.nn.functional, f"max_pool{n}d")
    return f(x, m.kernel_size, m.stride, m.padding, m.dilation, ceil_mode=m.ceil_mode, return_indices=True)


def unpack_hook(h: Any) -> torch.Tensor:
    return h.value() if isinstance(h, _Kept | _Handle | _Bits | _Outer | _Indices | _Pending) else h


class Report:
    """Bytes of the saved tensors of the last forward: kept as they are, packed as bits, left out
    (recomputed in the backward)."""

    def __init__(self) -> None:
        self.kept_bytes = self.bits_bytes = self.left_out_bytes = 0
        self.n_kept = self.n_bits = self.n_left_out = 0

    @staticmethod
    def _bytes(t: torch.Tensor) -> int:
        return t.nbytes

    def kept(self, t: torch.Tensor) -> None:
        self.kept_bytes += self._bytes(t)
        self.n_kept += 1

    def packed(self, t: torch.Tensor) -> None:
        self.bits_bytes += self._bytes(t)
        self.n_bits += 1

    def packed_by_product(self, bits: torch.Tensor) -> None:
        """Bits a product packed itself (its 0/1 input): counted as the float32 values they hold."""
        self.bits_bytes += 32 * bits.nbytes
        self.n_bits += 1

    def left_out(self, t: torch.Tensor) -> None:
        self.left_out_bytes += self._bytes(t)
        self.n_left_out += 1

    def __repr__(self) -> str:
        mib = 2 ** 20
        return (f"saved for the backward: {self.kept_bytes / mib:.1f} MiB kept as they are ({self.n_kept} tensors), "
                f"{self.bits_bytes / mib:.1f} MiB of 0/1 values kept as bits ({self.n_bits}; "
                f"{self.bits_bytes / 32 / mib:.2f} MiB as float32 bits), {self.left_out_bytes / mib:.1f} MiB left out "
                f"and recomputed ({self.n_left_out})")
