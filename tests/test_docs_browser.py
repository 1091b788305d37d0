"""Generated pages in a real browser: Debian's headless chromium (installed by .ci/run).

- Every page of `flexdsl doc neurons/` (the model pages, the index, the guides) and every Markdown
  page (rendered as GitHub would, CommonMark with tables) is opened, laid out, and measured in the
  browser (`measure.js`): the smallest math actually drawn (no exponent or nested fraction set too
  small to read), multi-letter names never drawn beside another operand without a visible operator,
  bars that span whole names, table values on one line, a visible space between a number and its
  unit, no raw backticks, no shared temporaries, every image loaded.
- Screenshots show that the page rendered (not blank), that the MathML is laid out as math (a
  fraction stacks), that the plots are shown, that a product's dot and an adjoint's bar are drawn,
  and that the notebook display is compact.

Without chromium these tests fail saying how to install it; the rest of the suite runs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageChops

import flexdsl
import flexdsl.docs as docs

BROWSERS = ("chromium", "chromium-browser")
TAB_BLUE, TAB_RED = (31, 119, 180), (214, 39, 40)  # the plots' trace and threshold colors
HERE = Path(__file__).resolve().parent


def browser() -> str:
    for b in BROWSERS:
        path = shutil.which(b)
        if path:
            return path
    pytest.fail("chromium is not installed: `apt-get install -y --no-install-recommends chromium` "
                "(.ci/run does this); the docs' browser tests need it")


def _flags(profile: Path) -> list[str]:
    return [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            "--force-device-scale-factor=1", f"--user-data-dir={profile}"]


def screenshot(page: Path, out: Path, size: tuple[int, int]) -> Image.Image:
    profile = out.parent / (out.stem + "-profile")
    cmd = [*_flags(profile), f"--screenshot={out}", f"--window-size={size[0]},{size[1]}",
           "--virtual-time-budget=5000", page.resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.is_file(), f"no screenshot (exit {r.returncode}):\n{r.stderr[-2000:]}"
    return Image.open(out).convert("RGB")


def near(im: Image.Image, color: tuple[int, int, int], tol: int = 30) -> int:
    """How many pixels are within `tol` of `color` in every channel."""
    bands = []
    for band, c in zip(im.split(), color):
        bands.append(band.point(lambda v, c=c: 255 if abs(v - c) <= tol else 0))
    mask = ImageChops.multiply(ImageChops.multiply(bands[0], bands[1]), bands[2])
    return sum(1 for v in mask.getdata() if v)


def ink_box(im: Image.Image) -> tuple[int, int, int, int] | None:
    """The bounding box of everything that is not (near) white."""
    gray = im.convert("L").point(lambda v: 255 if v < 200 else 0)
    return gray.getbbox()


def _alone(tmp: Path, name: str, markup: str, size: int = 64) -> Path:
    """A page showing `markup` alone, large, black on white."""
    style = f"<style>body{{margin:40px;font-size:{size}px;background:#fff;color:#000;white-space:nowrap}}</style>"
    p = tmp / f"{name}.html"
    p.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'>{style}</head><body>{markup}</body></html>",
                 encoding="utf-8")
    return p


# ------------------------------------------------------------------------------ every page, measured
def _markdown_pages(out: Path) -> list[str]:
    """The Markdown pages rendered as a Markdown viewer would (CommonMark and tables), beside
    them (so that their relative images resolve)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    names = []
    for page in sorted(out.glob("*.md")):
        body = md.render(page.read_text(encoding="utf-8"))
        dst = out / f"{page.stem}.md.html"
        dst.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{page.name}</title></head>"
                       f"<body>{body}</body></html>", encoding="utf-8")
        names.append(dst.name)
    return names


def measure_pages(out: Path, pages: list[str]) -> dict[str, dict]:
    """Open every page (in iframes of one harness page: one browser start) and measure it with
    measure.js; the results come back through the harness's DOM."""
    script = (HERE / "measure.js").read_text(encoding="utf-8")
    harness = out / "harness.html"
    harness.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><pre id='result'></pre>"
                       f"<script>const PAGES = {json.dumps(pages)};\n{script}</script></body></html>",
                       encoding="utf-8")
    profile = out.parent / (out.name + "-measure-profile")
    cmd = [*_flags(profile), "--allow-file-access-from-files", "--window-size=1100,900",
           "--virtual-time-budget=120000", "--run-all-compositor-stages-before-draw", "--dump-dom",
           harness.resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"<pre id=\"result\">(.*?)</pre>", r.stdout, re.S)
    assert m and m.group(1).strip(), f"the harness did not finish (exit {r.returncode}):\n{r.stderr[-2000:]}"
    import html

    return json.loads(html.unescape(m.group(1)))


