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
