"""The packaged model library (`neurons/*.neuron`) and how a model argument is resolved."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ._paths import NEURONS_DIR
from .errors import FlexDSLError, did_you_mean


def library() -> list[str]:
    """Names (file stems) of the packaged models."""
    return sorted(p.stem for p in NEURONS_DIR.glob("*.neuron"))


def library_path(stem: str) -> Path:
    return NEURONS_DIR / f"{stem}.neuron"


_LAYER_TEXT = re.compile(r"\A\ufeff?(?:[ \t]*(?:#[^\n\r]*)?(?:\r\n|\r|\n))*[ \t]*layer[ \t]")


def is_layer_text(text: str) -> bool:
    """Whether model text is a layer (`layer NAME:` first, after comments and blank lines)."""
    return bool(_LAYER_TEXT.match(text))


_RULE_TEXT = re.compile(r"\A\ufeff?(?:[ \t]*(?:#[^\n\r]*)?(?:\r\n|\r|\n))*[ \t]*rule[ \t]")


def is_rule_text(text: str) -> bool:
    """Whether model text is a plasticity rule (`rule NAME:` first, after comments and blank lines)."""
    return bool(_RULE_TEXT.match(text))


def rules() -> list[str]:
    """Names (file stems) of the packaged plasticity rules (`neurons/*.rule`)."""
    return sorted(p.stem for p in NEURONS_DIR.glob("*.rule"))


def layers() -> list[str]:
    """Names (file stems) of the packaged layers (`neurons/*.layer`)."""
    return sorted(p.stem for p in NEURONS_DIR.glob("*.layer"))


def library_file(arg: str) -> Path | None:
    """The library rule or layer a command's argument names where no file has that name, as `flexdsl doc`
    takes them: `stdp_additive`, `stdp_additive.rule`, `rlif`, `rlif.layer` (also under `neurons/`); None for
    anything else (a file that exists, a library neuron model, a name of nothing: `resolve` says which)."""
    if looks_like_source(arg) or _is_file(Path(arg)):
        return None
    parts = Path(arg).parts
    if len(parts) == 2 and parts[0] == "neurons":
        parts = parts[1:]
    if len(parts) != 1 or arg.endswith(("/", "\\")):
        return None
    name = parts[0]
    if name.endswith((".rule", ".layer")):
        found = [NEURONS_DIR / name]
    elif name in library():
        return None
    else:
        found = [NEURONS_DIR / f"{name}.rule", NEURONS_DIR / f"{name}.layer"]
    return next((f for f in found if _is_file(f)), None)


def resolve_rule(model: str | Path) -> tuple[str, str]:
    """(text, filename) of a rule: its text, a path that exists, or a library rule (`stdp`,
    `stdp.rule`, `neurons/stdp.rule`); anything else is an error naming the closest library rules."""
    if isinstance(model, os.PathLike) and not isinstance(model, Path):
        model = os.fspath(model)
    if not isinstance(model, str | Path):
        raise FlexDSLError(f"a rule is a `.rule` file's path, a library rule's name or its text, not a "
                           f"{type(model).__name__}", "<rule>", hint="e.g. flexdsl.load_rule('stdp')")
    if isinstance(model, str) and looks_like_source(model):
        return model, "<string>"
    path = Path(model)
    if _is_file(path):
        return _read(path, model)
    parts = path.parts
    if len(parts) == 2 and parts[0] == "neurons":
        parts = parts[1:]
    name = parts[0][: -len(".rule")] if len(parts) == 1 and parts[0].endswith(".rule") else (
        parts[0] if len(parts) == 1 else None)
    if name and _is_file(NEURONS_DIR / f"{name}.rule"):
        lp = NEURONS_DIR / f"{name}.rule"
        return lp.read_text(encoding="utf-8"), str(lp)
    raise FlexDSLError(f"no rule file `{model}` and no library rule of that name", str(model),
                       hint=did_you_mean(name or str(model), rules()) or f"library rules: {', '.join(rules())}")


def _read(path: Path, model: str | Path) -> tuple[str, str]:
    """(text, filename) of a file that exists; a file that cannot be read is a FlexDSLError."""
    try:
        return path.read_text(encoding="utf-8"), str(model)
    except (OSError, UnicodeDecodeError) as e:
        raise FlexDSLError(f"cannot read `{model}`: {e}", str(model)) from None


def looks_like_source(arg: str) -> bool:
    """Model text rather than a path or a stem: text has line breaks (a model needs several
    lines; `loads` adds one to a single line). A file named `neuron lif.neuron` is a path."""
    return "\n" in arg or "\r" in arg


def not_a_model(value: object, what: str, text_only: bool = False) -> FlexDSLError:
    """The error for a model argument of another type than a path or text (`flexdsl.load(5)`)."""
    kind = type(value).__name__
    hint = ("give the model's text as a str" if text_only else
            "give a `.neuron` file's path, a library model's name (flexdsl.library() lists them) or the model's text")
    if isinstance(value, bytes | bytearray):
        hint = "decode it first: `.decode('utf-8')` (a model is UTF-8 text)"
    elif type(value).__name__ in ("NeuronModule", "RecurrentModule"):
        hint = "it is loaded already: use it as it is (copy.deepcopy(m) for a second one)"
    shown = "None" if value is None else f"a value of type {kind}"
    return FlexDSLError(f"the {what} must be {'text (a str)' if text_only else 'a path, a library model or text'}, "
                        f"not {shown}", f"<{what} argument>", hint=hint)


def _is_file(p: Path) -> bool:
    """Whether `p` is a file; False where the name cannot be one (too long, a NUL character)."""
    try:
        return p.is_file()
    except (OSError, ValueError):
        return False


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):
        return False


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
    """The library models, rules and layers closest to `name`: the model of that very name first."""
    names = library()
    if name in names:
        return f"did you mean the library model `{name}`?"
    return did_you_mean(name, [*names, *rules(), *layers()])


def library_list() -> str:
    """What the library holds, for a hint."""
    return f"library models: {', '.join(library())}; rules: {', '.join(rules())}; layers: {', '.join(layers())}"


def resolve(model: str | Path) -> tuple[str, str]:
    """(text, filename) for a path, a library model, or model text. One rule: a path that exists
    is that file; otherwise `X`, `X.neuron`, `neurons/X` and `neurons/X.neuron` are the library
    model X where it has one (a file of that name always wins); anything else is an error that
    names the closest library models."""
    if isinstance(model, os.PathLike) and not isinstance(model, Path):
        model = os.fspath(model)
    if not isinstance(model, str | Path):
        raise not_a_model(model, "model")
    if isinstance(model, Path):
        path = model
    else:
        if looks_like_source(model):
            return model, "<string>"
        path = Path(model)
    if _is_file(path):
        return _read(path, model)
    stem = str(model)
    p = Path(stem)
    if stem.endswith(".layer") and len(p.parts) <= 2 and p.parts[0] in (p.name, "neurons") \
            and _is_file(NEURONS_DIR / p.name):  # (a layer of the library)
        lp = NEURONS_DIR / p.name
        return lp.read_text(encoding="utf-8"), str(lp)
    name = None if _is_dir(p) else library_name(stem)
    if name is not None and _is_file(library_path(name)):
        lp = library_path(name)
        return lp.read_text(encoding="utf-8"), str(lp)
    slash = stem.endswith(("/", "\\"))
    is_dir = _is_dir(p)
    if name is None and (slash or is_dir or (str(p.parent) not in ("", ".") and not _is_dir(p.parent))):
        # a path, not a model name: say what is missing (and the library model of that name, if any)
        missing = p if slash or is_dir else p.parent
        lib = None if slash or is_dir or p.stem not in library() else library_hint(p.stem)
        raise FlexDSLError(f"no such directory: `{missing}/`" if not is_dir else
                           f"`{stem}` is a directory, not a model file", str(model),
                           hint=lib or "give a `.neuron` file, or a library model's name" + (
                               " (`flexdsl check` and `flexdsl doc` take directories)" if is_dir else ""))
    hint = library_hint(name or p.stem)
    if stem.endswith(".neuron"):
        exact = (name or p.stem) in library()
        raise FlexDSLError(f"no such file: `{model}`", str(model),
                           hint=hint if hint is None or exact else f"a library model? {hint}")
    if stem.lstrip().startswith("neuron "):
        hint = "model text has line breaks (flexdsl.loads takes the text of a model)"
    raise FlexDSLError(f"no such file or library model: `{model}`", str(model), hint=hint or library_list())
