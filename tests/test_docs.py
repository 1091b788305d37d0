"""`flexdsl doc` / `flexdsl.docs`: the pages of every packaged model, checked for their content
(tables against the model files, MathML that parses, plots that are real PNGs, the derived step
and backward, the generated code), the index, the Markdown pages, and escaped user text."""

from __future__ import annotations

import base64
import io
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

import flexdsl
import flexdsl.docs as docs

sys.path.insert(0, str(Path(__file__).parent))
from htmltree import parse, rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NEURONS = ROOT / "neurons"
PNG = b"\x89PNG\r\n\x1a\n"
MODELS = flexdsl.library()
LAYERS = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "neurons").glob("*.layer"))
RULES = flexdsl.rules()
MATHML = "{http://www.w3.org/1998/Math/MathML}"


@pytest.fixture(scope="module")
def site(library_site):
    out, res, seen = library_site
    return out, res, seen, res.seconds


def _png_ok(path: Path, min_size=(100, 50)) -> Image.Image:
    data = path.read_bytes()
    assert data[:8] == PNG, path
    im = Image.open(io.BytesIO(data))
    im.verify()
    im = Image.open(io.BytesIO(data)).convert("L")
    assert im.size[0] >= min_size[0] and im.size[1] >= min_size[1], (path, im.size)
    lo, hi = im.getextrema()
    assert hi - lo > 100, f"{path} is blank"
    return im


def _source_line(stem: str, line: int) -> str:
    return (NEURONS / f"{stem}.neuron").read_text().splitlines()[line - 1].strip()


def test_build_writes_every_model(site):
    out, res, seen, seconds = site
    assert not res.failed, res.failed
    # (a directory's layers and plasticity rules have pages too)
    assert sorted(p.stem for p in res.pages) == sorted(MODELS + LAYERS + RULES)
    assert LAYERS and RULES  # (the library ships layers and rules)
    n = len(MODELS) + len(LAYERS) + len(RULES)
    assert [k for k, _, _ in seen] == list(range(1, n + 1))  # progress once per model, in order
    assert all(m == n for _, m, _ in seen)
    assert (out / "language.md").read_text() == (ROOT / "docs" / "language.md").read_text()


