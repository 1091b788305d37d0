"""Units of declarations, for the docs' tables and time axes.

A declaration's unit is `decl.meta["unit"]` where the language gives one; otherwise the docs
read it from the description's trailing parentheses when that looks like a unit ("membrane
potential (mV)" → "mV"; "(voltage units)" is prose, not a unit).
"""

from __future__ import annotations

import re
from typing import Any

# seconds per unit, for the time axes and the f–I rates
TIME_UNITS: dict[str, float] = {
    "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "msec": 1e-3, "msecond": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3,
    "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "usecond": 1e-6, "microsecond": 1e-6, "microseconds": 1e-6,
    "ns": 1e-9, "nsecond": 1e-9, "nanosecond": 1e-9, "nanoseconds": 1e-9,
    "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
}
_WORDS = {"steps", "step", "dimensionless", "ohm", "kohm", "Mohm", "Hz", "kHz", "volt", "amp", "siemens",
          "farad", "mvolt", "uvolt", "namp", "pamp", "nsiemens", "pfarad", *TIME_UNITS}
_UNIT_CHARS = re.compile(r"[A-Za-z0-9\u00b5\u03bc\u03a9/^*().\u00b7 +-]+")


def trailing_parenthesized(text: str) -> str | None:
    """The content of the balanced parentheses that end `text`, or None."""
    t = text.rstrip()
    if not t.endswith(")"):
        return None
    depth = 0
    for i in range(len(t) - 1, -1, -1):
        if t[i] == ")":
            depth += 1
        elif t[i] == "(":
            depth -= 1
            if depth == 0:
                return t[i + 1:-1].strip()
    return None


def looks_like_unit(s: str) -> bool:
    """A short unit expression (`mV`, `1/ms`, `uA/cm^2`, `1/(mV ms)`, `steps`), not prose."""
    if not s or len(s) > 24 or not _UNIT_CHARS.fullmatch(s):
        return False
    words = re.findall(r"[A-Za-z\u00b5\u03bc\u03a9]+", s)
    return all(len(w) <= 4 or w in _WORDS for w in words)


def unit_of(decl: Any) -> str | None:
    """The unit of an input, param or state: its `meta["unit"]`, else one read from its description."""
    meta = getattr(decl, "meta", None) or {}
    u = meta.get("unit")
    if u:
        return str(u)
    inner = trailing_parenthesized(getattr(decl, "doc", "") or "")
    return inner if inner is not None and looks_like_unit(inner) else None


_SUPERSCRIPT = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")


def display(unit: str | None) -> str | None:
    """A unit as a page shows it: `uA/cm**2` → µA/cm², `Mohm` → MΩ, `1/ms` stays."""
    if not unit:
        return unit
    out = re.sub(r"(?:\*\*|\^)\(?(-?\d+)\)?", lambda m: m.group(1).translate(_SUPERSCRIPT), unit)
    out = re.sub(r"(?<![A-Za-z])u(?=[A-Za-z])", "\u00b5", out)
    return re.sub(r"[oO]hm", "\u03a9", out)


def unit_label(decl: Any) -> str | None:
    """The unit of a declaration, for display."""
    return display(unit_of(decl))


def declared_unit(decl: Any) -> bool:
    """Whether the unit comes from the language (not read from the description)."""
    return bool((getattr(decl, "meta", None) or {}).get("unit"))


__all__ = ["TIME_UNITS", "unit_of", "unit_label", "display", "declared_unit", "looks_like_unit", "trailing_parenthesized"]
