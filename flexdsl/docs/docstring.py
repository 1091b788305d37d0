"""A model's docstring, split for its page: the summary (the first sentence, wrapped over lines or
not), the paragraphs and indented runs (hand-written equations) that follow, and the reference."""

from __future__ import annotations

import inspect
import re

_ABBREV = r"(?<!\be\.g)(?<!\bi\.e)(?<!\bcf)(?<!\bvs)(?<!\bal)(?<!\bFig)(?<!\bEq)(?<!\bapprox)"
_SENTENCE_END = re.compile(_ABBREV + r"[.!?:]$")
_FIRST_SENTENCE = re.compile(r"(.+?" + _ABBREV + r"[.!?])\s+([A-Z(\"'].*)$")


def split_doc(doc: str) -> tuple[str, list[tuple[str, str]], str]:
    """(summary, blocks, reference) of a docstring: the first sentence (wrapped over lines or
    not); the rest as paragraphs
    ("p") and indented runs ("pre", e.g. hand-written equations); the paragraph(s) starting
    with "Reference:" apart."""
    text = inspect.cleandoc(doc or "")
    if not text:
        return "", [], ""
    first, _, rest = text.partition("\n")
    # a summary wrapped over several lines: the first sentence of the first paragraph
    lines = text.splitlines()
    n = 1
    while n < len(lines) and lines[n].strip() and not lines[n][:1].isspace() and not _SENTENCE_END.search(first):
        first = f"{first} {lines[n].strip()}"
        n += 1
    m = _FIRST_SENTENCE.match(first)
    head = ""
    if m is not None and not re.match(r"\s*References?\s*:", first):
        first, head = m.group(1), m.group(2)
    rest = "\n".join(lines[n:])
    if head:
        rest = head + "\n" + rest if rest.strip() and not rest.startswith("\n") else head + "\n" + rest
    blocks: list[tuple[str, str]] = []
    refs: list[str] = []
    for para in re.split(r"\n\s*\n", rest.strip("\n")):
        if not para.strip():
            continue
        if re.match(r"\s*References?\s*:", para):
            refs.append(re.sub(r"^\s*References?\s*:\s*", "", para))
            continue
        run: list[str] = []
        kind = None
        for ln in para.splitlines():
            k = "pre" if ln[:1].isspace() else "p"
            if kind is not None and k != kind:
                blocks.append((kind, _join(kind, run)))
                run = []
            kind = k
            run.append(ln)
        if run and kind is not None:
            blocks.append((kind, _join(kind, run)))
    return first.strip(), blocks, "\n\n".join(" ".join(r.split()) for r in refs)


def _join(kind: str, lines: list[str]) -> str:
    if kind == "pre":
        return inspect.cleandoc("\n".join(lines)) if len(lines) > 1 else lines[0].strip()
    return " ".join(" ".join(ln.split()) for ln in lines)


__all__ = ["split_doc"]