@pytest.mark.parametrize("stem", MODELS)
def test_page_content(site, stem):
    out, _, _, _ = site
    c = flexdsl.compile(stem)
    ck = c.checked
    text = (out / f"{stem}.html").read_text(encoding="utf-8")
    doc = parse(text)
    assert ck.name in doc.find("h1").text()
    summary = ck.ast.doc.strip().splitlines()[0].strip()
    assert summary in doc.find("p", cls="summary").text()
    if "Reference:" in ck.ast.doc:
        ref = doc.find("p", cls="reference").text()
        first = ck.ast.doc.split("Reference:")[1].split()[:4]
        # `code` spans are shown as code: their backticks are not on the page
        assert " ".join(first).replace("`", "") in " ".join(ref.split())
        assert "`" not in ref

    # tables, against the model file itself (read here with regexes, not through flexdsl)
    src = (NEURONS / f"{stem}.neuron").read_text()
    decl = {m.group(2): m for m in re.finditer(
        r'^\s*(input|param|state)\s+([A-Za-z]\w*)\s*(?::\s*[^"]*?)?(?:=\s*(.*?))?\s*(where .*?)?\s*(learnable)?\s*'
        r'(?:"([^"]*)")?\s*$',
        src, re.M)}
    inputs = rows(doc.find("table", cls="inputs"))
    assert len(inputs) == len(ck.inputs)
    for r, i in zip(inputs, ck.inputs):
        assert i.name in r[0] and decl[i.name].group(6) == r[1]
    params = rows(doc.find("table", cls="params")) if ck.params else []
    assert len(params) == len(ck.params)
    for r, p in zip(params, ck.params):
        m = decl[p.name]
        assert p.name in r[0]
        default = m.group(3)
        if ck.units is not None:  # `0.1 ms`, `0.02 / ms`: the number, in the declared unit (its own column)
            with_unit = re.fullmatch(r"(-?[\d.]+(?:e-?\d+)?)\s*(?:1\s*/\s*|/\s*)?[A-Za-z][A-Za-z/*\d ]*", default)
            default = with_unit.group(1) if with_unit else default
        if re.fullmatch(r"-?[\d.]+(e-?\d+)?", default):
            assert r[1].replace(" ", "").startswith(default.replace("-", "-")) or float(default) == float(
                r[1].replace("\u2212", "-").split()[0]), (r[1], default)
        else:
            assert "=" in r[1]  # an expression: its value is shown too
        assert (r[2] != "") == (m.group(4) is not None), r
        assert (r[3] == "yes") == (m.group(5) is not None), r
        assert r[4] == (m.group(6) or "")
    states = rows(doc.find("table", cls="states"))
    own = [s for s in ck.states if not s.meta.get("hidden")]  # not the bookkeeping of refractoriness
    assert len(states) == len(own)
    for r, s in zip(states, own):
        assert s.name in r[0] and r[2] == (decl[s.name].group(6) or "")

    # every <math> element is well-formed MathML
    maths = re.findall(r"<math\b.*?</math>", text, re.S)
    assert len(maths) >= 5
    for mth in maths:
        el = ET.fromstring(mth)
        assert el.tag == MATHML + "math" and len(el) >= 1

    # the equations as written: one row per statement, quoting its line
    written = [n for n in doc.find_all("table", cls="written")]
    n_statements = len(ck.update) + len(ck.on_spike) + (1 if ck.spike else 0)
    n_statements += len(ck.equations.lines) if ck.equations else 0
    n_statements += 1 if ck.refractory is not None else 0
    assert sum(len(rows(t)) for t in written) == n_statements
    shown = " ".join(" ".join(t.text().split()) for t in written)
    for held in re.findall(r"^\s*(?:d\w+/dt|\w+)\s*[-+*/]?=.*unless refractory", src, re.M):
        assert "unless refractory" in shown, held
    for st in [*ck.update, *ck.on_spike]:
        assert f"line {st.pos.line}: {_source_line(stem, st.pos.line)}" in " ".join(doc.text().split())

    # what the compiler derived
    # (the shared subexpressions `_t…` of the generated code are substituted back: a reader sees
    # only the model's own quantities)
    def named(assignments):
        return [y for y, _ in assignments if not re.fullmatch(r"(grad_)?_t(_\d+)?", y.name)]

    step_rows = rows(doc.find("table", cls="step"))
    assert len(step_rows) == len(named(c.step.assignments))
    assert len(rows(doc.find("table", cls="backward"))) == len(named(c.backward.assignments))
    derived_text = doc.find("table", cls="step").text() + doc.find("table", cls="backward").text()
    assert "t\u0303" not in derived_text
    grads = rows(doc.find("table", cls="gradients"))
    assert len(grads) == len(ck.inputs) + len(ck.states) + sum(p.learnable for p in ck.params)
    if ck.equations is not None:
        method = re.search(r"equations(?: method (\w+))?:", src).group(1)
        assert f"<strong>{method or c.step.method}</strong>" in text
        if method is None:
            assert "chosen automatically" in text
    derived = doc.find("h2", id="derived")
    assert derived is not None

    # plots: PNG files beside the page
    imgs = [i.attrs["src"] for i in doc.iter("img")]
    want = 3 if ck.spike is not None else 1
    assert len(imgs) == want, imgs
    for s in imgs:
        assert "/" not in s and not s.startswith("data:")
        _png_ok(out / s)
    caption = " ".join(doc.find("figure").find("figcaption").text().split())
    if ck.spike is not None:  # the library's spiking models do spike in their step response
        n = int(re.search(r"(\d+) spikes?\.", caption).group(1))
        assert n >= 1, caption

    # generated code, collapsed
    details = doc.find_all("details")
    codes = " ".join(d.text() for d in details)
    assert "def core(" in codes and "@triton.jit" in codes and "neuron " + ck.name in codes


