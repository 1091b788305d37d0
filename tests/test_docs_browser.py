"""A generated page in a real browser: Debian's headless chromium (installed by .ci/run) takes
screenshots, and the pixels show that the page rendered (not blank), that the MathML is laid out as
math (a fraction stacks: taller than its text on one line) and that the plots are shown.

Without chromium this fails: install it with `apt-get install --no-install-recommends chromium`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageChops

import flexdsl.docs as docs

BROWSERS = ("chromium", "chromium-browser")
TAB_BLUE, TAB_RED = (31, 119, 180), (214, 39, 40)  # the plots' trace and threshold colors


def browser() -> str:
    for b in BROWSERS:
        path = shutil.which(b)
        if path:
            return path
    pytest.fail("chromium is not installed: `apt-get install -y --no-install-recommends chromium` "
                "(.ci/run does this); the docs' browser test needs it")


def screenshot(page: Path, out: Path, size: tuple[int, int]) -> Image.Image:
    profile = out.parent / (out.stem + "-profile")
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           "--force-device-scale-factor=1", f"--user-data-dir={profile}", f"--screenshot={out}",
           f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=5000", page.resolve().as_uri()]
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


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser")
    res = docs.build(["adex"], out)
    assert not res.failed
    return out / "adex.html"


def test_page_renders_with_plots(page, tmp_path):
    shot = screenshot(page, tmp_path / "page.png", (1000, 4200))
    gray = shot.convert("L")
    dark = sum(1 for v in gray.getdata() if v < 200)
    assert dark > 0.02 * shot.size[0] * shot.size[1], "the page looks blank"
    blue, red = near(shot, TAB_BLUE), near(shot, TAB_RED)
    # the same page with the images unreachable: the plots' colors must vanish
    broken = page.with_name("broken.html")
    broken.write_text(re.sub(r'src="([^"]+\.png)"', r'src="missing-\1"', page.read_text()))
    shot2 = screenshot(broken, tmp_path / "broken.png", (1000, 4200))
    blue2, red2 = near(shot2, TAB_BLUE), near(shot2, TAB_RED)
    assert blue > 3000 and red > 300, (blue, red)
    assert blue2 < blue / 20 and red2 < red / 10, (blue2, red2)


def test_mathml_is_laid_out(page, tmp_path):
    """A fraction from the page, rendered alone: as math it stacks (numerator over denominator),
    so its ink is much taller than the same characters set as one line of text."""
    text = page.read_text()
    frac = next(m for m in re.findall(r"<math\b.*?</math>", text, re.S) if "<mfrac>" in m)
    chars = re.sub(r"<[^>]+>", " ", frac)
    style = "<style>body{margin:40px;font-size:48px;background:#fff;color:#000;white-space:nowrap}</style>"
    (tmp_path / "math.html").write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'>{style}</head>"
                                        f"<body>{frac}</body></html>")
    (tmp_path / "text.html").write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'>{style}</head>"
                                        f"<body><span>{chars}</span></body></html>")
    m = ink_box(screenshot(tmp_path / "math.html", tmp_path / "math.png", (3000, 500)))
    t = ink_box(screenshot(tmp_path / "text.html", tmp_path / "text.png", (3000, 500)))
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
