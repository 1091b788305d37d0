"""The one naming scheme of generated code, shared by every printer and the Triton ABI.

Model names (`[A-Za-z][A-Za-z0-9_]*`, never starting with `_`) and the lowering's SSA names
are printed as written, except those that generated code needs for itself (Python's
builtins, the modules it imports): those are printed as `_u__<name>`. Every name that
generated code makes from a model name is tagged with a role, `_<role>__<name>` (`tagged`), the
role made of lowercase letters and digits (no `_`, so the first `__` ends it); internal names
without a model name (`_offs`, `_mask`, `_t0`, ...) start with `_` and contain no `__`. So no
model name can collide with another, with a tagged name, or with anything generated code
defines or imports.
"""

from __future__ import annotations

import builtins
import keyword
import re

# Module-level names that generated sources define or import (torch core, Triton kernels, host code).
GENERATED_GLOBALS = frozenset({
    "torch", "ops", "tl", "triton", "math", "libdevice", "os", "core", "surrogate", "invariants",
    "core_backward", "fwd_kernel", "bwd_kernel", "host_invariants",
})

RESERVED = frozenset(set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist) | GENERATED_GLOBALS)

_ROLE = re.compile(r"^[a-z][a-z0-9]*$")


def ident(name: str) -> str:
    """The identifier that generated code uses for a model or SSA name."""
    return f"_u__{name}" if name in RESERVED else name


def tagged(role: str, name: str) -> str:
    """The identifier of something generated code makes from a name, tagged with its role (a
    pointer `_ptr__x`, a flag...)."""
    assert _ROLE.match(role), role
    return f"_{role}__{ident(name)}"


def module_ident(text: str, limit: int = 40) -> str:
    """A short identifier from free text (a model's name in a file or module name)."""
    s = "".join(ch if ch.isascii() and ch.isalnum() else "_" for ch in text.lower())[:limit]
    return s or "model"
