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


def library_name(arg: str) -> str | None:
    """The library model a missing path names: `X`, `X.neuron`, `neurons/X` and
    `neurons/X.neuron` (the library's own folder, as the docs and the source tree write it) name
    the model X; any other path names none."""
    parts = Path(arg).parts
    if len(parts) == 2 and parts[0] == "neurons":
        parts = parts[1:]
    if len(parts) != 1 or arg.endswith(("/", "\\")):
        return None
    name = parts[0][: -len(".neuron")] if parts[0].endswith(".neuron") else parts[0]
    return name or None


def library_hint(name: str) -> str | None:
    """The library models closest to `name`: the model of that very name first."""
    names = library()
    if name in names:
        return f"did you mean the library model `{name}`?"
    return did_you_mean(name, names)


def resolve(model: str | Path) -> tuple[str, str]:
    """(text, filename) for a path, a library model, or model text. One rule: a path that exists
    is that file; otherwise `X`, `X.neuron`, `neurons/X` and `neurons/X.neuron` are the library
    model X where it has one (a file of that name always wins); anything else is an error that
    names the closest library models."""
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
    p = Path(stem)
    name = None if p.is_dir() else library_name(stem)
    if name is not None and library_path(name).is_file():
        lp = library_path(name)
        return lp.read_text(encoding="utf-8"), str(lp)
    slash = stem.endswith(("/", "\\"))
    if name is None and (slash or p.is_dir() or (str(p.parent) not in ("", ".") and not p.parent.is_dir())):
        # a path, not a model name: say what is missing (and the library model of that name, if any)
        missing = p if slash or p.is_dir() else p.parent
        lib = None if slash or p.is_dir() or p.stem not in library() else library_hint(p.stem)
        raise FlexDSLError(f"no such directory: `{missing}/`" if not p.is_dir() else
                           f"`{stem}` is a directory, not a model file", str(model),
                           hint=lib or "give a `.neuron` file, or a library model's name" + (
                               " (`flexdsl check` and `flexdsl doc` take directories)" if p.is_dir() else ""))
    hint = library_hint(name or p.stem)
    if stem.endswith(".neuron"):
        exact = (name or p.stem) in library()
        raise FlexDSLError(f"no such file: `{model}`", str(model),
                           hint=hint if hint is None or exact else f"a library model? {hint}")
    raise FlexDSLError(f"no such file or library model: `{model}`", str(model),
                       hint=hint or "library models: " + ", ".join(library()))