@pytest.fixture(scope="module")
def measured(library_site):
    out, res, _ = library_site
    assert not res.failed
    html_pages = sorted(p.name for p in out.glob("*.html") if not p.name.endswith(".md.html")
                        and p.name != "harness.html")
    pages = html_pages + _markdown_pages(out)
    return out, measure_pages(out, pages), html_pages


def test_every_page_was_opened(measured):
    out, results, html_pages = measured
    models = flexdsl.library()
    assert set(html_pages) >= {f"{m}.html" for m in models} | {"index.html", "language.html", "units.html",
                                                               "nir.html"}
    assert set(results) >= set(html_pages) | {f"{m}.md.html" for m in models}
    for page, r in results.items():
        assert "error" not in r, (page, r)
        assert r["textLength"] > 500, page  # laid out, with text


def test_images_load(measured):
    _, results, _ = measured
    for page, r in results.items():
        assert not r["brokenImages"], (page, r["brokenImages"])
    assert sum(r["images"] for r in results.values()) >= 2 * 3 * 20  # the plots, on HTML and Markdown pages


def test_math_is_readable(measured):
    """No math token drawn smaller than half the text (8 px; the text is 16 px): the AdEx exponent
    that a raised fraction set at ~5 px now reads `exp(...)` at full size, and equations are in
    display style (a fraction's numerator keeps its size)."""
    _, results, html_pages = measured
    for page in html_pages:
        r = results[page]
        if r["mathTokens"]:
            assert r["minFont"] >= 8.0, (page, r["minFont"], r["minTok"])


def test_names_never_run_together(measured):
    """A multi-letter name (spike, dt, not_refractory) is never drawn right beside another operand
    (a name, a number, an opening bracket) without a visible operator: products show their dot."""
    _, results, html_pages = measured
    for page in html_pages:
        assert not results[page]["touching"], (page, results[page]["touching"][:5])
        for w in results[page]["dotWidths"]:
            assert w > 2, (page, "an invisible product dot")


def test_bars_span_whole_names(measured):
    _, results, html_pages = measured
    bars = 0
    for page in html_pages:
        for b in results[page]["bars"]:
            bars += 1
            assert b["border"] > 0 and b["width"] >= b["inner"] - 0.5, (page, b)
    assert bars > 100  # every backward has them


def test_table_values_are_one_line_and_units_are_spaced(measured):
    _, results, html_pages = measured
    spaces = 0
    for page in html_pages:
        r = results[page]
        for h in r["valueHeights"]:
            assert h["height"] <= 2.4 * h["font"], (page, h)
        for gap in r["unitGaps"]:
            spaces += 1
            assert gap >= 2.0, (page, "a number touching its unit", gap)
    assert spaces >= 30


def test_no_raw_backticks_or_temporaries_in_the_text(measured):
    _, results, _ = measured
    for page, r in results.items():
        assert not r["backticks"], (page, r["backticks"][:3])
        if not page.endswith(".md.html"):
            assert not r["temporaries"], page


def test_markdown_tables_render(measured):
    _, results, _ = measured
    for m in flexdsl.library():
        r = results[f"{m}.md.html"]
        assert r["tables"] >= 2 and not r["rawPipes"], (m, r["rawPipes"][:3])


# ------------------------------------------------------------------------------ screenshots
@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser")
    res = docs.build(["adex"], out)
    assert not res.failed
    return out / "adex.html"


def test_page_renders_with_plots(page, tmp_path):
    shot = screenshot(page, tmp_path / "page.png", (1000, 6000))
    gray = shot.convert("L")
    dark = sum(1 for v in gray.getdata() if v < 200)
    assert dark > 0.02 * shot.size[0] * shot.size[1], "the page looks blank"
    blue, red = near(shot, TAB_BLUE), near(shot, TAB_RED)
    # the same page with the images unreachable: the plots' colors must vanish
    broken = page.with_name("broken.html")
    broken.write_text(re.sub(r'src="([^"]+\.png)"', r'src="missing-\1"', page.read_text()))
    shot2 = screenshot(broken, tmp_path / "broken.png", (1000, 6000))
    blue2, red2 = near(shot2, TAB_BLUE), near(shot2, TAB_RED)
    assert blue > 3000 and red > 300, (blue, red)
    assert blue2 < blue / 20 and red2 < red / 10, (blue2, red2)


