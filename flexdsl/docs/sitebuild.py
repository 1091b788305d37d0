"""`flexdsl doc`: pages for many models and the index that links them.

`build(targets, outdir)` takes files, directories (every `.neuron` and `.layer` below them) and library
stems; for each model it writes `<stem>.html`, `<stem>.md` and the PNGs beside them (a layer: its page,
`layerpage.py`), then `index.html`,
`index.md` and the guides (the language reference, units, NIR) as Markdown and as HTML pages. A model that does not compile is reported
(located error) and left out; the others are still written.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._paths import DOCS_DIR
from ..errors import FlexDSLError
from ..frontend.options import NONE, LoadOptions
from ..library import is_layer_text, is_rule_text, library, library_path, looks_like_source
from . import htmlpage, mdpage
from .content import describe, method_text
from .figures import Figures, make_figures

Progress = Callable[[int, int, str, float], None]  # (done, total, label, seconds for this model)


@dataclass
class Target:
    label: str  # as the user named it (a path, or a stem)
    model: str  # what compile_model takes


@dataclass
class BuildResult:
    outdir: Path
    pages: list[Path] = field(default_factory=list)  # the HTML pages
    files: list[Path] = field(default_factory=list)  # everything written
    failed: list[tuple[str, FlexDSLError]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def index(self) -> Path:
        return self.outdir / "index.html"


def expand(args: Iterable[str | Path]) -> list[Target]:
    """Files, directories (their `.neuron` files, recursively, sorted) and library stems, each
    model once. A directory without models or a name that is none of these is an error."""
    out: list[Target] = []
    seen: set[str] = set()

    def add(label: str, model: str, key: str) -> None:
        if key not in seen:
            seen.add(key)
            out.append(Target(label, model))

    for a in args:
        s = str(a)
        if isinstance(a, str) and looks_like_source(a):
            add("<string>", a, a)
            continue
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in [*p.rglob("*.neuron"), *p.rglob("*.layer"), *p.rglob("*.rule")] if q.is_file())
            if not found:
                raise FlexDSLError(f"no `.neuron`, `.layer` or `.rule` files in the directory `{s}`", s)
            for q in found:
                add(str(q), str(q), str(q.resolve()))
        elif p.is_file():
            add(s, s, str(p.resolve()))
        elif "/" not in s and not s.endswith((".neuron", ".layer")) and library_path(s).is_file():
            add(s, s, str(library_path(s).resolve()))
        elif "/" not in s and s.endswith((".layer", ".rule")) and (library_path("x").parent / s).is_file():
            lib = library_path("x").parent / s  # (a library layer or rule: `rlif.layer`, `stdp_sj.rule`)
            add(s, str(lib), str(lib.resolve()))
        elif "/" not in s and (library_path("x").parent / f"{s}.rule").is_file():
            lib = library_path("x").parent / f"{s}.rule"  # (a library rule by its name: `stdp_additive`)
            add(f"{s}.rule", str(lib), str(lib.resolve()))
        else:
            from ..errors import did_you_mean
            from ..library import rules

            names = [*library(), *rules()]
            hint = did_you_mean(p.stem, names)
            raise FlexDSLError(f"no such file, directory or library model or rule: `{s}`", s,
                               hint=hint or "library models: " + ", ".join(library()) + "; rules: " + ", ".join(rules()))
    return out


def page_name(stem: str, taken: set[str]) -> str:
    """A file-system-safe, unique page name for a model."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", stem).strip(".") or "model"
    name, i = base, 2
    while name.lower() in taken or name.lower() in ("index", "language", "units", "nir"):
        name, i = f"{base}-{i}", i + 1
    taken.add(name.lower())
    return name


def prepare(outdir: str | Path) -> Path:
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise FlexDSLError(f"`{out}` exists and is not a directory", str(out), hint="choose another -o OUTDIR")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FlexDSLError(f"cannot create the output directory `{out}`: {e.strerror or e}", str(out)) from None
    return out


def _write(path: Path, text: str) -> Path:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise FlexDSLError(f"cannot write `{path}`: {e.strerror or e}", str(path)) from None
    return path


def build(targets: Sequence[str | Path] | Sequence[Target], outdir: str | Path, *, plots: bool = True,
          progress: Progress | None = None, title: str = "flexdsl models", options: LoadOptions = NONE
          ) -> BuildResult:
    """Write the pages of every model, the index and the language reference into `outdir`
    (`options`: the load-time options every model is compiled with; its page states them)."""

    t_all = time.perf_counter()
    tg = [t if isinstance(t, Target) else None for t in targets]
    items: list[Target] = [t for t in tg if t is not None] or expand(targets)  # type: ignore[arg-type]
    out = prepare(outdir)
    result = BuildResult(out)
    reference = _copy_reference(out, result)
    taken: set[str] = set()
    entries: list[htmlpage.IndexEntry] = []
    failures: list[htmlpage.Failure] = []
    for k, t in enumerate(items):
        t0 = time.perf_counter()
        try:
            entries.append(_layer(t, out, taken, result, reference) if _is_layer(t.model) else
                           _rule(t, out, taken, result, reference) if _is_rule(t.model) else
                           _model(t, out, taken, result, reference, plots, options))
        except FlexDSLError as e:
            result.failed.append((t.label, e))
            failures.append(htmlpage.Failure(t.label, str(e)))
        if progress:
            progress(k + 1, len(items), t.label, time.perf_counter() - t0)
    result.files.append(_write(out / "index.html", htmlpage.index(entries, failures, title, reference)))
    result.files.append(_write(out / "index.md", mdpage.index(entries, failures, title,
                                                             "language.md" if reference else None)))
    result.seconds = time.perf_counter() - t_all
    return result


