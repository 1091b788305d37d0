"""0/1 values packed as bits and back in one Triton kernel each (`backends/packed.py` uses them for
CUDA tensors): value k in bit k % 8 of byte k // 8, as the torch path packs them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernel import Launcher, cdiv

BLOCK = 1024  # bytes per program


@triton.jit
def _pack(x_ptr, out_ptr, n, nbytes, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    k = b[:, None] * 8 + tl.arange(0, 8)[None, :]
    v = tl.load(x_ptr + k, mask=k < n, other=0.0)
    bits = (v != 0).to(tl.int32) << tl.arange(0, 8)[None, :]
    tl.store(out_ptr + b, tl.sum(bits, axis=1).to(tl.uint8), mask=b < nbytes)


@triton.jit
def _unpack(p_ptr, out_ptr, n, nbytes, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    byte = tl.load(p_ptr + b, mask=b < nbytes, other=0).to(tl.int32)
    k = b[:, None] * 8 + tl.arange(0, 8)[None, :]
    v = (byte[:, None] >> tl.arange(0, 8)[None, :]) & 1
    tl.store(out_ptr + k, v.to(tl.float32).to(out_ptr.dtype.element_ty), mask=k < n)


_PACK: Launcher | None = None
_UNPACK: Launcher | None = None


def _launchers() -> tuple[Launcher, Launcher]:
    """The two kernels behind flexdsl's launcher (a compiled kernel kept per specialization: a launch
    skips Triton's per-call argument binding, tens of microseconds, as the neuron kernels' do)."""
    global _PACK, _UNPACK
    if _PACK is None or _UNPACK is None:
        _PACK, _UNPACK = Launcher(_pack), Launcher(_unpack)
    return _PACK, _UNPACK


def pack(flat: torch.Tensor) -> torch.Tensor:
    """`flat` (contiguous, 1-d) as bits: uint8 [ceil(n / 8)]."""
    n = flat.numel()
    nbytes = (n + 7) // 8
    out = torch.empty((nbytes,), dtype=torch.uint8, device=flat.device)
    if nbytes:
        _launchers()[0]((cdiv(nbytes, BLOCK),), x_ptr=flat, out_ptr=out, n=n, nbytes=nbytes, BLOCK=BLOCK)
    return out


def unpack(packed: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The first `n` values of `packed` as `dtype` (1-d)."""
    out = torch.empty((n,), dtype=dtype, device=packed.device)
    if n:
        nbytes = (n + 7) // 8
        _launchers()[1]((cdiv(nbytes, BLOCK),), p_ptr=packed, out_ptr=out, n=n, nbytes=nbytes, BLOCK=BLOCK)
    return out


__all__ = ["pack", "unpack"]
