"""HTML pages: one per model (jinja2 templates with autoescaping: user text — docstrings,
descriptions, file names — always reaches the page as text), the index, and the notebook
fragment. Math is MathML (no script, no network); plots are PNGs beside the page or embedded."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from .content import ModelDoc

if TYPE_CHECKING:
    import jinja2

    from .figures import Figures

TEMPLATES = Path(__file__).resolve().parent / "templates"
SOURCE_TITLES = {"torch": "PyTorch core (backend=\"torch\")", "triton": "Triton kernels (backend=\"triton\")"}


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def file_label(d: ModelDoc) -> str:
    if d.library:
        return Path(d.filename).name
    return d.filename if d.filename != "<string>" else "(model text)"


def usage(d: ModelDoc) -> str:
    if d.library:
        target = repr(d.stem)
        cli = d.stem
    elif d.filename == "<string>":
        return "m = flexdsl.loads(text)          # a trainable torch.nn.Module"
    else:
        target = repr(d.filename)
        cli = shlex.quote(d.filename)
    return (f"import flexdsl\nm = flexdsl.load({target})   # a trainable torch.nn.Module\n\n"
            f"$ flexdsl run {cli} --T 200 --input step:1.5@20 --plot out.png")


def _context(d: ModelDoc, fig: Figures | None, **extra: object) -> dict[str, object]:
    from .._version import __version__

    rows = [*d.inputs, *d.params, *d.states]
    return {"d": d, "fig": fig, "version": __version__, "file_label": file_label(d), "usage": usage(d),
            "source_titles": SOURCE_TITLES, "has_guessed_units": any(r.unit and not r.unit_declared for r in rows),
            **extra}


def page(d: ModelDoc, fig: Figures | None = None, index_link: str | None = None,
         reference_link: str | None = None) -> str:
    """A complete HTML page."""
    return environment().get_template("page.html.j2").render(
        _context(d, fig, index_link=index_link, reference_link=reference_link))


def fragment(d: ModelDoc, fig: Figures | None = None) -> str:
    """The page's content as an HTML fragment (notebooks)."""
    return environment().get_template("fragment.html.j2").render(_context(d, fig))


@dataclass
class IndexEntry:
    name: str
    file_label: str
    summary: str
    html: str
    markdown: str
    thumbnail: str | None
    kind: str
    method: str | None


@dataclass
class Failure:
    label: str
    error: str


def index(entries: Sequence[IndexEntry], failed: Sequence[Failure] = (), title: str = "flexdsl models",
          reference_link: str | None = None) -> str:
    from .._version import __version__

    return environment().get_template("index.html.j2").render(
        entries=entries, failed=failed, title=title, version=__version__, reference_link=reference_link)


__all__ = ["page", "fragment", "index", "IndexEntry", "Failure", "usage", "file_label"]