def test_index(site):
    out, _, _, _ = site
    doc = parse((out / "index.html").read_text(encoding="utf-8"))
    cards = doc.find_all("div", cls="card")
    assert len(cards) == len(MODELS) + len(LAYERS) + len(RULES)
    linked = set()
    for card in cards:
        hrefs = [a.attrs["href"] for a in card.iter("a")]
        page = next(h for h in hrefs if h.endswith(".html"))
        assert (out / page).is_file()
        if Path(page).stem in LAYERS:  # (a layer's card: its kind and summary, no plot)
            assert "layer" in card.text()
            continue
        if Path(page).stem in RULES:  # (a rule's card: its kind, its STDP window as the picture)
            assert "plasticity rule" in card.text()
            _png_ok(out / card.find("img").attrs["src"], (100, 40))
            continue
        linked.add(Path(page).stem)
        img = card.find("img")
        _png_ok(out / img.attrs["src"], (100, 40))
        stem = Path(page).stem
        summary = flexdsl.compile(stem).checked.ast.doc.strip().splitlines()[0].strip()
        assert summary in card.text()
    assert linked == set(MODELS)
    md = (out / "index.md").read_text()
    for stem in MODELS:
        assert f"(<{stem}.md>)" in md


@pytest.mark.parametrize("stem", ["lif", "adex", "li", "hodgkin_huxley"])
def test_markdown_page(site, stem):
    out, _, _, _ = site
    md = (out / f"{stem}.md").read_text()
    ck = flexdsl.compile(stem).checked
    assert md.startswith(f"[\u2190 all models](index.md) \u00b7 [language reference](<language.md>)\n\n# {ck.name}")
    assert "| name | default | constraint | learnable | description | unit |" in md
    assert "$$\n\\begin{aligned}" in md
    for src in re.findall(r"!\[[^\]]*\]\(<([^>]+)>\)", md):
        _png_ok(out / src)
    assert "<script" not in md


HOSTILE = '''neuron Hostile:
    """<script>alert("doc")</script> & <b>bold</b> \u2014 first line.

    Body with [a link](javascript:alert(1)) and $x$ and `ticks` ``` and <img src=x onerror=alert(2)>.

    Reference: <i>nobody</i> & co."""
    input x                      "<script>alert('in')</script>"
    param tau = 2.0 where tau > 1    "tau </td></tr></table><script>alert('p')</script> | pipe"
    state v = 0.0                "<img src=y onerror=alert(3)>"
    update:
        v = v + (x - v) / tau
    spike when v >= 1.0
    on spike:
        v = 0.0
'''


def _no_foreign_tags(html_text: str, figures: int) -> None:
    doc = parse(html_text)
    assert not list(doc.iter("script"))
    assert not list(doc.iter("b")) and not list(doc.iter("i"))
    imgs = list(doc.iter("img"))
    assert len(imgs) == figures, [i.attrs for i in imgs]
    for i in imgs:
        assert set(i.attrs) <= {"src", "alt", "width", "height"}
        assert i.attrs["src"].endswith(".png") or i.attrs["src"].startswith("data:image/png;base64,")


def test_user_text_is_escaped(tmp_path):
    p = tmp_path / "we<i>rd & co.neuron"
    p.write_text(HOSTILE)
    out = tmp_path / "out"
    res = docs.build([p], out)
    assert not res.failed, res.failed
    (page,) = res.pages
    text = page.read_text(encoding="utf-8")
    _no_foreign_tags(text, 3)
    assert "&lt;script&gt;alert(&#34;doc&#34;)&lt;/script&gt;" in text or "&lt;script&gt;alert(&quot;doc&quot;)" in text
    assert "we&lt;i&gt;rd &amp; co.neuron" in text
    doc = parse(text)
    assert '<script>alert("doc")</script>' in doc.find("p", cls="summary").text()  # shown as text
    assert "<script>alert('p')</script> | pipe" in " ".join(rows(doc.find("table", cls="params"))[0])
    index = (out / "index.html").read_text(encoding="utf-8")
    _no_foreign_tags(index, 1)
    # Markdown: no raw HTML from the user, and no Markdown constructs (links, code, math) either
    md = (out / f"{Path(page).stem}.md").read_text(encoding="utf-8")
    # fenced blocks and code spans show their content as text (a fence or span closes only with as
    # many backticks): what remains is where HTML would be interpreted
    visible = re.sub(r"^(`{3,})[^\n]*\n.*?^\1[ \t]*$", "", md, flags=re.S | re.M)
    visible = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", visible)
    assert "<script" not in visible and "<img" not in visible and "<i>" not in visible
    assert "](javascript:" not in visible
    assert "&lt;script&gt;" in md
    assert "\\[a link\\]" in md and "\\$x\\$" in md
    assert "tau &lt;/td&gt;&lt;/tr&gt;&lt;/table&gt;&lt;script&gt;alert\\('p'\\)&lt;/script&gt; \\| pipe" in md