def _model(t: Target, out: Path, taken: set[str], result: BuildResult, reference: str | None, plots: bool,
           options: LoadOptions) -> htmlpage.IndexEntry:
    """A neuron model's pages (HTML, Markdown, plots) and its index entry."""
    from ..runtime.compiler import compile_model

    c = compile_model(t.model, options=options)
    d = describe(c)
    name = page_name(d.stem, taken)
    figs = make_figures(c, name, out) if plots else None
    html_path = _write(out / f"{name}.html", htmlpage.page(d, figs, "index.html", reference))
    md_path = _write(out / f"{name}.md", mdpage.page(d, figs, "index.md", "language.md" if reference else None))
    result.pages.append(html_path)
    result.files += [html_path, md_path] + [out / f for f in (figs.files() if figs else [])]
    return htmlpage.IndexEntry(d.name, htmlpage.file_label(d), d.summary, html_path.name, md_path.name,
                               figs.thumbnail if figs else None, "spiking" if d.spiking else "non-spiking",
                               method_text(d) or None)


def _is_layer(model: str) -> bool:
    return is_layer_text(model) if looks_like_source(model) else model.endswith(".layer")


def _is_rule(model: str) -> bool:
    return is_rule_text(model) if looks_like_source(model) else model.endswith(".rule")


def _rule(t: Target, out: Path, taken: set[str], result: BuildResult, reference: str | None
          ) -> htmlpage.IndexEntry:
    """A plasticity rule's pages (`rulepage.py`: with its STDP window) and its index entry."""
    from ..runtime.rule import load_rule
    from .rulepage import rule_page

    rule = load_rule(t.model)
    name = page_name(rule.name if t.label == "<string>" else Path(t.label).stem, taken)
    label = t.label if t.label != "<string>" else "<string>"
    md, page, summary = rule_page(rule, label, "index.html", reference, out, name)
    html_path = _write(out / f"{name}.html", page)
    md_path = _write(out / f"{name}.md", md)
    result.pages.append(html_path)
    result.files += [html_path, md_path, out / f"{name}.window.png"]
    return htmlpage.IndexEntry(rule.name, Path(label).name if label.endswith(".rule") else "(rule text)", summary,
                               html_path.name, md_path.name, f"{name}.window.png", "plasticity rule", None,
                               "weight change against the pre/post spike timing (STDP window)" if rule.changes_weight
                               else "what the synapse carries at the spikes of a regular train")


def _layer(t: Target, out: Path, taken: set[str], result: BuildResult, reference: str | None
           ) -> htmlpage.IndexEntry:
    """A layer's pages (`layerpage.py`) and its index entry."""
    from ..runtime.layer import describe as describe_layer
    from .layerpage import layer_page

    checked, plan = describe_layer(t.model)
    name = page_name(checked.name if t.label == "<string>" else Path(t.label).stem, taken)
    label = t.label if t.label != "<string>" else "(layer text)"
    md, page, summary = layer_page(checked, plan, label if t.label != "<string>" else "<string>",
                                   "index.html", reference)
    html_path = _write(out / f"{name}.html", page)
    md_path = _write(out / f"{name}.md", md)
    result.pages.append(html_path)
    result.files += [html_path, md_path]
    kind = "recurrent layer" if checked.recurrent is not None else "feed-forward layer"
    return htmlpage.IndexEntry(checked.name, Path(label).name if label.endswith(".layer") else label, summary,
                               html_path.name, md_path.name, None, kind, None)


def _copy_reference(out: Path, result: BuildResult) -> str | None:
    """The guides beside the pages (they ship with flexdsl): each as its Markdown and as an HTML
    page (see `guides.py`). Returns the name of the language reference's HTML page."""
    from . import guides

    names = guides.available()
    for name in names:
        src = DOCS_DIR / name
        dst = out / name
        try:
            if not (dst.exists() and dst.samefile(src)):  # writing into flexdsl's own docs: nothing to copy
                shutil.copyfile(src, dst)
                result.files.append(dst)
        except OSError as e:
            raise FlexDSLError(f"cannot write `{dst}`: {e.strerror or e}", str(out)) from None
        result.files.append(_write(out / f"{Path(name).stem}.html", guides.render(name)))
        for img in re.findall(r"\]\((images/[A-Za-z0-9_.-]+\.png)\)", src.read_text(encoding="utf-8")):
            # (the pictures a guide shows, beside it as in the repository)
            if (DOCS_DIR / img).is_file() and not (out / img).exists():
                (out / "images").mkdir(exist_ok=True)
                try:
                    shutil.copyfile(DOCS_DIR / img, out / img)
                except OSError as e:
                    raise FlexDSLError(f"cannot write `{out / img}`: {e.strerror or e}", str(out)) from None
                result.files.append(out / img)
    return "language.html" if "language.md" in names else None


def figures_of(result: BuildResult) -> list[Path]:
    return [f for f in result.files if f.suffix == ".png"]


__all__ = ["build", "expand", "BuildResult", "Target", "Figures"]
