"""HTML pages: one per model (jinja2 templates with autoescaping: user text — docstrings,
descriptions, file names — always reaches the page as text), the index, and the notebook
fragment. Math is MathML (no script, no network); plots are PNGs beside the page or embedded."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from .content import ModelDoc, derived_note, source_titles

if TYPE_CHECKING:
    import jinja2

    from .figures import Figures

TEMPLATES = Path(__file__).resolve().parent / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["spans"] = code_spans
    env.filters["num"] = number
    return env


_CODE = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def code_spans(text: str) -> list[tuple[str, str]]:
    """Text with Markdown-style `code` spans (as docstrings write them) as ("text" | "code", part)
    pieces; an unmatched backtick stays text."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _CODE.finditer(text):
        if m.start() > pos:
            out.append(("text", text[pos:m.start()]))
        out.append(("code", m.group(2).strip() or m.group(2)))
        pos = m.end()
    if pos < len(text):
        out.append(("text", text[pos:]))
    return out


def number(v: float) -> str:
    """A value for a page: six significant digits, a real minus sign."""
    return f"{v:.6g}".replace("-", "\u2212")


def version() -> str:
    """flexdsl's version, for the pages' footers."""
    from .._version import __version__

    return __version__


def file_label(d: ModelDoc) -> str:
    if d.library:
        return Path(d.filename).name
    return d.filename if d.filename != "<string>" else "(model text)"


def usage(d: ModelDoc, fig: Figures | None = None) -> str:
    """How to load the model, and (with figures) the `flexdsl run` command of the step response
    shown on the page: chosen from the model's own f–I scan, so it spikes; its amplitude is in the
    input's unit."""
    if d.library:
        target = repr(d.stem)
        cli = d.stem
    elif d.filename == "<string>":
        args = f", {d.options.python_args()}" if d.options else ""
        return f"m = flexdsl.loads(text{args})          # a trainable torch.nn.Module"
    else:
        target = repr(d.filename)
        cli = shlex.quote(d.filename)
    opts = d.options
    args = f", {opts.python_args()}" if opts else ""
    out = f"import flexdsl\nm = flexdsl.load({target}{args})   # a trainable torch.nn.Module"
    run = fig.run if fig is not None else None
    if run is not None:
        out += (f"\n\n# the step response shown below: {run.comment()}\n"
                f"$ flexdsl run {cli}{' ' + opts.cli_args() if opts else ''} --T {run.T} --input {run.spec} "
                "--plot out.png")
    return out


def _context(d: ModelDoc, fig: Figures | None, **extra: object) -> dict[str, object]:
    from .._version import __version__

    rows = [*d.inputs, *d.params, *d.states]
    return {"d": d, "fig": fig, "version": __version__, "file_label": file_label(d), "usage": usage(d, fig),
            "derived_note": derived_note(d),
            "source_titles": source_titles(), "has_guessed_units": any(r.unit and not r.unit_declared for r in rows),
            **extra}


def page(d: ModelDoc, fig: Figures | None = None, index_link: str | None = None,
         reference_link: str | None = None) -> str:
    """A complete HTML page."""
    return environment().get_template("page.html.j2").render(
        _context(d, fig, index_link=index_link, reference_link=reference_link, compact=False))


def fragment(d: ModelDoc, fig: Figures | None = None) -> str:
    """The page's content as an HTML fragment for a notebook: compact, each section collapsible
    (the equations as written open, the rest closed)."""
    return environment().get_template("fragment.html.j2").render(_context(d, fig, compact=True))


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
    thumbnail_alt: str = "response to a step input"  # what the thumbnail shows (a rule's: its window)


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
