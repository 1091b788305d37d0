"""A layer's documentation page (`flexdsl doc x.layer`, and a directory's `.layer` files): its
docstring, neuron, inputs and synapses, then each synapse group's current as an equation built with
sympy (printed as LaTeX for the Markdown page and as MathML for the HTML page, from the same
expression), delays written as the step they read, `s_j(t - d_j)`, learnable ones with their
relaxation, and the plan (`ir/layer.py`): what runs before, in and after the time loop, and the
gradients.

    md, html, entry = layer_page(checked, plan, "rlif.layer", index_link="index.html")
"""

from __future__ import annotations

import html as _html
import re
from pathlib import Path
from typing import Any

import sympy as sp
import torch
from sympy.core.function import AppliedUndef

from ..frontend import ast as A
from ..frontend.layer import CheckedLayer, CheckedSynapse
from ..ir.layer import LayerPlan
from .printing import latex, mathml_inner


def _current(layer: CheckedLayer, s: CheckedSynapse) -> tuple[sp.Basic, sp.Basic]:
    """(lhs, rhs) of a synapse group's current at step t (rhs added into lhs)."""
    t, i, j = sp.Symbol("t"), sp.Symbol("i"), sp.Symbol("j")
    port = layer.neuron.inputs[s.port_index].name
    one = s.connect == "one_to_one"
    idx = i if one else j
    back = sp.Integer(1) if s.recurrent else sp.Integer(0)
    if s.delay_kind == "uniform":
        back += s.delay
    elif s.delay_kind == "axonal":
        back += sp.Symbol(f"d_{idx}")
    elif s.delay_kind == "synaptic":
        back += sp.Symbol("d_i" if one else "d_ij")
    elif s.delay_kind == "dendritic":
        back += sp.Symbol("d_i")
    pre = sp.Function(f"{s.pre}_{idx}")(t - back)
    w = sp.IndexedBase(s.name)
    if one:
        rhs = w[i] * pre
    else:
        weight = w[i, j] * (sp.IndexedBase("M")[i, j] if s.connect == "mask" else 1)
        rhs = sp.Sum(weight * pre, (j, 1, sp.Symbol(f"n_{s.pre}")))
    if s.bias is not None:  # (dendritic: the bias is part of the delayed current, 0 before it arrives)
        b = sp.IndexedBase(s.bias)[i]
        rhs = rhs + (b * sp.Heaviside(t - back, 1) if s.delay_kind == "dendritic" else b)
    return sp.Function(f"{port}_i")(t), rhs


def _relaxation(s: CheckedSynapse) -> tuple[sp.Basic, sp.Basic]:
    """(g_k(d), its definition) of a learnable delay's relaxation."""
    k, k2, d, sig, D = sp.Symbol("k"), sp.Symbol("k'"), sp.Symbol("d"), sp.Symbol("sigma"), sp.Integer(s.delay)
    g = sp.Function("g_k")(d)
    if s.delay_interp == "gauss":
        e = sp.exp(-(k - d) ** 2 / (2 * sig ** 2))
        return g, e / sp.Sum(e.subs(k, k2), (k2, 0, D))
    return g, sp.Max(0, 1 - sp.Abs(k - d))


def _delay_words(s: CheckedSynapse) -> str:
    if s.delay_kind is None:
        return "none"
    if s.delay_kind == "uniform":
        return f"{s.delay} steps"
    what = {"axonal": "per presynaptic neuron", "synaptic": "per connection", "dendritic": "per postsynaptic neuron"}
    kind = what[s.delay_kind] if s.connect != "one_to_one" else "per neuron"
    if s.delay_learnable:
        return f"{kind}, learnable in [0, {s.delay}] steps ({s.delay_interp}): `{s.name}_delay`"
    return f"{kind}, whole steps in [0, {s.delay}]: `{s.name}_delay`"


