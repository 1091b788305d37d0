"""Markdown pages: the same content as the HTML pages, math as LaTeX (`$…$`, `$$…$$`: GitHub,
Jupyter, MkDocs render it), images linked beside the page. User text is escaped so that it
stays text: HTML special characters become entities, Markdown punctuation is backslash-escaped,
and the docstring's indented runs and all code go into fences longer than any backtick run."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence

from .content import ModelDoc, derived_note, source_titles
from .figures import Figures
from .htmlpage import Failure, IndexEntry, code_spans, file_label, number, usage
from .mathdoc import Math, Statement, tex_op

_PUNCT = re.compile(r"([\\`*_{}\[\]()#+\-!|~$])")


def text(s: str) -> str:
    """User text as literal Markdown inline text (one line)."""
    one = " ".join(str(s).split())
    return html.escape(_PUNCT.sub(r"\\\1", one), quote=False)


def fence(body: str, lang: str = "") -> str:
    """A fenced code block that `body` cannot close."""
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    f = "`" * max(3, longest + 1)
    return f"{f}{lang}\n{body.rstrip()}\n{f}"


def code(s: str) -> str:
    """An inline code span that `s` cannot close (pipes escaped for tables)."""
    one = " ".join(str(s).split())
    longest = max((len(m) for m in re.findall(r"`+", one)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if one.startswith("`") or one.endswith("`") else ""
    body = one.replace("|", "\\|")
    return f"{ticks}{pad}{body}{pad}{ticks}"


def _tex(s: str) -> str:
    return s.replace("<", r"\lt ").replace(">", r"\gt ")


def im(m: Math) -> str:
    return f"${_tex(m.latex)}$"


def _aligned(statements: Sequence[Statement], lines: bool = True) -> str:
    rows = []
    for s in statements:
        row = f"{_tex(s.lhs.latex)} &{tex_op(s.op)} {_tex(s.rhs.latex)}"
        if lines and s.line:
            row += rf" && \text{{line {s.line}}}"
        rows.append(row)
    return "$$\n\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}\n$$"


def _unit(r) -> str:
    if not r.unit:
        return ""
    return text(r.unit) + ("" if r.unit_declared else "\\*")


def _value(r) -> str:
    if r.value is None:
        return ""
    return im(r.value) + (f" = {number(r.number)}" if r.number is not None else "")


def prose(s: str) -> str:
    """Docstring text: its `code` spans as code spans, the rest as literal text."""
    return "".join(code(part) if kind == "code" else text(part) for kind, part in code_spans(s))


def page(d: ModelDoc, fig: Figures | None = None, index_link: str | None = None,
         reference_link: str | None = None) -> str:
    out: list[str] = []
    if index_link:
        ref = f" \u00b7 [language reference](<{reference_link}>)" if reference_link else ""
        out.append(f"[\u2190 all models]({index_link}){ref}\n")
    out.append(f"# {text(d.name)} \u2014 {code(file_label(d))}\n")
    if d.summary:
        out.append(f"**{prose(d.summary)}**\n")
    if d.reference:
        out.append(f"> **Reference.** {prose(d.reference)}\n")
    for kind, body in d.blocks:
        out.append((fence(body, "text") if kind == "pre" else prose(body)) + "\n")
    out.append(fence(usage(d, fig), "text") + "\n")
    if d.notes:
        out.append("**As loaded.**\n\n" + "\n".join(f"- {prose(n)}" for n in d.notes) + "\n")
    _interface(d, out.append)
    _equations(d, out.append)
    if fig is not None:
        _plots(d, fig, out.append)
    _derived(d, out.append)
    _code(d, out.append)
    return "\n".join(out).rstrip() + "\n"


def _interface(d: ModelDoc, add: Callable[[str], None]) -> None:
    add("## Inputs, parameters and states\n")
    add("### Inputs\n\n| name | description | unit |\n| --- | --- | --- |")
    for r in d.inputs:
        add(f"| {im(r.symbol)} {code(r.name)} | {text(r.description)} | {_unit(r)} |")
    add("")
    if d.params:
        add("### Parameters\n\n| name | default | constraint | learnable | description | unit |\n"
            "| --- | --- | --- | --- | --- | --- |")
        for r in d.params:
            cons = im(r.constraint) if r.constraint else ""
            add(f"| {im(r.symbol)} {code(r.name)} | {_value(r)} | {cons} | {'yes' if r.learnable else ''} | "
                f"{text(r.description)} | {_unit(r)} |")
        add("")
    if d.states:
        add("### States\n\n| name | initial value | description | unit |\n| --- | --- | --- | --- |")
        for r in d.states:
            add(f"| {im(r.symbol)} {code(r.name)} | {_value(r)} | {text(r.description)} | {_unit(r)} |")
        add("")
    add("Outputs, in return order: " + ", ".join(code(o) for o in d.outputs) + ".")
    if any(r.unit and not r.unit_declared for r in [*d.inputs, *d.params, *d.states]):
        add(" Units marked \\* are read from the descriptions.")
    add("")


def _equations(d: ModelDoc, add: Callable[[str], None]) -> None:
    add("## Equations as written\n\nOne step computes, in this order:\n")
    for b in d.written:
        add(f"### {code(b.title)}\n")
        if b.note:
            add(f"*{text(b.note)}*\n")
        add(_aligned(b.statements) + "\n")
    if d.surrogate:
        s = d.surrogate
        add(f"### Surrogate {code(s.call)}\n")
        here = "at load (surrogate=)" if d.options and d.options.surrogate else "in this model"
        who = f"Defined {here}" if s.user else f"Built in ({prose(s.source)})"
        add(f"{who}: the derivative backward uses for the spike.\n")
        add(_aligned([s.generic, s.u, s.applied], lines=False) + "\n")


def _plots(d: ModelDoc, fig: Figures, add: Callable[[str], None]) -> None:
    add("## Plots\n")
    if fig.note:
        add(f"*{text(fig.note)}*\n")
    for src, cap, alt in ((fig.response, fig.response_caption, "response to a step input"),
                          (fig.fi, fig.fi_caption, "f-I curve"), (fig.surrogate, fig.surrogate_caption, "surrogate")):
        if src:
            add(f"![{text(d.name)}: {alt}](<{src}>)\n\n*{text(cap)}*\n")
        if src and src == fig.fi and fig.fi_data:
            add(f"The numbers: [{text(fig.fi_data if not fig.fi_data.startswith('data:') else 'CSV')}](<{fig.fi_data}>)\n")


NOISE_NOTE = ("; N(0, 1) and U(0, 1) are random draws, new at every step for every neuron (a standard normal, a "
              "uniform in (0, 1); white noise enters through its increment over the step, sqrt(dt) times a normal); "
              "the backward replays the forward's draws")


def _derived(d: ModelDoc, add: Callable[[str], None]) -> None:
    add("## What the compiler derived\n\n### The discretized step\n")
    if d.method:
        auto = " (chosen automatically)" if d.method_auto else ""
        add(f"ODEs integrated with **{text(d.method)}**{auto}: {text(d.method_doc)}.\n")
    add("Assignments of one step, in order (each name assigned once: $v_{1}$, $v_{2}$ are the successive values "
        "of $v$); plain names are the values before the step, $[u \\geq 0]$ is the spike (1 or 0)"
        + (NOISE_NOTE.replace("N(0, 1)", "$\\mathcal{N}(0, 1)$").replace("U(0, 1)", "$\\mathcal{U}(0, 1)$")
           if d.stochastic else "") + text(derived_note(d)) + ".\n")
    add(_aligned(d.step.statements) + "\n")
    add("New states and outputs:\n")
    add(_aligned(d.next_states + d.step_outputs, lines=False) + "\n")
    add("### The backward (vector-Jacobian product of one step)\n")
    given = ", ".join(im(g) for g in d.backward_given)
    add(f"$\\overline{{x}}$ is the gradient of the loss with respect to $x$; given {given} (the gradients of the "
        "outputs and of the new states), one step back computes:\n")
    if d.backward.statements:
        add(_aligned(d.backward.statements, lines=False) + "\n")
    add(_aligned(d.backward_results, lines=False) + "\n")
    if d.eprop:
        add("### e-prop's eligibility (online learning)\n")
        add(d.eprop_note + "\n")
        add(_aligned(d.eprop, lines=False) + "\n")


def _code(d: ModelDoc, add: Callable[[str], None]) -> None:
    if d.sources:
        add("## Generated code\n")
        for name, src in d.sources.items():
            add(f"<details><summary>{html.escape(source_titles().get(name, name))}</summary>\n\n"
                + fence(src, "python") + "\n\n</details>\n")
    add(f"<details><summary>The model file {html.escape(file_label(d))}</summary>\n\n" + fence(d.source, "text")
        + "\n\n</details>\n")


def index(entries: Sequence[IndexEntry], failed: Sequence[Failure] = (), title: str = "flexdsl models",
          reference_link: str | None = None) -> str:
    out = [f"# {text(title)}\n"]
    n = len(entries)
    line = f"{n} model{'s' if n != 1 else ''}, documented from their equations."
    if reference_link:
        line += f" The language: [language reference](<{reference_link}>)."
    out.append(line + "\n")
    out.append("| model | summary | kind | page |\n| --- | --- | --- | --- |")
    for e in entries:
        kind = e.kind + (f", {e.method}" if e.method else "")
        out.append(f"| [{text(e.name)}](<{e.markdown}>) {code(e.file_label)} | {text(e.summary)} | {text(kind)} | "
                   f"[HTML](<{e.html}>) |")
    if failed:
        out.append("\n## Not documented\n")
        for f in failed:
            out.append(f"- {code(f.label)}\n\n" + fence(f.error, "text"))
    return "\n".join(out).rstrip() + "\n"


__all__ = ["page", "index", "text", "fence", "code"]
