"""What the generated pages claim holds: a layer page's Use snippet loads, its sizes are the ones
given at load (never invented), a rule page's params keep their units, the guide's display math is
MathML, the plot's steps are the printed steps, alt text names what a thumbnail shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import flexdsl
from flexdsl.docs import render_layer

ROOT = Path(__file__).resolve().parents[1]


def _use_line(md: str) -> str:
    block = md.split("## Use", 1)[1]
    return next(line for line in block.splitlines() if "flexdsl.load" in line)


@pytest.mark.parametrize("name", ["rlif.layer", "ff_lif.layer"])
def test_layer_page_use_snippet_loads_with_sizes_left_to_the_load(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    md = render_layer(f"neurons/{name}", markdown=True)
    ns: dict = {"flexdsl": flexdsl}
    exec(_use_line(md).strip(), ns)  # (the snippet as a user copies it)
    m = ns["m"]
    hidden = int(re.search(r"hidden=(\d+)", _use_line(md)).group(1))
    n_in = int(re.search(r"in_features=(\d+)", _use_line(md)).group(1))
    out = m(torch.rand(3, 2, n_in))
    assert out.shape[-1] == hidden
    interface = md.split("## Interface", 1)[1].split("##", 1)[0]
    assert "1 of them" not in interface and "1 values per step" not in interface
    assert "given at load" in interface


def test_layer_page_of_a_loaded_layer_shows_its_sizes_and_loads_again(monkeypatch):
    monkeypatch.chdir(ROOT)
    m = flexdsl.load("neurons/rlif.layer", hidden=7, in_features=5)
    md = render_layer(m, markdown=True)
    assert "7 of them" in md and "5 values per step" in md
    ns: dict = {"flexdsl": flexdsl}
    exec(_use_line(md).strip(), ns)
    assert ns["m"](torch.rand(2, 1, 5)).shape == (2, 1, 7)


def test_rule_page_params_keep_the_units_the_file_writes():
    from flexdsl.docs import render_rule

    text = (ROOT / "neurons" / "stdp_song.rule").read_text()
    declared = re.findall(r"param (\w+) = ([0-9.]+) (ms|second|s)\b", text)
    assert len(declared) >= 3  # (dt, taupre, taupost)
    md = render_rule(str(ROOT / "neurons" / "stdp_song.rule"), markdown=True)
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `(\w+)` \| ([^|]+)\|", md, re.M)}
    for name, value, unit in declared:
        assert rows[name] == f"{float(value):g} {unit}", (name, rows[name])
    # (a unit other than the base one is the one the value is in: 0.02 second, not 0.02 ms)
    secs = text.replace("param taupre = 20 ms", "param taupre = 0.02 second")
    md = render_rule(secs, markdown=True)
    assert re.search(r"^\| `taupre` \| 0\.02 second \|", md, re.M)


@pytest.mark.parametrize("model, args", [("lif", ["--T", "30", "--input", "step:1.5@20"]),
                                         ("izhikevich", ["--T", "200", "--input", "step:10@50"])])
def test_run_plot_draws_spikes_and_the_input_at_the_printed_steps(model, args, monkeypatch, capsys, tmp_path):
    from flexdsl.cli import main
    from flexdsl.docs import plots
    from flexdsl.docs.simulate import param_defaults, time_axis

    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figs.append(fig) or Path(path))
    assert main(["run", model, *args, "--plot", str(tmp_path / "x.png")]) == 0
    out = capsys.readouterr().out
    printed = [int(k) for k in re.search(r"at steps \[([^\]]*)\]", out).group(1).split(",")]
    assert printed  # (the first ten spikes, where there are more)
    c = flexdsl.load(model).compiled
    ax_time = time_axis(c, param_defaults(c, {}))
    dt = ax_time.dt if ax_time.unit and ax_time.dt else 1.0
    axes = figs[0].axes
    raster = [seg[0][0] / dt for coll in axes[-1].collections for seg in coll.get_segments()]
    assert raster[:len(printed)] == pytest.approx(printed)
    # (the input rises at its onset step; the membrane's peaks, drawn at the spikes, at the same x)
    onset = int(args[3].split("@")[1])
    xs, ys = axes[0].lines[0].get_data()
    assert xs[list(ys).index(max(ys))] / dt == pytest.approx(onset)
    vx, _ = axes[1].lines[0].get_data()
    drawn_twice = sorted({round(x / dt, 6) for x in vx if list(vx).count(x) > 1})  # (peak then reset at a spike)
    assert drawn_twice[:len(printed)] == pytest.approx(printed)


def test_index_thumbnail_alt_text_says_what_each_thumbnail_shows(tmp_path):
    from html.parser import HTMLParser

    from flexdsl.docs import build

    build([str(ROOT / "neurons" / "stdp_song.rule"), str(ROOT / "neurons" / "tsodyks_markram.rule"), "lif"], tmp_path)
    imgs: list[dict] = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "img":
                imgs.append(dict(attrs))

    P().feed((tmp_path / "index.html").read_text())
    alt = {i["src"]: i["alt"] for i in imgs}
    # (each thumbnail is the figure its page shows under the heading that names it)
    for page, heading, words in (("stdp_song", "## Its window", "STDP window"),
                                 ("tsodyks_markram", "## What it carries", "carries")):
        md = (tmp_path / f"{page}.md").read_text()
        src = re.search(r"!\[[^\]]*\]\(<?([^)>]+)>?\)", md.split(heading, 1)[1]).group(1)
        assert words in alt[src] and "step input" not in alt[src]
    lif = next(s for s in alt if s.startswith("lif"))
    assert "response to a step input" in alt[lif]


def test_suggested_run_is_a_real_step_for_a_model_that_fires_on_its_own(capsys):
    """EIF fires with no input at its defaults: the page's command gives a step that adds spikes."""
    from flexdsl.cli import main
    from flexdsl.docs import render_markdown

    md = render_markdown("eif")
    cmd = next(line for line in md.splitlines() if line.startswith("$ flexdsl run eif"))
    args = cmd.split()[2:]
    args = args[:args.index("--plot")]
    spec = args[args.index("--input") + 1]

    def spikes(spec: str) -> int:
        assert main([*args[:args.index("--input")], "--input", spec, *args[args.index("--input") + 2:]]) == 0
        return int(re.search(r"spikes: (\d+)", capsys.readouterr().out).group(1))

    amp, onset = spec.removeprefix("step:").split("@")
    with_input, alone = spikes(spec), spikes(f"step:0@{onset}")
    assert float(amp) != 0 and with_input > alone
    comment = next(line for line in md.splitlines() if line.startswith("# the step response shown below"))
    assert f"{with_input} spikes" in comment
    assert alone == 0 or f"{alone} without input" in comment