class _Formulas:
    """Equations as `$LaTeX$` for the Markdown and, by that text, their MathML for the HTML page."""

    def __init__(self) -> None:
        self.math: dict[str, str] = {}

    def __call__(self, lhs: sp.Basic, op: str, rhs: sp.Basic, tex_op: str) -> str:
        tex = f"{latex(lhs)} {tex_op} {latex(rhs)}"
        markup = f"<mrow>{mathml_inner(lhs)}<mo>{_html.escape(op)}</mo>{mathml_inner(rhs)}</mrow>"
        for f in (lhs.atoms(AppliedUndef) | rhs.atoms(AppliedUndef)):  # (`s_j(t)`: the index as a subscript)
            name = type(f).__name__
            if "_" in name:
                base, sub = name.split("_", 1)
                markup = markup.replace(f"<mi>{_html.escape(name)}</mi>",
                                        f"<msub><mi>{_html.escape(base)}</mi><mi>{_html.escape(sub)}</mi></msub>")
        # (W_(i,j): the indices as a plain subscript, W_ij; no bracket beside a subscripted name)
        markup = markup.replace('<mrow><mo stretchy="false">(</mo><mrow><mi>i</mi><mo>,</mo><mi>j</mi></mrow>'
                                '<mo stretchy="false">)</mo></mrow>', "<mrow><mi>i</mi><mo>,</mo><mi>j</mi></mrow>")
        # (W_rec indexed: one subscript `rec, i, j`, its parts apart)
        markup = re.sub(r"<msub><msub><mi>([^<]+)</mi><mi>([^<]+)</mi></msub>(<mrow><mi>i</mi><mo>,</mo><mi>j</mi></mrow>"
                        r"|<mi>[ij]</mi>)</msub>",
                        lambda m: (f"<msub><mi>{m.group(1)}</mi><mrow><mi>{m.group(2)}</mi><mo>,</mo>"
                                   f"{m.group(3).removeprefix('<mrow>').removesuffix('</mrow>')}</mrow></msub>"), markup)
        self.math[tex] = f'<math display="block">{markup}</math>'
        return f"${tex}$"


def load_sizes(layer: CheckedLayer, known: bool = False) -> tuple[int | None, dict[str, int]]:
    """The sizes the file leaves to the load: (`hidden=`, or None where the file writes `size`; the
    unwritten inputs' sizes by name). `known`: the layer was loaded, its sizes are the ones given;
    else example sizes (`describe` checks with 1s), an input into one_to_one synapses the layer's."""
    written = layer.ast.of(A.LayerSize)
    unwritten = [d.name for d in layer.ast.of(A.LayerInput) if d.size is None]
    if known:
        return (None if written else layer.size), {n: k for n, k, _ in layer.inputs if n in unwritten}
    hidden = None if written else 256
    o2o = {s.pre for s in layer.synapses if s.connect == "one_to_one"}
    n = hidden if hidden is not None else written[0].value
    return hidden, {d: (n if d in o2o else 700) for d in unwritten}


def _load_args(layer: CheckedLayer, known: bool) -> str:
    """The keywords a load of the file needs, e.g. `, hidden=256, in_features=700`."""
    hidden, sizes = load_sizes(layer, known)
    args = [f"hidden={hidden}"] if hidden is not None else []
    if sizes:
        one = len(layer.ast.of(A.LayerInput)) == 1
        args.append(f"in_features={next(iter(sizes.values())) if one else sizes!r}")
    return "".join(f", {a}" for a in args)


def _in_features(layer: CheckedLayer, name: str) -> str:
    return "in_features=" if len(layer.ast.of(A.LayerInput)) == 1 else f"in_features={{{name!r}: ...}}"


def _interface(layer: CheckedLayer, known: bool) -> list[str]:
    neuron = layer.ast.of(A.LayerNeuron)[0]
    hidden, sizes = load_sizes(layer, known)
    count = f"{layer.size} of them" + (" (given at load: `hidden=`)" if known and hidden is not None else "")
    if hidden is not None and not known:
        count = "how many given at load (`hidden=`)"
    lines = ["## Interface", "",
             f"- neuron: `{neuron.ref}` ({layer.neuron.name}), {count}",
             *(f"- input `{n}`: " + (f"its size (values per step) given at load (`{_in_features(layer, n)}`)"
                                     if n in sizes and not known else f"{k} values per step") for n, k, _ in layer.inputs),
             *(f"- direct input `{n}` (no synapse: the layer takes it as it is)" for n in layer.direct), "",
             "| synapses | from | to | connectivity | bias | delay |", "| --- | --- | --- | --- | --- | --- |"]
    for s in layer.synapses:
        pre = f"`{s.pre}`" + (" (the neuron's output, one step late)" if s.recurrent else "")
        lines.append(f"| `{s.name}` | {pre} | `{layer.neuron.inputs[s.port_index].name}` | {s.connect} | "
                     f"{f'`{s.bias}`' if s.bias else '—'} | {_delay_words(s)} |")
    return lines + [""]


def _equations(layer: CheckedLayer, formula: _Formulas) -> list[str]:
    lines = ["## Equations", "", "At every step t, each synapse group adds its current into the neuron's input "
             "(values before the first step are 0):", ""]
    for s in layer.synapses:
        lhs, rhs = _current(layer, s)
        lines += [formula(lhs, "+=", rhs, r"\mathrel{+}="), ""]
    for s in layer.synapses:
        if s.delay_learnable:
            g, gdef = _relaxation(s)
            k, d, t = sp.Symbol("k"), sp.Symbol("d"), sp.Symbol("t")
            val = sp.Function(s.pre)
            lines += [f"The learnable delays of `{s.name}` (`{s.name}_delay`, real numbers of steps in "
                      f"[0, {s.delay}]) read a value `d` steps back through the {s.delay_interp} relaxation over "
                      "the whole steps k = 0..max (DCLS, Hammouamri et al., ICLR 2024)"
                      + (f"; σ is `{s.name}_delay_width` (σ = 0: whole steps)" if s.delay_interp == "gauss" else "")
                      + ":", "",
                      formula(val(t - d), "≈", sp.Sum(g * val(t - k), (k, 0, s.delay)), r"\approx"), "",
                      formula(g, "=", gdef, "="), ""]
    return lines


