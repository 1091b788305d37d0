"""The grammar and the model library ship inside the wheel: an installed (non-editable)
flexdsl finds every packaged model by stem."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import flexdsl

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed_site(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    wheels = tmp / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (tmp / "build.log").write_text(r.stdout + r.stderr)
    (whl,) = wheels.glob("flexdsl-*.whl")
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(whl)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return site


def test_building_the_wheel_warns_of_nothing_in_flexdsls_packaging(installed_site: Path) -> None:
    """setuptools has nothing to say about flexdsl's own configuration (every folder of files it
    ships is a listed package: no "absent from the `packages` configuration", no deprecations)."""
    log = (installed_site.parent / "build.log").read_text()
    warnings = [ln.strip() for ln in log.splitlines()
                if re.search(r"Warning|deprecat|is absent from|will be ignored|!!", ln)
                and "pypi" not in ln.lower()]  # (this machine's pip index configuration, not flexdsl's)
    assert not warnings, "\n".join(warnings[:20])


def test_wheel_contains_grammar_and_library(installed_site: Path) -> None:
    pkg = installed_site / "flexdsl"
    assert (pkg / "grammar" / "neuron.lark").is_file()
    shipped = sorted(p.stem for p in (pkg / "neurons").glob("*.neuron"))
    assert shipped == flexdsl.library()


def test_installed_wheel_loads_every_model_by_stem(installed_site: Path, tmp_path: Path) -> None:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import flexdsl; "
        "assert flexdsl.__file__.startswith(sys.argv[1]), flexdsl.__file__; "
        "names = flexdsl.library(); [flexdsl.compile(n) for n in names]; "
        "print(json.dumps({'file': flexdsl.__file__, 'names': names}))"
    )
    r = subprocess.run([sys.executable, "-c", code, str(installed_site)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["names"] == flexdsl.library()
    assert len(out["names"]) >= 16


def test_second_process_loads_from_the_disk_cache_without_sympy(tmp_path: Path) -> None:
    """The generated torch source survives processes: a second process loads the model and
    runs it without importing sympy, with the same result as the first."""
    code = (
        "import sys, torch, flexdsl; m = flexdsl.load('izhikevich'); "
        "x = torch.linspace(0, 3, 24).reshape(4, 6); s = m(x); "
        "print('sympy' in sys.modules, s.sum().item(), float(m.v.sum()))"
    )
    env = {**__import__("os").environ, "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    used1, *vals1 = first.stdout.split()
    used2, *vals2 = second.stdout.split()
    assert used1 == "True" and used2 == "False"
    assert vals1 == vals2
    assert list((tmp_path / "cache" / "v1").glob("*.json"))


def test_wheel_ships_the_language_reference_and_the_doc_templates(installed_site: Path, tmp_path: Path) -> None:
    pkg = installed_site / "flexdsl"
    assert (pkg / "manual" / "language.md").read_text() == (ROOT / "docs" / "language.md").read_text()
    assert not list((pkg / "manual").glob("*.png"))  # the README's images stay in the source
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import flexdsl.docs as d; "
        "p = d.language_reference(); assert p.is_file() and p.parent.name == 'manual', p; "
        "html = d.render_html('lif', plots=False); assert '<math' in html and 'LIF' in html; print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code, str(installed_site)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_the_installed_wheel_ships_and_loads_the_library_layers(installed_site: Path, tmp_path: Path) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import flexdsl, torch; "
            "assert flexdsl.__file__.startswith(sys.argv[1]); "
            "m = flexdsl.load('rlif.layer', hidden=4, in_features=3); f = flexdsl.load('ff_lif.layer', hidden=4, "
            "in_features=3); print(type(m).__name__, type(f).__name__, tuple(m(torch.rand(2, 1, 3)).shape))")
    r = subprocess.run([sys.executable, "-c", code, str(installed_site)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["RecurrentModule", "FeedForwardModule", "(2,", "1,", "4)"]