def test_guide_display_math_is_mathml_with_its_spaces_and_text():
    import xml.etree.ElementTree as ET

    from flexdsl.docs.guides import render, to_html

    page = render("language.md")
    prose = re.sub(r"<code[^>]*>.*?</code>", "", page, flags=re.S)  # (`$$…$$` named in code stays code)
    prose = re.sub(r'alttext="[^"]*"', "", prose)  # (the TeX as the formula's alternative text)
    assert "$$" not in prose and "\\text" not in prose and "mathrel" not in prose
    blocks = re.findall(r'<math display="block"[^>]*>.*?</math>', page, re.S)
    delays = next(b for b in blocks if "(dendritic)" in b)
    tree = ET.fromstring(delays)
    texts = [e.text for e in tree.iter("mtext")]
    assert texts == ["(uniform)", "(axonal)", "(synaptic)", "(dendritic)"]
    assert any(e.get("width") == "0.1667em" for e in tree.iter("mspace"))  # (`\,` kept as its space)
    assert any(e.get("width") == "0.2778em" for e in tree.iter("mspace"))  # (`\;`)
    relax = next(b for b in blocks if "linear" in b)
    assert ET.fromstring(relax).find(".//mfrac") is not None
    # (in a code block the TeX stays as written, backslashes and all)
    out = to_html("text\n\n```\n$$a\\,b$$\n```\n\n- item $$a \\;\\text{(x)}$$\n")
    assert "$$a\\,b$$" in out and "<mtext>(x)</mtext>" in out
