"""The packaged model library (`neurons/*.neuron`) and how a model argument is resolved."""

from __future__ import annotations

from pathlib import Path

from ._paths import NEURONS_DIR
from .errors import FlexDSLError, did_you_mean


def library() -> list[str]:
    """Names (file stems) of the packaged models."""
    return sorted(p.stem for p in NEURONS_DIR.glob("*.neuron"))


def library_path(stem: str) -> Path:
    return NEURONS_DIR / f"{stem}.neuron"


def looks_like_source(arg: str) -> bool:
    """Model text rather than a path or a stem: text has line breaks (a model needs several
    lines; `loads` adds one to a single line). A file named `neuron lif.neuron` is a path."""
    return "\n" in arg or "\r" in arg


def resolve(model: str | Path) -> tuple[str, str]:
    """(text, filename) for a path, a library stem, or model text."""
    if isinstance(model, Path):
        path = model
    else:
        if looks_like_source(model):
            return model, "<string>"
        path = Path(model)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), str(model)
        except (OSError, UnicodeDecodeError) as e:
            raise FlexDSLError(f"cannot read `{model}`: {e}", str(model)) from None
    stem = str(model)
    if "/" not in stem and not stem.endswith(".neuron") and library_path(stem).is_file():
        p = library_path(stem)
        return p.read_text(encoding="utf-8"), str(p)
    hint = did_you_mean(Path(stem).stem, library())
    raise FlexDSLError(f"no such file or library model: `{model}`", str(model),
                       hint=hint or "library models: " + ", ".join(library()))
