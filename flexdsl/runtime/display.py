"""How compiled models and loaded modules show themselves in a notebook (`_repr_html_`,
`_repr_latex_`) and as LaTeX (`Compiled.latex()`): a registry of renderers by kind, which the
documentation package fills when it is imported (`flexdsl/docs/__init__.py`; `import flexdsl` imports
it). The runtime asks the registry and never imports the docs.

    display.register("html", lambda obj: "<div>...</div>")
    display.show("html", obj)        # the text, or None when no renderer is registered (no display)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_RENDERERS: dict[str, Callable[..., str]] = {}


def register(kind: str, render: Callable[..., str]) -> None:
    """Install the renderer of `kind`: "html" and "latex" (notebooks: `render(obj)`), "latex-source"
    (papers: `render(obj, part, environment)`)."""
    _RENDERERS[kind] = render


def show(kind: str, obj: Any, *args: Any) -> str | None:
    """What a notebook shows for `obj`, or None (it then falls back to the repr)."""
    render = _RENDERERS.get(kind)
    return render(obj, *args) if render is not None else None


def render(kind: str, obj: Any, *args: Any) -> str:
    """The text of `kind` for `obj`; an error that says what to install when nothing renders it."""
    text = show(kind, obj, *args)
    if text is None:
        raise RuntimeError(f"no {kind!r} renderer is registered: `import flexdsl.docs` registers them")
    return text


__all__ = ["register", "show", "render"]