def layer_page(layer: CheckedLayer, plan: LayerPlan, label: str, index_link: str | None = None,
               reference: str | None = None, module: Any = None, outdir: str | Path | None = None,
               stem: str | None = None) -> tuple[str, str, str]:
    """(Markdown, HTML, one-line summary) of the layer's page; with `module` (the layer's module,
    e.g. trained) the histogram of each delayed synapse group's delays as they are in it (PNGs in
    `outdir` named after `stem`, or embedded without `outdir`)."""
    a = layer.ast
    formula = _Formulas()
    count = layer.size if a.of(A.LayerSize) or module is not None else "N"
    summary = (a.doc.strip().split("\n\n")[0].replace("\n", " ") if a.doc.strip() else
               f"{count} {layer.neuron.name} neurons, {len(layer.synapses)} synapse group"
               f"{'s' if len(layer.synapses) != 1 else ''}")
    kind = "recurrent layer" if layer.recurrent is not None else "feed-forward layer"
    made = {"<string>": "loaded from text (`flexdsl.loads`)", "<flexdsl.recurrent>": "built by `flexdsl.recurrent`",
            "<flexdsl.feedforward>": "built by `flexdsl.feedforward`"}
    shown = made.get(label, f"`{label}`")
    lines = [f"# {layer.name}", "", f"*{kind}* · {shown}", "", *([a.doc.strip(), ""] if a.doc.strip() else []),
             *_interface(layer, module is not None), *_equations(layer, formula)]
    if module is not None:
        lines += _histograms(layer, module, outdir, stem or layer.name)
    lines += ["## The plan", "", "What runs before, in and after the time loop, and each weight's gradient "
              "(derived from the synapse's current):", "", "```", *plan.equations, "```", "",
              "## Use", "", "```python", "import flexdsl", "",
              f"m = flexdsl.load({label!r}{_load_args(layer, module is not None)})" if label.endswith(".layer") else
              "m = flexdsl.loads(text)  # text: the layer as written above (a built module's `m.layer_text`)",
              "```", ""]
    md, page = guide_pages(lines, formula, f"{layer.name} ({kind})", label, index_link, reference)
    return md, page, summary


def guide_pages(lines: list[str], formula: _Formulas, title: str, label: str, index_link: str | None,
                reference: str | None) -> tuple[str, str]:
    """(Markdown, HTML) of a page that is not a neuron model's (a layer's, a rule's): its Markdown lines
    with the formulas' MathML in the HTML, the site's navigation on both."""
    from .guides import GUIDES, to_html
    from .htmlpage import environment, version

    md = "\n".join(lines)
    body = to_html(md, math=formula.math, guides=dict(GUIDES))
    page = environment().get_template("guide.html.j2").render(
        title=title, body=body, version=version(), index_link=index_link,
        guides=[(f"{Path(g).stem}.html", t) for g, t in GUIDES.items()] if reference else [],
        source=label if not label.startswith("<") else "text given to flexdsl",
        ships=False)
    nav = ([f"[← all models]({Path(index_link).with_suffix('.md').name})"] if index_link else []) + \
        (["[the language reference](language.md)"] if reference else [])
    return (" · ".join(nav) + "\n\n" + md if nav else md), page


def _histograms(layer: CheckedLayer, module: Any, outdir: str | Path | None, stem: str) -> list[str]:
    """The Markdown of the delays' histograms of a layer's module."""
    from .plots import delay_histogram, figure_src

    out: list[str] = []
    for s in layer.synapses:
        d = getattr(module, f"{s.name}_delay", None) if s.delay_kind not in (None, "uniform") else None
        if d is None:
            continue
        what = "learned" if s.delay_learnable else "fixed"
        width = float(getattr(module, f"{s.name}_delay_width", torch.tensor(0.0)))
        title = f"{s.name}_delay: {d.numel()} {what} delays" + (f" (width {width:g})" if s.delay_learnable else "")
        src = figure_src(delay_histogram(d, s.delay, title), outdir, f"{stem}.{s.name}_delays.png")
        out += [f"![the {what} delays of {s.name}]({src})", ""]
    return (["## Delays", "", "The delays of this module, by step:", "", *out] if out else [])


__all__ = ["guide_pages", "layer_page"]
