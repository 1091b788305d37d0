"""The user guides that ship with flexdsl (the language reference, units, NIR) as HTML pages of
a generated site, beside their Markdown.

Markdown is rendered with markdown-it-py (CommonMark and tables; raw HTML in the text stays
text). Headings get GitHub's anchors, so the guides' `#1-a-first-model` links work; links to
another guide (`units.md#2-refractoriness`) point to its HTML page. HTML comments on lines of their
own (the `<!-- BEGIN GENERATED: … -->` markers of `reference.py`) are not part of the text and are
dropped (outside code blocks), so they neither show nor join a table above them. The formulas of the
generated tables (`$…$`, LaTeX written by `reference.py`) are shown as MathML from the same
sympy expressions, so a page needs no script and no network, like the model pages; so is the
display math written by hand (`$$…$$`, `texmathml.py`), taken out of the text before the Markdown
is parsed (whose escapes would eat its `\\,` and `\\;`).
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path

from .._paths import DOCS_DIR

GUIDES = {"language.md": "The flexdsl language reference", "units.md": "Units, refractoriness and threshold crossings",
          "nir.md": "NIR: to and from other SNN libraries"}
_MATH = re.compile(r"\$([^$\n]+)\$")
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_SPAN = re.compile(r"(`+)(?:.|\n)*?(?<!`)\1(?!`)")
_LINK = re.compile(r"^([A-Za-z0-9_.-]+)\.md(#[^\s]*)?$")
_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def drop_comments(markdown: str) -> str:
    """The Markdown without its whole-line HTML comments (code blocks kept as they are): each
    becomes an empty line, which also ends a table right above it."""
    out: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        m, s = _FENCE.match(line), line.strip()
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and set(s) == {fence[0]} and len(s) >= len(fence):  # (a closing fence)
            fence = None
        out.append("" if fence is None and _COMMENT.match(line) else line)
    return "\n".join(out)


def _outside_code(markdown: str, f: Callable[[str], str]) -> str:
    """`f` applied to the text outside code (fenced blocks and `spans` kept as they are)."""
    def text(s: str) -> str:
        out, at = [], 0
        for m in _SPAN.finditer(s):
            out += [f(s[at:m.start()]), m.group(0)]
            at = m.end()
        return "".join(out) + f(s[at:])

    out: list[str] = []
    chunk: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        m, s = _FENCE.match(line), line.strip()
        if fence is None and m:
            out.append(text("\n".join(chunk)))
            chunk, fence = [], m.group(1)
            out.append(line)
        elif fence is not None:
            fence = None if set(s) == {fence[0]} and len(s) >= len(fence) else fence
            out.append(line)
        else:
            chunk.append(line)
    out.append(text("\n".join(chunk)))
    return "\n".join(out)


def slug(text: str, taken: dict[str, int]) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens; a
    repeated one gets -1, -2, ..."""
    s = "".join(ch for ch in text.strip().lower() if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    s = s.replace(" ", "-")
    n = taken.get(s, 0)
    taken[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


@lru_cache(maxsize=1)
def formulas() -> dict[str, str]:
    """LaTeX → MathML of every formula the generated tables of the reference hold."""
    from ..frontend.catalog import SURROGATES
    from .reference import surrogate_latex, surrogate_mathml

    return {surrogate_latex(name): surrogate_mathml(name) for name in SURROGATES}


def to_html(markdown: str, math: Mapping[str, str] | None = None, guides: Mapping[str, str] = GUIDES) -> str:
    """A guide's Markdown as an HTML fragment (see the module doc)."""
    from markdown_it import MarkdownIt

    math = formulas() if math is None else math
    found: list[str] = []

    def hold(m: re.Match[str]) -> str:
        tex = m.group(1)
        if tex not in math:
            return m.group(0)
        found.append(math[tex])
        return f"FLEXDSLMATH{len(found) - 1}X"

    def hold_display(m: re.Match[str]) -> str:
        from .texmathml import to_mathml

        try:
            found.append(to_mathml(m.group(1)))
        except ValueError:  # (LaTeX outside what texmathml converts: shown as written, backslashes kept)
            found.append(f'<code class="tex">{html.escape(m.group(0))}</code>')
        return f"FLEXDSLMATH{len(found) - 1}X"

    text = _outside_code(drop_comments(markdown), lambda s: _MATH.sub(hold, _DISPLAY.sub(hold_display, s)))
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    taken: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            inline = tokens[i + 1]
            tok.attrSet("id", slug("".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline")),
                                   taken))
        for child in tok.children or []:
            if child.type == "link_open":
                href = str(child.attrGet("href") or "")
                m = _LINK.match(href)
                if m and f"{m.group(1)}.md" in guides:
                    child.attrSet("href", f"{m.group(1)}.html{m.group(2) or ''}")
    out = md.renderer.render(tokens, md.options, {})
    return re.sub(r"FLEXDSLMATH(\d+)X", lambda m: found[int(m.group(1))], out)


def render(name: str, index_link: str | None = "index.html") -> str:
    """The HTML page of a guide (`language.md`, `units.md`, `nir.md`)."""
    from .htmlpage import environment, version

    body = to_html((DOCS_DIR / name).read_text(encoding="utf-8"))
    return environment().get_template("guide.html.j2").render(
        title=GUIDES.get(name, name), body=body, version=version(), index_link=index_link,
        guides=[(f"{Path(g).stem}.html", t) for g, t in GUIDES.items()], source=name)


def available() -> list[str]:
    """The guides that ship with this installation."""
    return [g for g in GUIDES if (DOCS_DIR / g).is_file()]


__all__ = ["GUIDES", "to_html", "render", "slug", "available", "formulas", "drop_comments"]
