"""A disk cache for generated sources that survives processes.

Entries live under `$FLEXDSL_CACHE_DIR` (default `~/.cache/flexdsl`), one file per key, written
atomically. Keys hash the model text with the flexdsl compiler's own sources, so a change of
flexdsl (or of the triton/torch versions, for kernels) never reuses a stale entry. A cache that
cannot be written (read-only home) is skipped silently: it only saves time.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_PIPELINE = ("parse.py", "check.py", "catalog.py", "lower.py", "derive.py", "functions.py", "surrogates.py",
             "integrate.py", "printing.py", "emit_torch.py", "emit_triton.py", "evaluate.py")
_HASH: list[str] = []


def cache_dir(kind: str) -> Path:
    root = os.environ.get("FLEXDSL_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "flexdsl") / kind


def compiler_hash() -> str:
    """Hash of the flexdsl sources that shape generated code (and of the grammar)."""
    if not _HASH:
        here = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for f in _PIPELINE:
            p = here / f
            if p.exists():
                h.update(p.read_bytes())
        from ._paths import GRAMMAR_DIR

        g = GRAMMAR_DIR / "neuron.lark"
        if g.exists():
            h.update(g.read_bytes())
        _HASH.append(h.hexdigest())
    return _HASH[0]


def key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (*parts, compiler_hash()):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def read(kind: str, name: str) -> str | None:
    p = cache_dir(kind) / name
    try:
        return p.read_text(encoding="utf-8")
    except OSError:
        return None


def write(kind: str, name: str, text: str) -> Path | None:
    p = cache_dir(kind) / name
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    except OSError:
        return None
    return p