def test_notebook_fragment_and_inline_images():
    c = flexdsl.loads(HOSTILE).compiled
    frag = c._repr_html_()
    _no_foreign_tags(frag, 0)
    assert frag.lstrip().startswith('<div class="flexdsl-doc">')
    assert "<html" not in frag and "<math" in frag
    page = docs.render_html(c)  # plots embedded: a self-contained page
    _no_foreign_tags(page, 3)
    for src in re.findall(r'src="(data:image/png;base64,[^"]+)"', page):
        data = base64.b64decode(src.split(",", 1)[1])
        assert data[:8] == PNG
    m = flexdsl.load("lif", tau=3.0)
    frag = m._repr_html_()
    table = parse(frag).find("table", cls="params")
    assert "current value" in table.text()
    assert rows(table)[0][2] == "3"  # tau's current value beside its default 2.0


def test_latex_for_papers_and_notebooks():
    c = flexdsl.compile("lif")
    tex = c.latex()
    assert tex.startswith("\\begin{align*}") and tex.endswith("\\end{align*}")
    assert r"v &\leftarrow v + \frac{x - \left(v - v_{\mathrm{reset}}\right)}{\tau}" in tex
    assert r"\mathrm{spike} &= \left[v \geq v_{\mathrm{threshold}}\right]" in tex
    assert r"v &\leftarrow v_{\mathrm{reset}} \tag*{\text{on spike}}" in tex
    step = c.latex("step")
    assert r"\mathrm{spike} &= \left[u_{\mathrm{spike}} \geq 0\right]" in step
    back = c.latex("backward")
    assert r"\frac{\partial L}{\partial x}" in back
    nb = c._repr_latex_()
    assert nb.startswith("$$\\begin{aligned}") and nb.endswith("\\end{aligned}$$")
    assert flexdsl.load("lif")._repr_latex_() == nb
    with pytest.raises(flexdsl.FlexDSLError):
        c.latex("nonsense")
    ode = flexdsl.compile("lif_ode").latex()
    assert r"\frac{\mathrm{d}v}{\mathrm{d}t} &= " in ode


def test_equations_with_units_are_shown_as_written():
    """A model with units is documented as its author wrote it: units upright, no conversion
    factors to base units, `unless refractory` and the refractory period kept."""
    src = """neuron R:
    input I : nA
    param dt = 0.1 ms
    param tau_m = 10 ms
    param R = 50 Mohm where R > 0
    param v_rest = -70 mV
    state v = v_rest
    refractory 2 ms
    equations method exact:
        dv/dt = (v_rest - v + R * I) / tau_m unless refractory
    spike when v > -50 mV
    on spike:
        v = v_rest
"""
    c = flexdsl.compile(src)
    tex = c.latex()
    assert r"\frac{v_{\mathrm{rest}} - v + R I}{\tau_{\mathrm{m}}} \quad \text{unless refractory}" in tex
    assert r"\mathrm{refractory} &= 2\,\mathrm{ms}" in tex  # a number and its unit: a thin space
    assert r"\left[v > - 50\,\mathrm{mV}\right]" in tex
    assert "1000" not in tex and "0.001" not in tex
    page = docs.render_html(c, plots=False, sources=False)
    assert '<mi mathvariant="normal">ms</mi>' in page and '<mi mathvariant="normal">mV</mi>' in page
    params = {r[0].split()[0]: r for r in rows(parse(page).find("table", cls="params"))}
    assert params["R"][1] == "50" and params["R"][-1] == "M\u03a9"  # the number; its unit has its column
    assert params["R"][2].replace(" ", "") == "R>0"  # as written: no factor to base units


