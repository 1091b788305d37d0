"""Documentation generated from the equations. Takes a compiled model (or a loaded module);
gives pages (HTML, Markdown), LaTeX and plots.

    flexdsl.docs.render_html(model)        # a page: tables, MathML equations, derived step and backward,
    flexdsl.docs.render_markdown(model)    #   plots, generated code (images embedded, or written to `outdir`)
    flexdsl.docs.render_layer(m_or_path)   # a layer's page (its delays' histograms, from a module)
    flexdsl.docs.build(["neurons/"], "site/")   # pages + index (what `flexdsl doc` runs)
    flexdsl.docs.latex(model)              # the equations as LaTeX, for papers
    flexdsl.docs.language_reference()      # the path of the language reference (language.md)

`model` is anything `flexdsl.compile` takes (a path, a library stem, model text), a compiled
model, or a loaded module. The modules: `content` (what a page says; `docstring`: the docstring's
parts), `printing` (MathML and LaTeX printers), `simulate` + `explore` + `fi` + `plots` + `figures`
(the plots: the simulations, where a model fires and over how long a window, the f–I numbers and
caption), `htmlpage`, `mdpage`, `latexdoc` (+ `texbreak`: long equations over lines), `sitebuild`
(pages + index), `guides`, and `reference` (the generated tables of the language reference).
Importing this package installs the notebook display of compiled models and loaded modules
(`_repr_html_`, `_repr_latex_`) and `Compiled.latex()` in the runtime's display registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._paths import LANGUAGE_REFERENCE
from .._sympy import load as sympy_ready
from ..runtime import display

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled
    from .sitebuild import BuildResult


def compiled(model: Any) -> Compiled:
    """A Compiled from a model argument, a Compiled, or a NeuronModule."""
    from ..runtime.compiler import Compiled, compile_model

    if isinstance(model, Compiled):
        return model
    c = getattr(model, "compiled", None)
    if isinstance(c, Compiled):
        return c
    return compile_model(model)


def _current(model: Any) -> dict[str, Any] | None:
    values = getattr(model, "param_values", None)
    return values() if callable(values) else None


def render_html(model: Any, outdir: str | Path | None = None, *, plots: bool = True, sources: bool = True,
                standalone: bool = True) -> str:
    """The model's HTML page. Plots are written as PNGs into `outdir` (save the page there too)
    or, without `outdir`, embedded as data URIs; `standalone=False` gives a fragment."""
    sympy_ready()  # (before this package's modules import it: one thread at a time)
    from . import htmlpage
    from .content import describe
    from .figures import make_figures

    c = compiled(model)
    d = describe(c, sources=sources, current=_current(model))
    figs = make_figures(c, d.stem, outdir) if plots else None
    return htmlpage.page(d, figs) if standalone else htmlpage.fragment(d, figs)


def render_markdown(model: Any, outdir: str | Path | None = None, *, plots: bool = True,
                    sources: bool = True) -> str:
    """The model's Markdown page (math as LaTeX); plots as for `render_html`."""
    sympy_ready()  # (before this package's modules import it: one thread at a time)
    from . import mdpage
    from .content import describe
    from .figures import make_figures

    c = compiled(model)
    d = describe(c, sources=sources, current=_current(model))
    figs = make_figures(c, d.stem, outdir) if plots else None
    return mdpage.page(d, figs)


def render_layer(layer: Any, outdir: str | Path | None = None, *, markdown: bool = False) -> str:
    """A layer's page (HTML, or Markdown with `markdown=True`): `layer` a `.layer` path, a library
    layer (`"rlif.layer"`), layer text, or a layer module (`flexdsl.load("x.layer")`,
    `flexdsl.feedforward`, `flexdsl.recurrent`), whose delays (e.g. as trained) the page then
    shows as histograms (PNGs written into `outdir`, else embedded)."""
    sympy_ready()  # (before this package's modules import it: one thread at a time)
    from ..runtime.layer import describe as describe_layer
    from .layerpage import layer_page

    module = None
    if hasattr(layer, "plan") and hasattr(layer, "_layer"):
        module = layer
        checked, plan = layer._layer, layer.plan
        label = checked.ast.filename
    else:
        checked, plan = describe_layer(layer)
        label = str(layer) if not isinstance(layer, str) or "\n" not in layer else "<string>"
    if outdir is not None:
        Path(outdir).mkdir(parents=True, exist_ok=True)
    md, page, _ = layer_page(checked, plan, label, module=module, outdir=outdir,
                             stem=Path(label).stem if label.endswith(".layer") else checked.name)
    return md if markdown else page


def render_rule(rule: Any, outdir: str | Path | None = None, *, markdown: bool = False) -> str:
    """A plasticity rule's page (HTML, or Markdown with `markdown=True`): `rule` a `.rule` path, a
    library rule's name, rule text, or a rule module (`flexdsl.load_rule`, as trained); its STDP
    window simulated with the compiled rule (a PNG written into `outdir`, else embedded)."""
    sympy_ready()  # (before this package's modules import it: one thread at a time)
    from ..runtime.rule import Rule, load_rule
    from .rulepage import rule_page

    module = rule if isinstance(rule, Rule) else load_rule(rule)
    label = module.ir.filename
    if outdir is not None:
        Path(outdir).mkdir(parents=True, exist_ok=True)
    md, page, _ = rule_page(module, label, outdir=outdir,
                            stem=Path(label).stem if label.endswith(".rule") else module.name)
    return md if markdown else page


def latex(model: Any, part: str = "equations", environment: str = "align*") -> str:
    """The model's equations as LaTeX: `part` "equations" (as written), "step" (discretized)
    or "backward" (derived); in an `align*` environment (amsmath), or `aligned` for notebooks."""
    sympy_ready()  # (before this package's modules import it: one thread at a time)
    from .latexdoc import model_latex

    return model_latex(compiled(model), part, environment)


def build(targets: Any, outdir: str | Path, **kwargs: Any) -> BuildResult:
    """Pages for files, directories and library stems, plus the index (see `flexdsl doc`)."""
    sympy_ready()  # (before this package's modules import it: one thread at a time)
    from .sitebuild import build as _build

    return _build(list(targets) if not isinstance(targets, str | Path) else [targets], outdir, **kwargs)


def language_reference() -> Path:
    """The language reference that ships with flexdsl (Markdown)."""
    return LANGUAGE_REFERENCE


def _notebook_html(model: Any) -> str:
    return render_html(model, plots=False, sources=False, standalone=False)


def _notebook_latex(model: Any) -> str:
    sympy_ready()  # (before this package's modules import it: one thread at a time)
    from .latexdoc import repr_latex

    return repr_latex(compiled(model))


display.register("html", _notebook_html)
display.register("latex", _notebook_latex)
display.register("latex-source", latex)

__all__ = ["render_html", "render_markdown", "render_layer", "latex", "build", "language_reference", "compiled"]
