"""The random numbers of noisy models (the reference, in torch): the one counter-based generator every backend
implements (the Triton kernels with `tl.philox`, the C++ kernels in their prologue), so that the
same seed gives the same noise on each.

Draw k of step t of element i, for a 64-bit `seed`, is Philox4x32-10 (Salmon et al. 2011, the
generator of Triton's `tl.rand`/`tl.randn` and of cuRAND's `philox4_32_10`) with the key
(seed mod 2**32, seed div 2**32) and the counter (i mod 2**32, i div 2**32, t, k): a function of
(seed, t, i, k) only, so no launch shape, block size, chunk or thread count can change it. Of its
four 32-bit words x0, x1:

- a uniform is `u(x) = (2*(x >> 9) + 1) * 2**-24`, in (0, 1), symmetric about 1/2, exact in float32
  (`rand()` is u(x0));
- a standard normal is Box–Muller's `sqrt(-2*log(u(x0))) * cos(2*pi*u(x1))`, computed in float64
  and rounded to the run's dtype (`randn()`, and the normal of white noise). Its tails stop at
  |N| = 5.77 (u(x0) >= 2**-24): a draw beyond that has probability 8e-9.

The element index i is the position in the step's shape (C order, the broadcast shape of the
inputs); t counts the steps of a call from the key's first step.
"""

from __future__ import annotations

import math

import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32's multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # its key schedule (Weyl increments)
MASK = 0xFFFFFFFF
ROUNDS = 10
STEP_BLOCK = 1 << 20  # elements x steps computed at once (bounds the memory of a call's draws)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a*b) div 2**32 and mod 2**32 for a 32-bit constant `a` and int64 `b` in [0, 2**32), exactly
    (in 16-bit halves of `a`: no int64 product overflows)."""
    p = b * (a & 0xFFFF)
    q = b * (a >> 16)
    s = p + ((q & 0xFFFF) << 16)
    return (q >> 16) + (s >> 32), s & MASK


def philox(seed: int, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 of the counters (int64 tensors of 32-bit values, broadcast together)."""
    k0, k1 = seed & MASK, (seed >> 32) & MASK
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c0, c1, c2, c3


def uniform(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit word as a uniform in (0, 1) (float64; exact in float32)."""
    return ((x >> 9) * 2 + 1).to(torch.float64) * 2.0**-24


def normal(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """Box–Muller's normal of two words (float64)."""
    return torch.sqrt(-2.0 * torch.log(uniform(x0))) * torch.cos((2.0 * math.pi) * uniform(x1))


def draws(seed: int, kind: str, k: int, steps: torch.Tensor, elements: torch.Tensor) -> torch.Tensor:
    """Draw `k` ("randn" or "rand") of the given steps ([S, 1] int64) and elements ([N] int64):
    [S, N] float64."""
    t = steps & MASK
    c0, c1 = elements & MASK, elements >> 32
    x0, x1, _, _ = philox(seed, c0, c1, t, torch.full_like(t, k))
    return normal(x0, x1) if kind == "randn" else uniform(x0)


class NoiseStep:
    """The draws of one step (what a noisy model's generated `core` calls: `_noise.randn(k)`)."""

    def __init__(self, stream: NoiseStream, t: int) -> None:
        self.stream, self.t = stream, t

    def randn(self, k: int) -> torch.Tensor:
        return self.stream.value("randn", k, self.t)

    def rand(self, k: int) -> torch.Tensor:
        return self.stream.value("rand", k, self.t)


class NoiseStream:
    """The draws of a call: `seed`, the key's first step `t0`, the step's shape, dtype and device.
    `at(t)` is step t of the call (counted from 0); draws are computed for blocks of steps at once
    and kept while the call needs them."""

    def __init__(self, seed: int, t0: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 T: int) -> None:
        self.seed, self.t0, self.shape, self.dtype, self.device, self.T = int(seed), int(t0), tuple(shape), dtype, \
            device, int(T)
        self.n = math.prod(self.shape)
        self.block = max(1, min(self.T or 1, STEP_BLOCK // max(self.n, 1)))
        self.cache: dict[tuple[str, int, int], torch.Tensor] = {}
        self.elements: torch.Tensor | None = None

    def at(self, t: int) -> NoiseStep:
        return NoiseStep(self, t)

    def value(self, kind: str, k: int, t: int) -> torch.Tensor:
        b = t // self.block
        hit = self.cache.get((kind, k, b))
        if hit is None:
            if self.elements is None:
                self.elements = torch.arange(self.n, dtype=torch.int64, device=self.device)
            first = b * self.block
            steps = torch.arange(first, min(first + self.block, max(self.T, t + 1)), dtype=torch.int64,
                                 device=self.device) + self.t0
            hit = draws(self.seed, kind, k, steps.unsqueeze(1), self.elements).to(self.dtype)
            for key in [c for c in self.cache if c[:2] == (kind, k)]:  # (the steps before are done)
                del self.cache[key]
            self.cache[(kind, k, b)] = hit
        return hit[t - b * self.block].reshape(self.shape)


__all__ = ["philox", "draws", "uniform", "normal", "NoiseStream", "NoiseStep"]