def test_build_reports_a_bad_model_and_writes_the_others(tmp_path):
    bad = tmp_path / "bad.neuron"
    bad.write_text("neuron Bad:\n    input x\n    state v = q\n")
    res = docs.build(["lif", bad], tmp_path / "out", plots=False)
    assert [p.name for p in res.pages] == ["lif.html"]
    (label, err), = res.failed
    assert label == str(bad) and err.line == 3
    index = (tmp_path / "out" / "index.html").read_text()
    assert "Not documented" in index and "unknown name `q`" in index


def test_same_stem_twice_gets_two_pages(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "lif.neuron").write_text((NEURONS / "lif.neuron").read_text())
    (b / "lif.neuron").write_text((NEURONS / "if.neuron").read_text())
    res = docs.build([a / "lif.neuron", b / "lif.neuron", "lif"], tmp_path / "out", plots=False)
    assert sorted(p.name for p in res.pages) == ["lif-2.html", "lif-3.html", "lif.html"]


def test_a_model_that_cannot_run_still_gets_a_page(tmp_path, monkeypatch):
    import flexdsl.docs.figures as figures

    def refuse(c, *a, **k):
        raise flexdsl.FlexDSLError("with these params the step is not defined", c.filename)

    monkeypatch.setattr(figures, "explore", refuse)
    res = docs.build(["lif"], tmp_path / "out")
    assert not res.failed
    html_text = res.pages[0].read_text()
    assert "No plots: the model cannot run with its default params. with these params" in html_text
    assert "<img" not in html_text and "<math" in html_text


def test_a_model_that_diverges_says_so(tmp_path):
    text = """neuron Blowup:
    \"\"\"Divides by a param that is zero by default.\"\"\"
    input x
    param k = 0.0
    state v = 0.0
    update:
        v = v + x / k
    spike when v >= 1.0
    on spike:
        v = 0.0
"""
    p = tmp_path / "blowup.neuron"
    p.write_text(text)
    res = docs.build([p], tmp_path / "out")
    assert not res.failed
    html_text = " ".join(res.pages[0].read_text().split())
    assert "cannot run with its default params" in html_text and "divides by zero" in html_text
    # a model that runs but blows up: the page says so under its plots
    q = tmp_path / "square.neuron"
    q.write_text("""neuron Square:
    \"\"\"Squares its state: diverges for any input above 1.\"\"\"
    input x
    state v = 0.0
    update:
        v = v * v + x + 2
""")
    res = docs.build([q], tmp_path / "out2")
    assert not res.failed
    assert "not finite" in res.pages[0].read_text()


def test_summary_is_the_first_sentence_even_when_wrapped():
    from flexdsl.docs.content import split_doc

    summary, blocks, ref = split_doc("""Leaky integrator with a long summary that the author wrapped, e.g.
        over two lines. A second sentence.

        A paragraph.

        Reference: Someone (2001).""")
    assert summary == "Leaky integrator with a long summary that the author wrapped, e.g. over two lines."
    assert blocks == [("p", "A second sentence."), ("p", "A paragraph.")] and ref == "Someone (2001)."
    assert split_doc("One line.\n\nRest.")[:2] == ("One line.", [("p", "Rest.")])


# ------------------------------------------------------------------------------ plots and captions
def _fi_numbers(out: Path, stem: str) -> tuple[list[float], list[float]]:
    lines = (out / f"{stem}.fi.csv").read_text().strip().splitlines()
    rows_ = [ln.split(",") for ln in lines[1:]]
    return [float(r[0]) for r in rows_], [float(r[2]) for r in rows_]


SPIKING = [m for m in MODELS if flexdsl.compile(m).checked.spike is not None]


