"""The environment variables that tune flexdsl, read and checked in one place: a value outside
its range is a clear `FlexDSLError` naming the variable, never a raw value in generated code
or a launch (a negative block emits stores at negative offsets, a chunk of 0 divides by zero,
a huge one unrolls for ever)."""

from __future__ import annotations

import os

from .errors import FlexDSLError

# name -> (lowest, highest, power of two, what it is)
INTS: dict[str, tuple[int, int, bool, str]] = {
    "FLEXDSL_CHUNK": (1, 32, False, "the recompute plan's checkpoint interval (steps)"),
    "FLEXDSL_TRITON_BLOCK": (16, 16384, True, "lanes per program of the Triton kernels"),
    "FLEXDSL_TRITON_BLOCK_RC": (16, 16384, True, "lanes per program of the recompute backward"),
    "FLEXDSL_TRITON_WARPS": (1, 32, True, "warps per program of the Triton kernels"),
    "FLEXDSL_TRITON_WARPS_RC": (1, 32, True, "warps per program of the recompute backward"),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "FLEXDSL_TRITON_TRAINING": ("", "save", "recompute"),
    "FLEXDSL_TRITON_FAST_LAUNCH": ("", "0", "1"),
}


def env_int(name: str) -> int | None:
    """The checked integer value of `name`, or None when it is unset or empty."""
    lo, hi, pow2, what = INTS[name]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    want = f"{'a power of two' if pow2 else 'an integer'} from {lo} to {hi}"
    try:
        v = int(raw, 10) if raw.isascii() else None
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi or (pow2 and v & (v - 1)):
        raise FlexDSLError(f"the environment variable {name} ({what}) must be {want}, not {raw[:40]!r}",
                           "environment", hint=f"unset it for the default, or set e.g. {name}={lo if not pow2 else max(lo, 128)}")
    return v


def env_choice(name: str) -> str:
    """The checked value of `name` ("" when unset)."""
    raw = os.environ.get(name, "").strip()
    allowed = CHOICES[name]
    if raw not in allowed:
        shown = " or ".join(repr(a) for a in allowed if a)
        raise FlexDSLError(f"the environment variable {name} must be {shown}, not {raw[:40]!r}", "environment",
                           hint="unset it for the default")
    return raw


__all__ = ["env_int", "env_choice", "INTS", "CHOICES"]
