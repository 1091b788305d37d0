"""The rules for a lowered step's constants, one place for every backend.

Each number of the step is a finite real that a float64 holds (a complex value, an overflow or a
nonzero constant that a float64 rounds to 0 is a located `FlexDSLError` at load), and an integer
that no float64 holds exactly (beyond 2**53: `x * 2**70`, a product of large integer literals) is
the float64 nearest it. Sympy folds integers exactly, but no target takes them so: torch's Python
scalars stop at int64 (an OverflowError at the first call), Triton's integer constants too
("Nonrepresentable integer"), and a value one target reads as an int64 and another as a double
would round differently. The printers (`backends/printer.py`) and the host expressions (`host.py`)
apply the same rule to the integers the later stages make (the backward's coefficients), so every
backend reads one double for each constant.
"""

from __future__ import annotations

import math

import sympy as sp

from ..errors import FlexDSLError
from .tosympy import NONFINITE

EXACT_INTEGERS = 2**53  # every integer of at most this magnitude is a float64


def exact_integer(c: sp.Integer) -> bool:
    """Whether a float64 holds this integer exactly (and every target takes it as written)."""
    return abs(int(c)) <= EXACT_INTEGERS


def as_floats(e: sp.Basic) -> sp.Basic:
    """`e` with each integer beyond 2**53 replaced by the float64 nearest it."""
    big = {c: sp.Float(float(c)) for c in e.atoms(sp.Integer) if not exact_integer(c)}
    return e.xreplace(big) if big else e


def check(step) -> None:
    """Every constant of the step (its statements, next states and outputs) is a finite real that
    a float64 holds; a located FlexDSLError at the statement otherwise."""
    n = step.checked.ast
    values = [*((y.name, e) for y, e in step.assignments), *((s.name, e) for s, e in zip(step.states, step.next_states)),
              *step.outputs]
    for name, e in values:
        if not isinstance(e, sp.Expr):
            continue
        pos = step.origins.get(name) or n.pos
        numbers = e.atoms(sp.Number)
        if e.has(sp.I) or any(not c.is_real for c in numbers):
            raise FlexDSLError("this statement folds to a complex number (every backend computes in real numbers)",
                               n.filename, pos.line, pos.column, n.source,
                               "e.g. sqrt, log or a fractional power of a negative constant (or of a `where` or "
                               "`clip` whose branches are)")
        if e.has(*NONFINITE) or any(not _fits_float(c) for c in numbers):
            raise FlexDSLError("this statement's constants overflow a float (they fold to a value beyond "
                               "1.8e308)", n.filename, pos.line, pos.column, n.source,
                               "the largest float is about 1.8e308: rescale the constants (or their units)")
        tiny = [c for c in numbers if c.is_zero is False and float(c) == 0.0]
        if tiny:
            raise FlexDSLError(f"this statement's constants underflow a float: {sp.sstr(tiny[0])[:40]} would be 0",
                               n.filename, pos.line, pos.column, n.source,
                               "the smallest float is about 5e-324: rescale the constants (or their units)")


def normalize(step) -> None:
    """Integers beyond 2**53 as float64s, in place: the statements, next states, outputs and the
    derived params' matrices."""
    step.assignments = [(y, as_floats(e)) for y, e in step.assignments]
    step.next_states = [as_floats(e) for e in step.next_states]
    step.outputs = [(name, as_floats(e)) for name, e in step.outputs]
    for d in step.matrix_exps:
        d.matrix = as_floats(d.matrix)


def _fits_float(c: sp.Number) -> bool:
    try:
        return math.isfinite(float(c))
    except (TypeError, OverflowError):
        return False


__all__ = ["check", "normalize", "as_floats", "exact_integer", "EXACT_INTEGERS"]
