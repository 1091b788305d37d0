"""A noisy model's draws in NumPy: flexdsl's one Philox4x32-10 (`backends/random.py`), computed in
float64 (what every backend draws, rounded to its dtype), handed to the generated step as arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flexdsl.backends.random import NoiseStream


class NumpyDraws:
    """The draws of one step: `randn(k)`, `rand(k)` (what the generated step calls)."""

    def __init__(self, stream: NoiseStream, t: int) -> None:
        self.stream, self.t = stream, t

    def randn(self, k: int) -> np.ndarray:
        return self.stream.value("randn", k, self.t).numpy()

    def rand(self, k: int) -> np.ndarray:
        return self.stream.value("rand", k, self.t).numpy()


def draws(draws_per_step: int, noise: Any, T: int, shape: tuple[int, ...]):
    """`at(t)` -> the extra arguments of step t (none for a model without draws)."""
    if not draws_per_step:
        return lambda t: ()
    if noise is None:
        raise ValueError("a noisy model's NumPy program needs the call's NoiseKey")
    stream = NoiseStream(noise.seed, noise.t0, tuple(shape), torch.float64, torch.device("cpu"), T)
    return lambda t: (NumpyDraws(stream, t),)
