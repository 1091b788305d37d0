"""FlexDSLError: every user error, located (file:line:col, the line, a caret, a hint)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FlexDSLError(ValueError):
    """A problem in a `.neuron` model (or in the options it was loaded with).

    The message starts with ``FILE:LINE:COL: error: ...``, shows the offending source
    line with a caret under the column, and ends with a hint where one helps.
    """

    def __init__(
        self,
        message: str,
        filename: str = "<string>",
        line: int = 0,
        column: int = 0,
        source: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.reason = message
        self.filename = filename
        self.line = line
        self.column = column
        self.hint = hint
        self.source_line = ""  # the line shown (a window around the column where the line is long)
        self.caret = column  # the caret's column in `source_line`
        if source is not None and line >= 1:
            lines = source_lines(source)
            if line <= len(lines):
                self.source_line, self.caret = _window(lines[line - 1], column)
        super().__init__(self.format())

    def format(self) -> str:
        name = clip(self.filename, 160)
        where = f"{name}:{self.line}:{self.column}" if self.line else name
        out = [printable(f"{where}: error: {_clip_lines(self.reason)}")]
        if self.source_line:
            out.append(self.source_line)
            out.append(" " * max(self.caret - 1, 0) + "^")
        if self.hint:
            out.append(printable(f"hint: {_clip_lines(self.hint)}"))
        return "\n".join(out)


# ---------------------------------------------------------------------------------- lines
# The one rule for a model text's lines, which the parser, errors, generated code and the docs share:
# a text's lines are split at `\n` only (`parse.normalize` makes every `\r\n` and lone `\r` one).
# `str.splitlines` also splits at these, which the language allows inside comments, strings and
# docstrings: they never start a line, and an error message shows them escaped.
LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
WINDOW = 120  # characters of a long source line shown around the column


def source_lines(source: str) -> list[str]:
    """The text's lines as the parser counts them: split at `\n` only."""
    return source.split("\n")


def line_col(source: str, index: int) -> tuple[int, int]:
    """The (line, column) of the character at `index`, both from 1, as the parser counts them."""
    return source.count("\n", 0, index) + 1, index - (source.rfind("\n", 0, index) + 1) + 1


def _window(text: str, column: int) -> tuple[str, int]:
    """A source line as shown under an error (unprintable characters as spaces, tabs as one
    space: one character per column) and the caret's column in it; a long line is cut to a window
    around the column, marked `...` where cut."""
    start = max(0, min(column - 1 - WINDOW // 2, len(text) - WINDOW))
    shown = "".join(ch if ch.isprintable() else " " for ch in text[start:start + WINDOW].expandtabs(1))
    head = "..." if start > 0 else ""
    tail = "..." if start + WINDOW < len(text) else ""
    return head + shown + tail, column - start + len(head)


def clip(text: str, limit: int) -> str:
    """`text`, its middle cut (` ... `) where it is longer than `limit` characters."""
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep]} ... {text[-keep:]}"


def _clip_lines(text: str, limit: int = 400) -> str:
    return "\n".join(clip(line, limit) for line in text.split("\n"))


# control characters (C0 but tab and newline; DEL; C1) and the other line breaks written as escapes: a
# file name or any other text from outside never reaches a terminal as an escape sequence (`\x1b[2J`),
# and a message's lines are its own (`str.splitlines` of a message gives its header, line and caret)
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in (0x09, 0x0A)}
_ESCAPES |= {ord(c): f"\\u{ord(c):04x}" for c in LINE_BREAKS if ord(c) > 0xFF}


def printable(text: str) -> str:
    """`text` with its control characters and line breaks but `\\n` escaped (`\\x1b`, `\\u2028`),
    newlines and tabs kept."""
    return text.translate(_ESCAPES)


def did_you_mean(name: str, known: Iterable[str]) -> str | None:
    """A "did you mean `x`?" hint from the closest known names, or None: the same name in
    another case first (`dV/dt` for a state `v`, `Lif` for `lif`), then the same letters in
    another order (`lfi` for `lif`: one transposition), then the closest spellings."""
    if len(name) > 200:  # (no name is that long: nothing is close, and comparing would take long)
        return None
    names = sorted(set(known))
    lower = {k.lower(): k for k in names}
    same = [k for k in names if k.lower() == name.lower() and k != name]
    same += [k for k in names if sorted(k.lower()) == sorted(name.lower()) and k.lower() != name.lower()]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    close += [lower[c] for c in difflib.get_close_matches(name.lower(), list(lower), n=3, cutoff=0.6)]
    close = [k for k in dict.fromkeys(same + close) if k != name][:3]
    if not close:
        return None
    return "did you mean " + " or ".join(f"`{c}`" for c in close) + "?"