def test_mathml_is_laid_out(page, tmp_path):
    """A fraction from the page, rendered alone: as math it stacks (numerator over denominator),
    so its ink is much taller than the same characters set as one line of text."""
    text = page.read_text()
    frac = next(m for m in re.findall(r"<math\b.*?</math>", text, re.S) if "<mfrac>" in m)
    chars = re.sub(r"<[^>]+>", " ", frac)
    m = ink_box(screenshot(_alone(tmp_path, "math", frac, 48), tmp_path / "math.png", (3000, 500)))
    t = ink_box(screenshot(_alone(tmp_path, "text", f"<span>{chars}</span>", 48), tmp_path / "text.png", (3000, 500)))
    assert m is not None and t is not None, "nothing rendered"
    h_math, h_text = m[3] - m[1], t[3] - t[1]
    assert h_math > 1.5 * h_text, (h_math, h_text)
    assert (m[2] - m[0]) < (t[2] - t[0]), "a laid-out fraction is narrower than its characters in a row"


def test_math_shows_on_the_page(page, tmp_path):
    """The equations on the page are drawn: removing the <math> elements changes the pixels of the
    equations' section substantially."""
    text = page.read_text()
    stripped = page.with_name("nomath.html")
    stripped.write_text(re.sub(r"<math\b.*?</math>", "<math></math>", text, flags=re.S))
    a = screenshot(page, tmp_path / "with.png", (1000, 4200))
    b = screenshot(stripped, tmp_path / "without.png", (1000, 4200))
    diff = ImageChops.difference(a, b).convert("L").point(lambda v: 255 if v > 60 else 0)
    changed = sum(1 for v in diff.getdata() if v)
    assert changed > 5000, changed


def test_a_products_dot_is_drawn(page, tmp_path):
    """AdEx's reset `w₂ = b·spike + w₁` from the page: with its dot the ink is wider than with the
    dot made invisible (the operator is really drawn, not just in the markup)."""
    row = next(m for m in re.findall(r"<math\b.*?</math>", page.read_text(), re.S)
               if "<mi>spike</mi>" in m and "<mi>b</mi><mo>\u00b7</mo>" in m)
    hidden = row.replace("<mi>b</mi><mo>\u00b7</mo>", "<mi>b</mi><mo>\u2062</mo>")
    a = ink_box(screenshot(_alone(tmp_path, "dot", row), tmp_path / "dot.png", (2400, 400)))
    b = ink_box(screenshot(_alone(tmp_path, "nodot", hidden), tmp_path / "nodot.png", (2400, 400)))
    assert a is not None and b is not None
    assert (a[2] - a[0]) - (b[2] - b[0]) >= 0.25 * 64, (a, b)


def test_an_adjoints_bar_spans_the_whole_name(tmp_path):
    """The gradient of `spike` from a page: one unbroken rule over the whole word (not a mark over
    each letter)."""
    import sympy as sp

    from flexdsl.docs.printing import mathml

    markup = mathml(sp.Symbol("grad_spike"), adjoints={"grad_spike"})
    im = screenshot(_alone(tmp_path, "bar", markup, 96), tmp_path / "bar.png", (1200, 400)).convert("L")
    box = ink_box(im)
    assert box is not None
    x0, y0, x1, y1 = box
    width = x1 - x0
    longest = 0
    for y in range(y0, y0 + max(4, (y1 - y0) // 8)):
        run = best = 0
        for x in range(x0, x1):
            run = run + 1 if im.getpixel((x, y)) < 128 else 0
            best = max(best, run)
        longest = max(longest, best)
    assert longest >= 0.9 * width, (longest, width)


def test_notebook_display_is_compact(tmp_path):
    m = flexdsl.load("hodgkin_huxley")
    frag = m._repr_html_()
    p = tmp_path / "nb.html"
    p.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{frag}</body></html>",
                 encoding="utf-8")
    shot = screenshot(p, tmp_path / "nb.png", (1000, 5000))
    box = ink_box(shot)
    assert box is not None and box[3] < 2200, box  # the full page is over 9000 px tall
