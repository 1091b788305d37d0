"""LaTeX from flexdsl compiles with a real TeX engine: `flexdsl.docs.latex()` of every library
model (the equations as written, the discretized step, the backward), and all the math of every
Markdown page of `flexdsl doc`, typeset by pdflatex with amsmath. `.ci/run` installs
texlive-latex-base (pdflatex) when it is missing; without it these tests fail saying so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import flexdsl
import flexdsl.docs as docs

MODELS = flexdsl.library()


def pdflatex() -> str:
    path = shutil.which("pdflatex")
    if path is None:
        pytest.fail("pdflatex is not installed: `apt-get install -y --no-install-recommends texlive-latex-base` "
                    "(.ci/run does this); the LaTeX tests compile flexdsl's output with it")
    return path


BIG_PAGE = "\\usepackage[margin=1cm,paperwidth=60cm,paperheight=200cm]{geometry}\n"


def compile_tex(body: str, tmp: Path, name: str, preamble: str = "", page: str = BIG_PAGE) -> str:
    """Typeset `body` in an article with amsmath (on a big page, or `page`: "" for the article
    class's own, US letter with 345 pt of text); fail with TeX's own error otherwise. Returns the log."""
    doc = ("\\documentclass{article}\n" + page +
           "\\usepackage{amsmath}\n" + preamble + "\\begin{document}\n" + body + "\n\\end{document}\n")
    (tmp / f"{name}.tex").write_text(doc, encoding="utf-8")
    r = subprocess.run([pdflatex(), "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", f"{name}.tex"],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    log = (tmp / f"{name}.log").read_text(encoding="utf-8", errors="replace") if (tmp / f"{name}.log").exists() else ""
    errors = [ln for ln in log.splitlines() if ln.startswith("!")]
    assert r.returncode == 0 and not errors, "\n".join(errors) + "\n" + log[-3000:]
    assert (tmp / f"{name}.pdf").is_file()
    # TeX typesets what it does not know without stopping in some cases: no such warnings either
    assert "Missing character" not in log and "Undefined control sequence" not in log
    return log


def test_latex_of_every_library_model_compiles(tmp_path):
    parts = []
    for stem in MODELS:
        c = flexdsl.compile(stem)
        for part in ("equations", "step", "backward"):
            tex = docs.latex(c, part)
            assert tex.startswith("\\begin{align*}")
            parts.append(f"\\section*{{{stem.replace('_', chr(92) + '_')}: {part}}}\n{tex}")
    log = compile_tex("\n\n".join(parts), tmp_path, "library")
    assert re.search(r"Output written on library\.pdf \((\d+) pages?", log)


# names of flexdsl's own making, which a page must not show: a state it adds (`_above_threshold`,
# printed `\mathrm{\_above...}`), a gradient's or a temporary's name, the stop-gradient's code name
INTERNAL = re.compile(r"\{\\_|grad\\_|detach|\\tilde\{t\}")


def test_latex_fits_a_page_and_names_only_the_models_quantities(tmp_path):
    """Every library model's equations, step and backward typeset on the article class's own page
    (345 pt of text) with no box more than 20 pt too wide or too high (TeX's log, per model and part),
    and no name that flexdsl made up (Hodgkin–Huxley's backward ran 1184 pt off the page and
    showed `detach(_above_threshold)`)."""
    parts = []
    for stem in MODELS:
        c = flexdsl.compile(stem)
        for part in ("equations", "step", "backward"):
            tex = docs.latex(c, part)
            assert not INTERNAL.search(tex), (stem, part, INTERNAL.search(tex).group(0))
            parts.append(f"\\typeout{{PART {stem} {part}}}\n{tex}\n\\clearpage")
    log = compile_tex("\n".join(parts), tmp_path, "page", page="")
    where, over = "", []
    for line in log.splitlines():
        m = re.match(r"PART (\S+ \S+)", line)
        where = m.group(1) if m else where
        m = re.search(r"Overfull \\[hv]box \(([\d.]+)pt too (wide|high)", line)
        if m:
            over.append((where, float(m.group(1)), m.group(2)))
    assert all(pt <= 20 for _, pt, _ in over), over
    assert re.search(r"Output written on page\.pdf \((\d+) pages", log)


def test_latex_with_user_surrogate_names_and_units_compiles(tmp_path):
    """Names TeX treats specially (`_` in a surrogate's name, `%`, `#`), units, a refractory
    condition, a user surrogate."""
    text = """neuron Odd_Name:
    input I : pA
    param dt = 0.1 ms
    param tau_m = 10 ms
    param R = 0.1 GOhm
    param g_syn = 2 nS learnable
    state v = -70 mV
    state not_refractory_v = 0 mV
    refractory while v > -55 mV
    surrogate my_sur(x, k=1/mV) = k / (1 + abs(k * x))**2
    equations:
        dv/dt = (-70 mV - v + R * I) / tau_m unless refractory
        dnot_refractory_v/dt = -not_refractory_v / tau_m
    spike when v >= -50 mV surrogate my_sur(k=2/mV)
    on spike:
        v = -70 mV
"""
    c = flexdsl.compile(text)
    body = "\n\n".join(docs.latex(c, part) for part in ("equations", "step", "backward"))
    body += "\n\n" + docs.latex("norse_lif") + "\n\n" + docs.latex("alif")  # `fast_sigmoid`, `pseudo_derivative`
    assert r"\text{surrogate fast\_sigmoid}" in body or r"\text{surrogate pseudo\_derivative}" in body
    compile_tex(body, tmp_path, "user")


def test_markdown_math_compiles(tmp_path):
    """Every `$...$` and `$$...$$` of the Markdown pages (GitHub, Jupyter and MkDocs render them
    with MathJax or KaTeX, which define `\\lt` and `\\gt`)."""
    out = tmp_path / "site"
    docs.build(["lif", "adex", "hodgkin_huxley", "alif", "norse_lif", "lif_refractory"], out, plots=False)
    blocks = []
    for md in sorted(out.glob("*.md")):
        text = md.read_text(encoding="utf-8")
        text = re.sub(r"^(`{3,}).*?^\1", "", text, flags=re.S | re.M)  # code blocks are not math
        for m in re.finditer(r"\$\$(.+?)\$\$", text, re.S):
            blocks.append(f"\\[{m.group(1)}\\]")
        inline = re.sub(r"\$\$.+?\$\$", "", text, flags=re.S)
        inline = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", inline)  # code spans are not math
        for m in re.finditer(r"(?<![\\$])\$([^$\n]+?)\$", inline):
            blocks.append(f"${m.group(1)}$\\par")
    assert len(blocks) > 100
    compile_tex("\n".join(blocks), tmp_path, "markdown", "\\newcommand{\\lt}{<}\\newcommand{\\gt}{>}\n")
