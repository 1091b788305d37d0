"""A model's equations as LaTeX, for papers (`Compiled.latex()`) and notebooks (`_repr_latex_`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .content import Statement, describe, tex_op
from .printing import tex_text

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled

PARTS = ("equations", "step", "backward")
ENVIRONMENTS = ("align*", "aligned")


def _row(s: Statement, tag: str = "") -> str:
    row = f"{s.lhs.latex} &{tex_op(s.op)} {s.rhs.latex}"
    return row + (rf" && \text{{{tex_text(tag)}}}" if tag else "")


def model_latex(c: Compiled, part: str = "equations", environment: str = "align*") -> str:
    """`part`: "equations" (as written, one row per statement, tagged with its block), "step"
    (the discretized step and the new states) or "backward" (the derived VJP and its results)."""
    from ..errors import FlexDSLError

    if part not in PARTS:
        raise FlexDSLError(f"unknown part {part!r} for latex()", c.filename, hint="use one of: " + ", ".join(PARTS))
    if environment not in ENVIRONMENTS:
        raise FlexDSLError(f"unknown environment {environment!r} for latex()", c.filename,
                           hint="use one of: " + ", ".join(ENVIRONMENTS))
    d = describe(c, sources=False)
    rows: list[str] = []
    if part == "equations":
        for b in d.written:
            rows += [_row(s, b.title) for s in b.statements]
        if d.surrogate is not None:
            rows.append(_row(d.surrogate.applied, f"surrogate {d.surrogate.name}"))
            rows.append(_row(d.surrogate.u))
    elif part == "step":
        rows += [_row(s) for s in d.step.statements]
        rows += [_row(s) for s in d.next_states]
    else:
        rows += [_row(s) for s in d.backward.statements]
        rows += [_row(s) for s in d.backward_results]
    body = " \\\\\n".join(rows) if rows else r"\text{(none)}"
    return f"\\begin{{{environment}}}\n{body}\n\\end{{{environment}}}"


def repr_latex(c: Compiled) -> str:
    """For Jupyter: the equations as written, displayed."""
    return "$$" + model_latex(c, "equations", "aligned") + "$$"


__all__ = ["model_latex", "repr_latex", "PARTS"]
