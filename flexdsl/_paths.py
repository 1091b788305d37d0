"""Where the grammar, the model library and the user documentation live (installed wheel or
source checkout)."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _first_existing(*candidates: Path) -> Path:
    for c in candidates:
        if c.is_dir():
            return c
    return candidates[0]


GRAMMAR_DIR = _first_existing(_PKG / "grammar", _PKG.parent / "grammar")
NEURONS_DIR = _first_existing(_PKG / "neurons", _PKG.parent / "neurons")
# the user documentation (`docs/` of the source, `flexdsl/manual/` of a wheel): language.md, ...
DOCS_DIR = _first_existing(_PKG / "manual", _PKG.parent / "docs")
LANGUAGE_REFERENCE = DOCS_DIR / "language.md"