@pytest.mark.parametrize("stem", ["adex", "hodgkin_huxley", "izhikevich_2003", "lif_ode", "lif_refractory",
                                  "morris_lecar", "qif", "eif", "lif"])
def test_fi_rates_are_interspike_rates_not_a_window_staircase(site, stem):
    """The rate is 1 / the mean interval between spikes, not spikes / window: firing amplitudes
    with at least two spikes give distinct rates (a count over a short window repeats the same
    few multiples of 1 / window); in models with a time unit, the curve rises with the input."""
    out, _, _, _ = site
    amps, rates = _fi_numbers(out, stem)
    lines = (out / f"{stem}.fi.csv").read_text().strip().splitlines()[1:]
    spikes = [int(ln.split(",")[1]) for ln in lines]
    multi = [r for r, n in zip(rates, spikes) if n >= 2]
    assert len(multi) >= 3, (stem, spikes)
    if stem in ("adex", "hodgkin_huxley", "izhikevich_2003", "lif_ode", "lif_refractory", "morris_lecar"):
        # (interspike intervals are whole steps: two amplitudes may share a rate, but few do)
        assert len(set(multi)) >= 0.8 * len(multi), (stem, multi)
        window = re.search(r"window of ([\d.]+) (\w+)", (out / f"{stem}.html").read_text()).group(1)
        quantum = 1 / (float(window) * 1e-3)  # one spike per window, in Hz (the time unit is ms here)
        # a count over the window would give only multiples of the quantum
        assert any(abs(r / quantum - round(r / quantum)) > 0.05 for r in multi), (multi, quantum)


def test_legends_never_cover_data():
    """Each figure's legend lies outside every axes of the figure (drawn, then measured)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from flexdsl.docs import plots
    from flexdsl.docs.explore import explore
    from flexdsl.docs.fi import fi_curve
    from flexdsl.docs.figures import _response

    for stem in ("adex", "alif", "lif", "hodgkin_huxley"):
        c = flexdsl.compile(stem)
        ex = explore(c)
        run, lane, _ = _response(c, ex)
        for fig in (plots.draw_response(c, run, lane, ex.time), plots.draw_fi(c, fi_curve(c, ex, ex.lane)),
                    plots.draw_surrogate(c)):
            FigureCanvasAgg(fig).draw()
            legends = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
            assert legends, stem
            for leg in legends:
                box = leg.get_window_extent()
                for ax in fig.axes:
                    assert not box.overlaps(ax.get_window_extent()), (stem, leg.get_texts()[0].get_text())


def test_surrogate_heading_and_axes_keep_units(tmp_path):
    text = """neuron Q:
    input I : pA
    param dt = 0.1 ms
    param tau = 10 ms
    param R = 0.1 GOhm
    state v = -70 mV
    equations:
        dv/dt = (-70 mV - v + R * I) / tau
    spike when v >= -50 mV surrogate atan(alpha=0.5/mV)
    on spike:
        v = -70 mV
"""
    c = flexdsl.compile(text)
    page = docs.render_html(c, plots=False, sources=False)
    assert "Surrogate <code>atan(alpha=0.5/mV)</code>" in page
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from flexdsl.docs import plots

    fig = plots.draw_surrogate(c, "atan(alpha=0.5/mV)")
    FigureCanvasAgg(fig).draw()
    assert "0.5/mV" in fig._suptitle.get_text()
    assert all("(mV;" in a.get_xlabel() for a in fig.axes)
    assert fig.axes[1].get_ylabel() == "S\u2032 (1/mV)"
    # values with units print with a space between number and unit, in MathML and in LaTeX
    assert '<mn>70</mn><mspace width="0.1667em"/><mi mathvariant="normal">mV</mi>' in page
    assert r"70\,\mathrm{mV}" in c.latex()


@pytest.mark.parametrize("stem", SPIKING)
def test_the_suggested_run_command_spikes(site, stem, capsys):
    """The page's `flexdsl run` command (chosen from the model's own scan) makes the model spike,
    as many times as the page says, and the run prints the input's unit."""
    from flexdsl import cli

    out, _, _, _ = site
    text = next(p.text() for p in parse((out / f"{stem}.html").read_text(encoding="utf-8")).iter("pre")
                if "flexdsl.load(" in p.text())
    cmd = re.search(r"\$ flexdsl run (\S+) (.*?) --plot out\.png", text)
    said = int(re.search(r": (\d+) spikes?\n", text).group(1))
    args = cmd.group(2).split()
    assert cmd.group(1) == stem and "--input" in args
    assert cli.main(["run", stem, *args]) == 0
    printed = capsys.readouterr().out
    n = int(re.search(r"spikes: (\d+)", printed).group(1))
    assert n == said and n >= 1, printed
    unit = flexdsl.compile(stem).checked.inputs[0].meta.get("unit")
    if unit:
        assert f"(in {docs.units.display(unit)}, the input's unit)" in printed
        assert f" {docs.units.display(unit)} from step" in text  # the command's comment says it too


