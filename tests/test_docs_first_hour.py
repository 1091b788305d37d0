"""The first hour of a new user, checked: the README's `show` excerpt is the real output, the
error messages that could help more do (word order, case, a stray time, taken names, missing
directories), `check_finite` catches non-finite gradients, and the notebook display of a model
with a learnable param is compact and warns of nothing."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import flexdsl
from flexdsl import cli

ROOT = Path(__file__).resolve().parent.parent


def test_readme_show_excerpt_is_the_real_output():
    """Every command excerpt of the README's "See what is computed" block that shows output is a
    contiguous run of lines of what the command prints today."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\$ flexdsl show neurons/lif\.neuron --torch.*?\n(.*?)\n\$ ", readme, re.S)
    assert block, "the README's show --torch excerpt is gone"
    excerpt = block.group(1).splitlines()
    assert len(excerpt) >= 8
    r = subprocess.run([sys.executable, "-m", "flexdsl", "show", "neurons/lif.neuron", "--torch"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    real = r.stdout.splitlines()
    starts = [i for i, ln in enumerate(real) if ln == excerpt[0]]
    assert any(real[i:i + len(excerpt)] == excerpt for i in starts), (
        "README excerpt differs from `flexdsl show neurons/lif.neuron --torch`:\n" + "\n".join(excerpt))


def _check(tmp_path: Path, text: str, capsys) -> str:
    p = tmp_path / "m.neuron"
    p.write_text(text)
    assert cli.main(["check", str(p)]) == 1
    return capsys.readouterr().err


def test_learnable_before_where_says_the_order(tmp_path, capsys):
    err = _check(tmp_path, "neuron A:\n    input x\n    param tau = 2.0 learnable where tau > 1\n    state v = 0.0\n"
                           "    update:\n        v = v + x / tau\n", capsys)
    assert "m.neuron:3:31: error: `where` after `learnable`" in err
    assert "param tau = 2.0 where tau > 1 learnable" in err


def test_derivative_of_a_name_in_another_case_suggests_the_state(tmp_path, capsys):
    err = _check(tmp_path, "neuron B:\n    input x\n    param dt = 0.1\n    state v = 0.0\n    equations:\n"
                           "        dV/dt = -v + x\n", capsys)
    assert "`V` is not a state" in err and "did you mean `v`?" in err


def test_a_time_in_an_update_line_is_not_called_a_derivative(tmp_path, capsys):
    err = _check(tmp_path, "neuron C:\n    input x\n    state v = 0.0\n    update:\n        v = v + x * 2 ms\n", capsys)
    assert "m.neuron:5:17" in err and "derivative" not in err and "dt / tau" in err
    # in an ODE the same mistake is a missing time constant: that hint stays
    err = _check(tmp_path, "neuron C:\n    input x\n    param dt = 0.1 ms\n    state v = 0 mV\n    equations:\n"
                           "        dv/dt = x * 1 mV\n", capsys)
    assert "a derivative is per time" in err


def test_a_taken_attribute_name_gets_a_short_hint(tmp_path, capsys):
    err = _check(tmp_path, "neuron D:\n    input x\n    state forward = 0.0\n    update:\n"
                           "        forward = forward + x\n", capsys)
    hint = next(ln for ln in err.splitlines() if ln.startswith("hint:"))
    assert "`forward_`" in hint and len(hint) < 300 and "register_full_backward_pre_hook" not in hint


def test_the_exact_case_insensitive_match_comes_first(capsys):
    assert cli.main(["show", "Lif"]) == 1
    err = capsys.readouterr().err
    assert "did you mean `lif`" in err
    assert cli.main(["show", "ADEX"]) == 1
    assert "did you mean `adex`" in capsys.readouterr().err


def test_a_missing_directory_is_said_to_be_one(tmp_path, capsys):
    assert cli.main(["check", str(tmp_path / "some_dir") + "/"]) == 1
    err = capsys.readouterr().err
    assert "no such directory" in err and "no such file or library model" not in err
    assert cli.main(["check", str(tmp_path / "nowhere" / "x.neuron")]) == 1
    err = capsys.readouterr().err
    assert "no such directory" in err and "nowhere" in err
    assert cli.main(["check", str(tmp_path / "x.neuron")]) == 1
    assert "no such file: " in capsys.readouterr().err


def test_flexdsl_run_prints_the_inputs_unit(capsys):
    assert cli.main(["run", "adex", "--T", "300", "--input", "step:900@50"]) == 0
    out = capsys.readouterr().out
    assert "input step:900@50 on `I` (in pA, the input's unit)" in out


QIF = """neuron QIF:
    input x
    param tau = 2.0 learnable
    state v = 0.0
    update:
        v = v + (x + v * v) / tau
    spike when v >= 1.0 surrogate sigmoid(alpha=4.0)
    on spike:
        v = 0.0
"""


def test_check_finite_catches_a_non_finite_gradient():
    """A NaN or inf in the backward is caught when asked: the error names the input and the last
    step whose gradient is not finite; without the option the gradient is silently inf/NaN."""
    x = (torch.rand(40, 3, dtype=torch.float64) * 0.5).requires_grad_()
    weight = torch.ones(40, 3, dtype=torch.float64)
    weight[25, 1] = float("inf")  # a loss term that explodes at step 25
    plain = flexdsl.loads(QIF)
    (plain(x) * weight).sum().backward()
    assert not bool(torch.isfinite(x.grad).all())  # silent without check_finite
    x.grad = None
    m = flexdsl.loads(QIF, check_finite=True)
    with pytest.raises(flexdsl.NonFiniteError) as e:
        (m(x) * weight).sum().backward()
    err = e.value
    assert err.what in ("x", "tau")
    if err.what == "x":
        assert err.step == 25 and "input `x`" in str(err)
    else:
        assert "param `tau`" in str(err)
    # finite gradients pass through unchanged
    x.grad = None
    m2 = flexdsl.loads(QIF, check_finite=True)
    y = m2(x).sum()
    y.backward()
    ref = x.grad.clone()
    x.grad = None
    flexdsl.loads(QIF)(x).sum().backward()
    assert torch.equal(ref, x.grad)


def test_check_finite_names_the_input_step_of_an_exploding_gradient():
    """Only the input needs a gradient here: the error is about it, at the step where the
    backward, coming from the end, first met a non-finite value."""
    text = QIF.replace(" learnable", "")
    m = flexdsl.loads(text, check_finite=True)
    x = (torch.rand(30, 2, dtype=torch.float64) * 0.5).requires_grad_()
    w = torch.ones(30, 2, dtype=torch.float64)
    w[12, 0] = float("nan")
    with pytest.raises(flexdsl.NonFiniteError) as e:
        (m(x) * w).sum().backward()
    assert e.value.what == "x" and e.value.step == 12
    assert "gradient of the loss with respect to input `x`" in str(e.value)


def test_notebook_display_is_compact_and_warns_of_nothing():
    m = flexdsl.load("plif", w=0.3)  # a learnable param whose value differs from its default
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        html = m._repr_html_()
    assert html.count("<details") >= 5
    # only the equations as written are open
    assert len(re.findall(r"<details class=\"section\"[^>]* open>", html)) == 1
    assert '<details class="section" id="equations" open>' in html
    assert "0.3" in html


def test_readme_page_image_shows_the_current_page():
    """docs/images/adex_page.png was made from the page flexdsl generates today (its recorded
    SHA-256 of the content shown matches): regenerate it with `python tests/readme_images.py`."""
    from PIL import Image

    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import readme_images
    finally:
        sys.path.pop(0)
    im = Image.open(ROOT / "docs" / "images" / "adex_page.png")
    assert im.size[0] == 820 and im.size[1] > 1500
    recorded = im.info.get(readme_images.KEY)
    assert recorded == readme_images.digest(), (
        "docs/images/adex_page.png shows an older page: run `python tests/readme_images.py`")
    assert "docs/images/adex_page.png" in (ROOT / "README.md").read_text()


# ------------------------------------------------------------------ issue 37: model names as the docs write them
LIBRARY_LIF = ROOT / "neurons" / "lif.neuron"


@pytest.mark.parametrize("name", ["lif.neuron", "neurons/lif", "neurons/lif.neuron", "./neurons/lif"])
def test_a_library_model_named_as_a_file_resolves_to_it(tmp_path, monkeypatch, capsys, name):
    """`lif.neuron` (the docs' first example) and `neurons/lif` name the library model where no such
    file exists: load, recurrent and the CLI alike."""
    monkeypatch.chdir(tmp_path)
    m = flexdsl.load(name)
    assert Path(m.compiled.filename) == LIBRARY_LIF and m.compiled.text == LIBRARY_LIF.read_text()
    assert flexdsl.recurrent(name, 3, 4).neuron.compiled.filename == m.compiled.filename
    assert cli.main(["run", name, "--T", "30", "--input", "1.5"]) == 0
    assert "spikes" in capsys.readouterr().out


def test_a_file_of_that_name_always_wins_over_the_library(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = LIBRARY_LIF.read_text().replace("param tau = 2.0", "param tau = 7.0")
    (tmp_path / "lif.neuron").write_text(mine)
    (tmp_path / "neurons").mkdir()
    (tmp_path / "neurons" / "lif.neuron").write_text(mine.replace("7.0", "5.0"))
    assert flexdsl.load("lif.neuron").tau == 7.0
    assert flexdsl.load("neurons/lif.neuron").tau == 5.0
    assert flexdsl.load("lif").tau == 2.0  # a bare name is the library's (a path names a file)


@pytest.mark.parametrize("name,first", [
    ("lfi.neuron", "lif"), ("neurons/lfi", "lif"), ("neurons/adexx.neuron", "adex"),
    ("nowhere/lif.neuron", "lif"), ("nowhere/plif.neuron", "plif"),
])
def test_a_missing_name_suggests_the_closest_library_model_first(tmp_path, monkeypatch, capsys, name, first):
    """Never `plif or klif` for `lif`: the model of that very name comes first, then the closest."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.load(name)
    hint = ei.value.hint or ""
    assert re.findall(r"`(\w+)`", hint)[0] == first, hint
    if name.startswith("nowhere/"):  # (a path in a missing directory: the model of that very name)
        assert "no such directory" in ei.value.reason and "library model" in hint
    assert cli.main(["run", name]) == 1
    err = capsys.readouterr().err
    assert hint in err and "Traceback" not in err
