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
    "FLEXDSL_RECURRENT_BK": (16, 256, True, "the K block of the recurrent layers' products"),
    "FLEXDSL_RECURRENT_WARPS": (1, 16, True, "warps per program of the recurrent layers' kernels"),
    "FLEXDSL_RECURRENT_STAGES": (1, 8, False, "the pipelining depth of the recurrent layers' kernels"),
    "FLEXDSL_RECURRENT_PROGRAMS": (1, 1 << 16, False, "programs of the recurrent layers' kernels (at most one per "
                                                      "multiprocessor)"),
    "FLEXDSL_PRODUCT_WARPS": (1, 16, True, "warps per program of the recurrent layers' fused input product"),
    "FLEXDSL_PRODUCT_STAGES": (1, 8, False, "the pipelining depth of the recurrent layers' fused input product"),
    "FLEXDSL_PLASTIC_BM": (16, 256, True, "postsynaptic neurons per program of the online plastic kernel"),
    "FLEXDSL_PLASTIC_BN": (16, 512, True, "presynaptic neurons per block of the online plastic kernel"),
    "FLEXDSL_PLASTIC_SPLIT": (1, 1024, False, "programs per row block of the online plastic kernel"),
    "FLEXDSL_PLASTIC_WARPS": (1, 16, True, "warps per program of the online plastic kernel"),
    "FLEXDSL_PLASTIC_STAGES": (1, 8, False, "the pipelining depth of the online plastic kernel"),
    "FLEXDSL_CPU_BUILD_TIMEOUT": (1, 86400, False, "seconds a build of the CPU kernels may take"),
    "FLEXDSL_SPARSE_BH": (16, 1024, True, "postsynaptic neurons per program of the sparse-input kernels"),
    "FLEXDSL_SPARSE_BJ": (1, 256, True, "nonzero inputs gathered at once by the sparse-input kernels"),
    "FLEXDSL_BITS_CHUNK_MB": (1, 1 << 20, False, "MiB of a product's input kept as bits that its weight gradient "
                                                 "unpacks at once"),
}
# name -> (default, what it is): fractions in [0, 1]
FRACTIONS: dict[str, tuple[float, str]] = {
    "FLEXDSL_SPARSE_DENSITY": (0.05, "the largest fraction of nonzero inputs a layer with sparse_input=True takes "
                                     "the sparse product at"),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "FLEXDSL_TRITON_TRAINING": ("", "save", "recompute"),
    "FLEXDSL_TRITON_FAST_LAUNCH": ("", "0", "1"),
    "FLEXDSL_TRITON_INDUCTOR": ("", "0", "1"),
    "FLEXDSL_RECURRENT_PRODUCTS": ("", "bf16", "fp32"),
    "FLEXDSL_RECURRENT_GRAPHS": ("", "0", "1"),
    "FLEXDSL_RECURRENT_FIXED": ("", "0", "1"),
    "FLEXDSL_RECURRENT_RESIDENT": ("", "0", "1"),
    "FLEXDSL_EPROP_COMPILE": ("", "0", "1"),
    "FLEXDSL_PLASTIC_FUSED": ("", "0", "1"),
    "FLEXDSL_SPARSE_FUSED": ("", "0", "1"),
    "FLEXDSL_PLASTIC_PRECISION": ("", "tf32x3", "ieee", "tf32"),
}


def env_tile(name: str) -> tuple[int, int, int] | None:
    """`BMxBNxBK` (each a power of two from 16 to 256), checked; None when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    parts = raw.lower().split("x")
    vals = [int(p) for p in parts if p.isascii() and p.isdigit()] if len(parts) == 3 else []
    if len(vals) != 3 or any(v < 16 or v > 256 or v & (v - 1) for v in vals):
        raise FlexDSLError(f"the environment variable {name} must be BMxBNxBK, each a power of two from 16 to 256, "
                           f"not {raw[:40]!r}", "environment", hint=f"unset it for the default, or set e.g. {name}=64x32x64")
    return vals[0], vals[1], vals[2]


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


def env_fraction(name: str) -> float:
    """The checked value of `name`, a fraction in [0, 1] (its default when unset or empty)."""
    default, what = FRACTIONS[name]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = float(raw) if raw.isascii() else None
    except ValueError:
        v = None
    if v is None or not 0.0 <= v <= 1.0:
        raise FlexDSLError(f"the environment variable {name} ({what}) must be a fraction from 0 to 1, not "
                           f"{raw[:40]!r}", "environment", hint=f"unset it for the default ({default}), or set e.g. "
                           f"{name}={default}")
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


__all__ = ["env_int", "env_choice", "env_fraction", "env_tile", "INTS", "CHOICES", "FRACTIONS"]