# ------------------------------------------------------------------------------ the site's links
def test_guides_are_html_pages_and_every_link_works(site):
    """The language reference, units and NIR guides are HTML pages of the site; every relative
    link of every page (models, index, guides) opens a file of the site, and every #anchor names an
    element of its target."""
    out, _, _, _ = site
    for g in ("language", "units", "nir"):
        assert (out / f"{g}.html").is_file() and (out / f"{g}.md").is_file()
    ids: dict[str, set[str]] = {}

    def anchors(page: Path) -> set[str]:
        if page.name not in ids:
            doc = parse(page.read_text(encoding="utf-8"))
            ids[page.name] = {n.attrs["id"] for n in doc.iter() if n.attrs.get("id")}
        return ids[page.name]

    checked = 0
    # (the browser tests add `*.md.html` renders and a harness beside the pages: not the site's)
    for page in sorted(p for p in out.glob("*.html") if not p.name.endswith(".md.html") and p.name != "harness.html"):
        doc = parse(page.read_text(encoding="utf-8"))
        for a in doc.iter("a"):
            href = a.attrs.get("href") or ""
            if href.startswith(("http://", "https://", "data:", "mailto:")):
                continue
            target, _, frag = href.partition("#")
            dest = out / target if target else page
            assert dest.is_file(), (page.name, href)
            if frag and dest.suffix == ".html":
                assert frag in anchors(dest), (page.name, href)
            checked += 1
    assert checked > 150  # (the model pages, the index and the guides: about 200 links)
    index = parse((out / "index.html").read_text(encoding="utf-8"))
    hrefs = {a.attrs["href"] for a in index.iter("a")}
    assert {"language.html", "units.html", "nir.html"} <= hrefs
    lif = parse((out / "lif.html").read_text(encoding="utf-8"))
    assert "language.html" in {a.attrs["href"] for a in lif.iter("a")}
    language = (out / "language.html").read_text(encoding="utf-8")
    assert 'href="units.html#2-refractoriness"' in language and 'href="nir.html"' in language
    assert "$\\alpha" not in language and language.count("<math") >= 14  # the surrogate table's formulas


def test_pages_show_no_markers_markdown_links_or_internal_names(site):
    """No HTML page of the site shows the reference generator's `<!-- BEGIN GENERATED -->` markers
    (as text or as table rows), links to a `.md` file (the HTML page of that document instead) or
    names one as a link's text, or shows a name of flexdsl's making in its math (a bookkeeping state's
    `_above_threshold`, `detach`, a temporary t̃); nor does the LaTeX of the Markdown pages."""
    out, _, _, _ = site
    pages = sorted(p for p in out.glob("*.html") if not p.name.endswith(".md.html") and p.name != "harness.html")
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "&lt;!--" not in text and "GENERATED:" not in text, page.name
        for a in parse(text).iter("a"):
            target = (a.attrs.get("href") or "").partition("#")[0]
            assert not target.endswith(".md"), (page.name, target)
            assert not a.text().strip().endswith(".md"), (page.name, a.text())
        for mth in re.findall(r"<math\b.*?</math>", text, re.S):
            tokens = re.findall(r"<m[io]\b[^>]*>([^<]*)</m[io]>", mth)
            assert not [s for s in tokens if s.startswith("_") or s in ("detach", "t\u0303")], (page.name, mth[:300])
    for md in sorted(out.glob("*.md")):
        text = re.sub(r"^(`{3,}).*?^\1", "", md.read_text(encoding="utf-8"), flags=re.S | re.M)
        for m in re.finditer(r"\$\$(.+?)\$\$|\$([^$\n]+)\$", text, re.S):
            tex = m.group(1) or m.group(2)
            assert not re.search(r"\{\\_|grad\\_|detach|\\tilde\{t\}", tex), (md.name, tex[:300])


