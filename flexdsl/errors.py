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
        self.source_line = ""
        if source is not None and line >= 1:
            lines = source.split("\n")  # lines as the parser counts them (str.splitlines also splits at \f, \x85...)
            if line <= len(lines):
                self.source_line = "".join(ch if ch.isprintable() else " " for ch in lines[line - 1].expandtabs(1))
        super().__init__(self.format())

    def format(self) -> str:
        where = f"{self.filename}:{self.line}:{self.column}" if self.line else self.filename
        out = [printable(f"{where}: error: {self.reason}")]
        if self.source_line:
            out.append(self.source_line)
            out.append(" " * max(self.column - 1, 0) + "^")
        if self.hint:
            out.append(printable(f"hint: {self.hint}"))
        return "\n".join(out)


# control characters (C0 but tab, newline and form feed; DEL; C1) written as escapes: a file name or
# any other text from outside never reaches a terminal as an escape sequence (`\x1b[2J`)
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in (0x09, 0x0A, 0x0C)}


def printable(text: str) -> str:
    """`text` with its control characters escaped (`\\x1b`), newlines and tabs kept."""
    return text.translate(_ESCAPES)


def did_you_mean(name: str, known: Iterable[str]) -> str | None:
    """A "did you mean `x`?" hint from the closest known names, or None: the same name in
    another case first (`dV/dt` for a state `v`, `Lif` for `lif`), then the same letters in
    another order (`lfi` for `lif`: one transposition), then the closest spellings."""
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
