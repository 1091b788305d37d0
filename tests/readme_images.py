"""Regenerate the README's picture of a generated page, `docs/images/adex_page.png`:

    python tests/readme_images.py

It screenshots the AdEx page of `flexdsl doc` in headless chromium (the browser tests' helper)
down to its first plot, and records in the PNG a SHA-256 of the page content it shows, which
`test_docs_first_hour.py` compares with the page flexdsl generates today (so the picture cannot
drift from the code unnoticed)."""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "docs" / "images" / "adex_page.png"
KEY = "flexdsl-page-sha256"


def shown_content() -> str:
    """The part of the AdEx page the picture shows (tables and equations as written), without
    plots or version: what the hash covers."""
    import flexdsl.docs as docs

    html = docs.render_html("adex", plots=False, sources=False)
    body = html[html.index("<h1>"):html.index('<h2 id="derived"')]
    return body


def digest() -> str:
    return hashlib.sha256(shown_content().encode("utf-8")).hexdigest()


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from PIL import Image, PngImagePlugin
    from test_docs_browser import ink_box, screenshot

    import flexdsl.docs as docs

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        docs.build(["adex"], out)
        page = out / "adex.html"
        text = page.read_text(encoding="utf-8")
        # down to the end of the first figure's caption
        cut = text.index("</figure>", text.index('<h2 id="plots"')) + len("</figure>")
        page.write_text(text[:cut] + "</div></body></html>", encoding="utf-8")
        shot = screenshot(page, out / "shot.png", (820, 4600))
        box = ink_box(shot)
        assert box is not None
        im = shot.crop((0, 0, 820, min(shot.size[1], box[3] + 16)))
        info = PngImagePlugin.PngInfo()
        info.add_text(KEY, digest())
        info.add_text("Software", "flexdsl doc, screenshot by tests/readme_images.py")
        im.save(IMAGE, pnginfo=info, optimize=True)
    print(f"wrote {IMAGE.relative_to(ROOT)} ({Image.open(IMAGE).size[0]}x{Image.open(IMAGE).size[1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
