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
