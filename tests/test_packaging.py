"""The grammar and the model library ship inside the wheel: an installed (non-editable)
flexdsl finds every packaged model by stem."""

from __future__ import annotations

import json
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
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (whl,) = wheels.glob("flexdsl-*.whl")
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(whl)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return site


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
