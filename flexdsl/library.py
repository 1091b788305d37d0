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
    p = Path(stem)
    if stem.endswith(("/", "\\")) or p.is_dir() or (str(p.parent) not in ("", ".") and not p.parent.is_dir()):
        # a path, not a model name: say what is missing, not which library models exist
        missing = p if stem.endswith(("/", "\\")) or p.is_dir() else p.parent
        what = "is a directory, not a model file"
        raise FlexDSLError(f"no such directory: `{missing}/`" if not p.is_dir() else f"`{stem}` {what}", str(model),
                           hint="give a `.neuron` file, or a library model's name" + (
                               " (`flexdsl check` and `flexdsl doc` take directories)" if p.is_dir() else ""))
    hint = did_you_mean(p.stem, library())
    if stem.endswith(".neuron"):
        raise FlexDSLError(f"no such file: `{model}`", str(model), hint=hint and f"a library model? {hint}")
    raise FlexDSLError(f"no such file or library model: `{model}`", str(model),
                       hint=hint or "library models: " + ", ".join(library()))
