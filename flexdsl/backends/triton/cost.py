"""The Triton backend's cost model: how long a recompute chunk is, and which training plan of
the shared schedule (save the minimum cut, or recompute each chunk from a checkpoint of the
states) runs faster on a GPU, per I/O element size.

The time of each plan is counted in float32 passes over `[T, N]` memory per step: bytes moved,
or the recompute backward's arithmetic where that takes longer (e.g. Hodgkin-Huxley, and most
models with 16-bit I/O, whose passes are half as long). Saving also wins where the unrolled
chunk would get too big. The constants were measured on an H100; `FLEXDSL_CHUNK` fixes the
chunk length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..._sympy import load as load_sympy
from ...settings import env_int

if TYPE_CHECKING:  # (imported without sympy: the backend's version, part of every cache key, reads the chunk)
    from ...ir.lower import StepModel
    from ...ir.schedule import Assignments, Schedule

# One pass over [T, N] float32 memory costs about as much time as this many operations per
# lane of the unrolled recompute backward, whose long dependent chains issue slowly (measured on
# an H100 at N*T = 2^27: LIF's 30 operations per step take 0.44 ms, 2.5 passes; Izhikevich's 61
# take 0.60 ms, 3.4 passes)
OPS_PER_PASS_RC = 12
# a draw: Philox4x32-10 (ten rounds of two 32-bit multiplies with their high words, and xors) and
# Box-Muller's log, cos and sqrt
DRAW_OPS = 64
MAX_UNROLLED = 640  # assignments in one unrolled chunk (forward + backward), for registers and compile time


def chunk_sizes() -> tuple[int, ...]:
    """The chunk lengths the recompute plan tries, largest first (FLEXDSL_CHUNK fixes one)."""
    fixed = env_int("FLEXDSL_CHUNK")  # (checked: 1 to 32)
    return (fixed,) if fixed else (8, 4)


def _ops(assignments: Assignments) -> int:
    """Arithmetic of a body, transcendental functions counted 4 times, a random draw DRAW_OPS times."""
    sp = load_sympy()
    from ...ir.functions import draws_in

    transcendental = (sp.exp, sp.log, sp.tanh, sp.sin, sp.cos, sp.Pow)
    n = 0
    for _, e in assignments:
        n += int(sp.count_ops(e))
        n += 3 * sum(1 for a in sp.preorder_traversal(e) if isinstance(a, transcendental))
        n += DRAW_OPS * len(draws_in(e))
    return n


@dataclass(frozen=True)
class TrainingPlans:
    """The chunk of the recompute kernels, and the default training plan ("save" or "recompute")
    with 32-bit and with 16-bit I/O, each with its reason in words (stated in the kernels' header)."""

    chunk: int
    plan32: str
    why32: str
    plan16: str
    why16: str


def training_plans(step: StepModel, sch: Schedule) -> TrainingPlans:
    body = sch.rc_body
    n_in, n_out, n_st = len(step.inputs), len(step.outputs), len(step.states)
    save = sch.passes(n_in, n_out)[1]
    chunk = 0
    for chunk in chunk_sizes():
        if (len(body) + len(sch.recompute) + len(sch.bwd_body)) * chunk <= MAX_UNROLLED:
            break
    else:
        why = "saving: the unrolled recompute would be too big"
        return TrainingPlans(chunk, "save", why, "save", why)
    # the time of each plan, in float32 passes over [T, N], per I/O element size (4 or 2 bytes:
    # the checkpoints stay float32); the recompute backward is bound by its bytes or by its
    # arithmetic (the forward re-run and the backward), whichever takes longer
    ops = _ops(body) + _ops(sch.recompute) + _ops(sch.bwd_body)
    ck = n_st / chunk  # one checkpoint of each state per chunk, written once and read once
    io_fwd, io_bwd = n_in + n_out, n_out + len(sch.rc_inputs) + n_in
    plans: list[tuple[str, str]] = []
    for size in (4, 2):
        f = size / 4
        t_save = save * f
        t_rc = io_fwd * f + ck + max(io_bwd * f + ck, ops / OPS_PER_PASS_RC)
        if t_rc < t_save:
            plans.append(("recompute", f"recomputing: {t_rc:.2f} float32 passes per step instead of {t_save:.2f} "
                                       f"(the backward re-runs {ops} operations per step); states checkpointed "
                                       f"every {chunk} steps"))
        else:
            bound = "its arithmetic" if ops / OPS_PER_PASS_RC > io_bwd * f + ck else "its bytes"
            plans.append(("save", f"saving: {t_save:.2f} float32 passes per step; recomputing would take "
                                  f"{t_rc:.2f} (its backward bound by {bound})"))
    (plan32, why32), (plan16, why16) = plans
    return TrainingPlans(chunk, plan32, why32, plan16, why16)


__all__ = ["TrainingPlans", "training_plans", "chunk_sizes", "OPS_PER_PASS_RC", "MAX_UNROLLED", "DRAW_OPS"]