# ------------------------------------------------------------------------------ what a reader sees
@pytest.mark.parametrize("stem", MODELS)
def test_page_math_reads_as_math(site, stem):
    """The markup behind what the browser shows: names of several letters never touch another
    factor (a visible · between them), bars span whole names (no combining overline per letter), a
    raised exponent is never a sum or a fraction (exp(...) instead), table values are on one line
    (no fraction bars), a number and its unit have a space between them, no shared temporaries and
    no raw backticks in the text."""
    out, _, _, _ = site
    text = (out / f"{stem}.html").read_text(encoding="utf-8")
    maths = re.findall(r"<math\b.*?</math>", text, re.S)
    for mth in maths:
        el = ET.fromstring(mth)
        _products_are_explicit(el)
        for sup in el.iter(MATHML + "msup"):
            base, ex = list(sup)
            if base.tag == MATHML + "mi" and base.text == "e":
                assert not list(ex.iter(MATHML + "mfrac")) and not any(
                    o.text in ("+", "\u2212") for o in ex.iter(MATHML + "mo") if len(list(ex)) > 2), mth
        assert "\u0305" not in mth  # combining overline
    doc = parse(text)
    for table in ("params", "states"):
        t = doc.find("table", cls=table)
        if t is not None:
            for cell in t.find_all("div", cls="value"):
                assert "<mfrac" not in str(cell.text()), cell
    for mth in re.findall(r'<div class="value">(.*?)</div>', text, re.S):
        assert "<mfrac" not in mth, mth
    assert "t\u0303" not in text  # no shared temporaries on the page
    visible = re.sub(r"<(pre|code|math)\b.*?</\1>", "", text, flags=re.S)
    assert "`" not in re.sub(r"<[^>]+>", "", visible)


def _tokens(el):
    """The token elements of a MathML tree in order (mi, mn, mo, mspace, mtext)."""
    for n in el.iter():
        if n.tag.rsplit("}", 1)[-1] in ("mi", "mn", "mo", "mspace", "mtext"):
            yield n


def _products_are_explicit(el) -> None:
    """In every row, a multi-letter upright name is never directly beside another operand: an
    operator (·, +, =, ...) or a space comes between."""
    for row in el.iter():
        kids = list(row)
        tag = row.tag.rsplit("}", 1)[-1]
        if tag not in ("mrow", "math"):
            continue
        for a, b in zip(kids, kids[1:]):
            ta, tb = a.tag.rsplit("}", 1)[-1], b.tag.rsplit("}", 1)[-1]
            if "mo" in (ta, tb) or "mspace" in (ta, tb):
                continue

            def word(n) -> bool:
                last = n if n.tag.endswith("}mi") else None
                if last is None:
                    toks = [t for t in _tokens(n)]
                    last = toks[-1] if toks else None
                return last is not None and last.tag.endswith("}mi") and len(last.text or "") > 1 and \
                    (last.text or "") not in ("exp",)

            def first_word(n) -> bool:
                toks = [t for t in _tokens(n)] if not n.tag.endswith("}mi") else [n]
                return bool(toks) and toks[0].tag.endswith("}mi") and len(toks[0].text or "") > 1
            # two operands side by side: neither may be a multi-letter name at the touching edge
            assert not (word(a) or first_word(b)), ET.tostring(row, encoding="unicode")[:300]
