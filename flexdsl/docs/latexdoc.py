"""A model's equations as LaTeX, for papers (`Compiled.latex()`) and notebooks (`_repr_latex_`).

A statement too long for a page is broken over lines (`texbreak.py`: before a `+` or `−`, between
factors, inside parentheses), its continuation lines indented by a quad; in `align*` each block's
name is a `\\tag*` (which amsmath moves below an equation that leaves no room for it) and a page may
break between statements (`\\displaybreak[0]`), so that a long step or backward (Hodgkin–Huxley's)
runs over pages instead of off them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .content import describe
from .mathdoc import Statement, tex_op
from .printing import tex_text
from .texbreak import broken, tex_width

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled

PARTS = ("equations", "step", "backward")
ENVIRONMENTS = ("align*", "aligned")
WIDTH = 33.0  # em: LaTeX's article class sets 345 pt (34.5 em) of text; a little to spare
TAG = 6.0  # em kept for a block's name beside its first line


def _row(s: Statement, environment: str, left: float, tag: str = "") -> str:
    """One statement; `left`: the width (em) of the widest left side and operator of its
    environment, where every right side starts."""
    op = tex_op(s.op)
    rhs = s.rhs
    avail = WIDTH - left - 1.0 - (TAG if tag else 0.0)
    if rhs.expr is None or tex_width(rhs.latex) <= avail:
        lines = [rhs.latex]
    else:
        lines = broken(rhs.expr, rhs.adjoints, rhs.order, avail, avail - 1.0)
    label = ""
    if tag:
        label = rf" \tag*{{\text{{{tex_text(tag)}}}}}" if environment == "align*" else rf" && \text{{{tex_text(tag)}}}"
    row = f"{s.lhs.latex} &{op} {lines[0]}{label}"
    return row + "".join(f" \\\\\n&\\quad {ln.lstrip()}" for ln in lines[1:])


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
    shown: list[tuple[Statement, str]] = []
    if part == "equations":
        for b in d.written:
            shown += [(s, b.title) for s in b.statements]
        if d.surrogate is not None:
            shown += [(d.surrogate.applied, f"surrogate {d.surrogate.name}"), (d.surrogate.u, "")]
    elif part == "step":
        shown += [(s, "") for s in [*d.step.statements, *d.next_states]]
    else:
        shown += [(s, "") for s in [*d.backward.statements, *d.backward_results]]
    # (align* sets every right side where the widest left side ends)
    left = max((tex_width(s.lhs.latex) + tex_width(tex_op(s.op)) for s, _ in shown), default=0.0)
    rows = [_row(s, environment, left, tag) for s, tag in shown]
    between = " \\displaybreak[0]\\\\\n" if environment == "align*" else " \\\\\n"
    body = between.join(rows) if rows else r"\text{(none)}"
    return f"\\begin{{{environment}}}\n{body}\n\\end{{{environment}}}"


def repr_latex(c: Compiled) -> str:
    """For Jupyter: the equations as written, displayed."""
    return "$$" + model_latex(c, "equations", "aligned") + "$$"


__all__ = ["model_latex", "repr_latex", "PARTS"]
