"""The CPU kernels' C ABI: the one description of their arguments, read by the emitter (the
generated signatures) and the launcher (argument lists). Sympy-free: a process that loads a
model from the disk cache builds its program from this and the cached source alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CpuABI:
    """Each entry point (`flexdsl_fwd_f32`, `_f64`, `flexdsl_bwd_f32`, `_f64`) takes
    `(const int64_t* n, void* const* p, const double* f)`:
    - `fwd`: n = [T, N, threads, step stride per input]; p = [per input, per state (initial
      values, [N] in R, or null: the value f[state]), per param ([N] doubles, or null: the value
      f[n_states + param]), per output, per state (final), per state (sequence, or null),
      saved (or null)]; f = [per state, per param];
    - `bwd`: n = [T, N, threads, step stride per input]; p = [per input (the re-read ones, else
      null), saved, per param, per output (gradient, or null: 0), per state (gradient of the
      sequence, or null), per state (gradient of the final state, or null: 0), per input
      (gradient, or null: not needed), per state (gradient of the initial state, or null), per
      learnable param (per-lane sums in double, or null)]; f = [per param].
    Inputs are [T, N] with unit lane stride, outputs [T, N], saved values [K, T, N] (K = len(saved)).
    A noisy model's `n` ends with the key of its draws: the seed and the key's step of the first step.
    """

    name: str
    inputs: list[str]
    states: list[str]
    params: list[str]
    learnable: list[str]
    outputs: list[str]
    saved: list[str]  # per-step values the training forward writes
    reread: list[str]  # inputs the backward reads again
    grad_inputs: list[bool]  # which gradients can be nonzero
    grad_states: list[bool]
    grad_params: list[bool]
    lanes: int = 256  # lanes per block
    draws: int = 0  # random draws per step and element (a noisy model: n also holds its key, seed and t0)

    def fwd_slots(self) -> dict[str, int]:
        """Where each group of the forward's pointers starts in `p` (and "n", their number)."""
        n_in, n_st = len(self.inputs), len(self.states)
        return _starts([("inputs", n_in), ("inits", n_st), ("params", len(self.params)),
                        ("outputs", len(self.outputs)), ("fins", n_st), ("seqs", n_st), ("saved", 1)])

    def bwd_slots(self) -> dict[str, int]:
        """Where each group of the backward's pointers starts in `p` (and "n", their number)."""
        n_in, n_st = len(self.inputs), len(self.states)
        return _starts([("inputs", n_in), ("saved", 1), ("params", len(self.params)), ("g_outputs", len(self.outputs)),
                        ("g_seqs", n_st), ("g_fins", n_st), ("g_inputs", n_in), ("g_states", n_st),
                        ("g_params", len(self.learnable))])

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CpuABI:
        return cls(**d)


def _starts(groups: list[tuple[str, int]]) -> dict[str, int]:
    out, at = {}, 0
    for name, n in groups:
        out[name] = at
        at += n
    out["n"] = at
    return out


__all__ = ["CpuABI"]
