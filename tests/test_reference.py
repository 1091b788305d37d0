"""The language reference (docs/language.md) against the code: its generated tables equal what the
registries produce now; every function, surrogate, method and constant of the catalog is listed and
every name it lists exists; its examples compile; its links resolve; the command line it documents
is the one argparse knows; and nothing points users at documents they do not have."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import flexdsl
from flexdsl.cli import build_parser
from flexdsl.docs import reference
from flexdsl.frontend.catalog import CONSTANTS, FUNCTIONS, METHOD_ALIASES, METHODS, SURROGATES
from flexdsl.frontend.parse import RESERVED

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "language.md"
TEXT = DOC.read_text(encoding="utf-8")


def test_generated_sections_are_up_to_date():
    assert reference.regenerate(TEXT) == TEXT, (
        "docs/language.md differs from the registries: run `python -m flexdsl.docs.reference`")


def test_check_command_detects_drift(tmp_path):
    stale = tmp_path / "language.md"
    stale.write_text(TEXT.replace("| `exp(x)` | exponential |\n", ""))
    env = {"PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "flexdsl.docs.reference", "--check", str(stale)],
                       capture_output=True, text=True, env={**__import__("os").environ, **env})
    assert r.returncode == 1 and "out of date" in r.stderr
    r = subprocess.run([sys.executable, "-m", "flexdsl.docs.reference", str(stale)], capture_output=True, text=True,
                       env={**__import__("os").environ, **env})
    assert r.returncode == 0 and stale.read_text() == TEXT


def _first_column(section: str) -> list[str]:
    names = []
    for line in reference.sections(TEXT)[section].splitlines()[2:]:
        cell = line.split("|")[1].strip()
        m = re.fullmatch(r"`([A-Za-z_]\w*)(\(.*\))?`", cell)
        assert m, f"{section}: a row without a name: {line}"
        names.append(m.group(1))
    return names


def test_catalog_and_reference_agree():
    assert _first_column("functions") == list(FUNCTIONS)
    assert _first_column("surrogates") == list(SURROGATES)
    assert _first_column("methods") == list(METHODS)
    assert _first_column("constants") == list(CONSTANTS)
    listed_aliases = re.findall(r"`(\w+)`", " ".join(
        line.split("|")[2] for line in reference.sections(TEXT)["methods"].splitlines()[2:]))
    assert sorted(listed_aliases) == sorted(METHOD_ALIASES)
    assert sorted(re.findall(r"`(\w+)`", reference.sections(TEXT)["reserved"])) == sorted(RESERVED)
    for name, s in SURROGATES.items():  # keyword defaults as in the catalog
        call = name + "(" + ", ".join(f"{k}={v!r}" for k, v in s.defaults.items()) + ")"
        assert f"`{call}`" in reference.sections(TEXT)["surrogates"]


def test_every_name_used_in_the_prose_exists():
    """Outside the generated tables too: `surrogate NAME(...)` and `equations method NAME` in the text
    and examples name real surrogates (or ones the example defines) and methods; calls such as
    `heaviside(u)` in code spans are functions or surrogates."""
    # (a definition: `surrogate name(x, k=v, ...) = ...`, or `surrogate name(x) = ...` without keywords)
    user_defined = set(re.findall(r"surrogate (\w+)\(\w+(?:\s*,[^\n]*?)?\) =", TEXT)) - set(SURROGATES)
    placeholders = {"S", "name", "NAME"}
    for name in re.findall(r"surrogate (\w+)\(", TEXT):
        assert name in SURROGATES or name in user_defined or name in placeholders, name
    for name in re.findall(r"equations method (\w+)", TEXT):  # in the language's own syntax
        if name in ("M", "NAME"):
            continue
        assert name in METHODS or name in METHOD_ALIASES, name
    for call in re.findall(r"`([a-z_]+)\((?:x|u|cond|a)\b[^`]*\)`", TEXT):  # `clip(x, lo, hi)` in the prose
        assert call in FUNCTIONS or call in SURROGATES, call


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```\n((?:#[^\n]*\n)*neuron .*?)^```", text, re.S | re.M)


def test_examples_compile():
    blocks = _blocks(TEXT)
    assert len(blocks) >= 2
    for b in blocks:
        c = flexdsl.compile(b)
        assert c.step is not None


def test_surrogate_example_compiles():
    m = re.search(r"```\n(surrogate gauss.*?)```", TEXT, re.S)
    lines = m.group(1).strip().splitlines()
    text = ("neuron G:\n    input x\n    param v_threshold = 1.0\n    state v = 0.0\n    " + lines[0] + "\n"
            "    update:\n        v = v + x\n    " + lines[1] + "\n")
    c = flexdsl.compile(text)
    assert c.step.surrogate.name == "gauss"


def _slug(heading: str) -> str:
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def test_internal_links_resolve():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", TEXT, re.M)}
    for target in re.findall(r"\]\(#([^)]+)\)", TEXT):
        assert target in anchors, target
    for target in re.findall(r"\]\(([^)#:]+\.md)\)", TEXT):
        if target == "nir.md" and not (DOC.parent / target).exists():
            continue  # written by the NIR work, merged separately
        assert (DOC.parent / target).is_file(), target


def test_command_line_is_documented():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    section = TEXT.split("## 9. Command line")[1].split("\n## ")[0]
    for name, p in sub.choices.items():
        assert f"flexdsl {name}" in section, name
        for action in p._actions:
            for opt in action.option_strings:
                if opt in ("-h", "--help") or not opt.startswith("--"):
                    continue
                assert opt in TEXT, f"`flexdsl {name} {opt}` is not in docs/language.md"
    assert "flexdsl --version" in section


def test_no_pointer_to_documents_users_do_not_have():
    bad = re.compile("LANGUAGE" + r"\.md|/work/" + "shared|" + "LANGUAGE" + r" §")
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("grammar/*"),
             *ROOT.glob("flexdsl/**/*.py"), *ROOT.glob("flexdsl/**/*.j2"), *ROOT.glob("tests/*.py"),
             *ROOT.glob("neurons/*.neuron")]
    hits = [f"{f.relative_to(ROOT)}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
            if bad.search(line)]
    assert not hits, hits


def test_reference_ships_with_the_package():
    path = flexdsl.docs.language_reference()
    assert path.is_file() and path.read_text() == TEXT
    assert str(path) in build_parser().format_help()


@pytest.mark.parametrize("heading", ["## 3. Declarations", "## 4. Blocks and the order of one step",
                                     "## 6. Surrogate gradients", "## 8. Python API", "## 10. Errors"])
def test_sections_exist(heading):
    assert heading in TEXT
