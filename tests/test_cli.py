"""The command line (docs/language.md, sections 9 and 10): `python -m flexdsl check|show|run`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flexdsl  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent))
from test_errors import FILE_CASES, LIF, ODE  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cli(*args, cwd=None, timeout=180):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MPLBACKEND", "Agg")
    return subprocess.run(
        [sys.executable, "-m", "flexdsl", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=env,
        timeout=timeout,
    )


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli_inproc(*args, cwd_free=None):
    """`python -m flexdsl ARGS` run in this process (fast: no torch import per call); `cwd_free`: a
    directory to run it in (where no file has a library model's name).

    Same module (`flexdsl.__main__`), same argv, same exit status; an exception
    escaping the CLI (which would print a traceback) is reported as such."""
    import contextlib
    import io
    import runpy
    import traceback

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["flexdsl", *map(str, args)]
    code = 0
    try:
        if cwd_free is not None:
            os.chdir(cwd_free)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module("flexdsl", run_name="__main__", alter_sys=False)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - report, as a traceback would have been printed
        code = 1
        err.write("Traceback (most recent call last) [escaped the CLI]\n" + traceback.format_exc())
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
    return Result(code, out.getvalue(), err.getvalue())


def no_traceback(r):
    both = r.stdout + r.stderr
    assert "Traceback (most recent call last)" not in both, both


# At least 30 of the malformed inputs of test_errors, one `check` each.
CLI_CASES = FILE_CASES[:]
assert len(CLI_CASES) >= 30


def test_check_valid_files(tmp_path):
    a = tmp_path / "lif.neuron"
    b = tmp_path / "lif_ode.neuron"
    a.write_text(LIF)
    b.write_text(ODE)
    r = cli("check", a, b)
    no_traceback(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "error" not in (r.stdout + r.stderr).lower()


def test_check_library_stem():
    r = cli_inproc("check", ROOT / "neurons" / "lif.neuron")
    no_traceback(r)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_check_malformed(tmp_path, case):
    p = tmp_path / f"{case.id}.neuron"
    p.write_text(case.text)
    r = cli_inproc("check", p)
    no_traceback(r)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    out = r.stdout + r.stderr
    heads = [f"{p}:{line}:{col}: error:" for line, col in case.positions()]
    assert any(h in out for h in heads), f"none of {heads} in:\n{out}"


SUBPROCESS_IDS = ("unknown_in_update", "missing_colon_update", "where_default_violated")


@pytest.mark.parametrize("cid", SUBPROCESS_IDS)
def test_check_malformed_subprocess(tmp_path, cid):
    case = [c for c in CLI_CASES if c.id == cid][0]
    p = tmp_path / f"{case.id}.neuron"
    p.write_text(case.text)
    r = cli("check", p)
    no_traceback(r)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    out = r.stdout + r.stderr
    heads = [f"{p}:{line}:{col}: error:" for line, col in case.positions()]
    assert any(h in out for h in heads), f"none of {heads} in:\n{out}"


def test_check_all_malformed_in_one_call(tmp_path):
    paths = []
    for c in CLI_CASES:
        p = tmp_path / f"{c.id}.neuron"
        p.write_text(c.text)
        paths.append(p)
    r = cli("check", *paths)
    no_traceback(r)
    assert r.returncode == 1
    out = r.stdout + r.stderr
    missing = []
    for c, p in zip(CLI_CASES, paths):
        heads = [f"{p}:{line}:{col}: error:" for line, col in c.positions()]
        if not any(h in out for h in heads):
            missing.append(c.id)
    assert len(CLI_CASES) - len(missing) >= 30, missing
    assert not missing, missing


def test_check_several_files_reports_each(tmp_path):
    chosen = [
        c
        for c in CLI_CASES
        if c.id
        in (
            "unknown_in_update",
            "duplicate_param",
            "missing_colon_update",
            "unknown_surrogate",
            "exact_on_nonlinear",
        )
    ]
    assert len(chosen) == 5
    paths = []
    good = tmp_path / "good.neuron"
    good.write_text(LIF)
    for c in chosen:
        p = tmp_path / f"{c.id}.neuron"
        p.write_text(c.text)
        paths.append(p)
    r = cli_inproc("check", paths[0], good, *paths[1:])
    no_traceback(r)
    assert r.returncode == 1
    out = r.stdout + r.stderr
    for c, p in zip(chosen, paths):
        heads = [f"{p}:{line}:{col}: error:" for line, col in c.positions()]
        assert any(h in out for h in heads), f"{c.id}: none of {heads} in:\n{out}"
    assert not [ln for ln in out.splitlines() if f"{good}:" in ln and "error" in ln], out


def test_check_missing_file(tmp_path):
    p = tmp_path / "does_not_exist.neuron"
    r = cli("check", p)
    no_traceback(r)
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert "does_not_exist" in out


def test_check_long_expression_no_traceback(tmp_path):
    """Section 10: the CLI never shows a Python traceback, even for a 1000-term sum."""
    p = tmp_path / "long.neuron"
    p.write_text(LIF.replace("/ tau", "/ (" + " + ".join(["tau"] * 1000) + ")", 1))
    r = cli("check", p)
    no_traceback(r)
    assert r.returncode in (0, 1)


def test_run_missing_file(tmp_path):
    r = cli_inproc("run", tmp_path / "nope.neuron", "--T", "5")
    no_traceback(r)
    assert r.returncode == 1
    assert "nope" in r.stdout + r.stderr


def test_show_malformed_is_located(tmp_path):
    p = tmp_path / "bad.neuron"
    c = [c for c in CLI_CASES if c.id == "unknown_in_update"][0]
    p.write_text(c.text)
    r = cli_inproc("show", p, "--torch")
    no_traceback(r)
    assert r.returncode == 1
    line, col = c.positions()[0]
    assert f"{p}:{line}:{col}: error:" in r.stdout + r.stderr


# ---------------------------------------------------------------- show
def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_show_torch(tmp_path):
    p = _write(tmp_path, "lif.neuron", LIF)
    r = cli_inproc("show", p, "--torch")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "def " in out
    for name in ("v", "tau", "v_threshold", "v_reset", "x"):
        assert re.search(rf"\b{name}\b", out), name


def test_show_torch_library_stem():
    r = cli_inproc("show", "lif", "--torch")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert "def " in r.stdout and "tau" in r.stdout


@pytest.mark.parametrize("flag", ["--equations", "--backward"])
def test_show_equations_backward(tmp_path, flag):
    text = textwrap.dedent("""\
        neuron Two:
            input x
            param tau = 2.0 where tau > 1
            state vmem = 0.0
            state wad = 0.0
            update:
                vmem = vmem + (x - vmem - wad) / tau
                wad = wad + 0.1 * vmem
            spike when vmem >= 1.0 surrogate sigmoid(alpha=4.0)
            on spike:
                vmem = 0.0
            output spike
        """)
    p = _write(tmp_path, "two.neuron", text)
    r = cli_inproc("show", p, flag)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert "vmem" in r.stdout and "wad" in r.stdout, r.stdout


def test_show_default(tmp_path):
    p = _write(tmp_path, "lif.neuron", LIF)
    r = cli_inproc("show", p)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert "v" in r.stdout


@pytest.mark.parametrize("linear", [True, False])
def test_show_equations_reports_auto_method(tmp_path, linear):
    rhs = "(v_rest - v + I) / tau_m" if linear else "(v_rest - v + v*v*0.1 + I) / tau_m"
    text = textwrap.dedent(f"""\
        neuron Auto:
            input I
            param dt = 0.1
            param tau_m = 10.0 where tau_m > 0
            param v_rest = 0.0
            state v = v_rest
            equations:
                dv/dt = {rhs}
            spike when v > 1.0 surrogate atan(alpha=2.0)
            on spike:
                v = v_rest
            output spike
        """)
    p = _write(tmp_path, "auto.neuron", text)
    r = cli_inproc("show", p, "--equations")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    want, other = ("exact", "euler") if linear else ("euler", "exact")
    assert want in r.stdout.lower(), r.stdout
    if linear:
        assert not re.search(rf"\b{other}\b", r.stdout.lower()), r.stdout


# ---------------------------------------------------------------- run
def test_run_summary_constant_input():
    r = cli("run", "lif", "--T", "50", "--input", "1.5")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "50" in out  # number of steps
    # LIF tau=2, v_th=1: v = 0.75, 1.125 -> spike, reset: a spike every 2nd step
    assert re.search(r"\b25\b", out) or re.search(r"\b0\.50*\b", out), out
    assert re.search(r"\bv\b", out), out  # final state named
    assert "spike" in out.lower()


def test_run_file(tmp_path):
    p = _write(tmp_path, "lif.neuron", LIF)
    r = cli_inproc("run", p, "--T", "20", "--input", "1.5")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert re.search(r"\b10\b", r.stdout) or re.search(r"\b0\.50*\b", r.stdout), r.stdout


def test_run_step_input_plot(tmp_path):
    out = tmp_path / "out.png"
    r = cli("run", "lif", "--T", "60", "--input", "step:1.5@20", "--plot", out)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert out.exists()
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1024
    # the step begins at 20: at most 20 spikes in the remaining 40 steps (period 2)
    assert re.search(r"\b(19|20)\b", r.stdout) or re.search(r"\b(0\.3[23]|1/3)", r.stdout), r.stdout


def test_run_bad_input_spec():
    r = cli_inproc("run", "lif", "--T", "10", "--input", "step:abc")
    no_traceback(r)
    assert r.returncode != 0


# ---------------------------------------------------------------- the documentation issue's CLI items
def test_version():
    r = cli_inproc("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"flexdsl {flexdsl.__version__}"


@pytest.mark.parametrize("cmd", ["check", "show", "run", "doc"])
def test_help_describes_options_with_examples(cmd):
    r = cli_inproc(cmd, "--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "examples:" in out and f"flexdsl {cmd} " in out.split("examples:")[1]
    from flexdsl.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for action in sub.choices[cmd]._actions:
        assert action.help, (cmd, action.dest)  # every option and argument says what it does
        for opt in action.option_strings:
            assert opt in out
    if cmd == "run":
        assert "input formats" in out and "step:1.5@20" in out and "1.5" in out


def test_top_level_help_names_the_language_reference():
    r = cli_inproc("--help")
    assert r.returncode == 0
    assert "language.md" in r.stdout
    for cmd in ("check", "show", "run", "doc"):
        assert cmd in r.stdout


@pytest.mark.parametrize("T", ["-5", "0"])
def test_run_rejects_a_bad_T(T):
    r = cli_inproc("run", "lif", "--T", T)
    no_traceback(r)
    assert r.returncode == 1
    assert "<command line>: error: --T must be a positive number of steps" in r.stderr


def test_run_rejects_more_steps_than_it_can_hold():
    r = cli_inproc("run", "lif", "--T", "100000000000")
    no_traceback(r)
    assert r.returncode == 1 and "more steps than `flexdsl run` simulates" in r.stderr


@pytest.mark.parametrize("target,why", [("/nonexistent/dir/x.png", "does not exist"),
                                        ("x.unknownext", "not an image format"),
                                        ("noextension", "has no extension"),
                                        ("", "has no extension")])
def test_run_bad_plot_target(tmp_path, target, why):
    r = cli_inproc("run", "lif", "--T", "10", "--plot", target)
    no_traceback(r)
    assert r.returncode == 1
    assert why in r.stderr and "error:" in r.stderr
    assert "spikes:" not in r.stdout  # rejected before simulating


@pytest.mark.parametrize("spec,why", [("step:1.5@300", "after the last step"), ("step:1.5@-3", ">= 0"),
                                      ("nan", "finite"), ("step:", "")])
def test_run_bad_input(spec, why):
    r = cli_inproc("run", "lif", "--T", "100", "--input", spec)
    no_traceback(r)
    assert r.returncode == 1
    assert why in r.stderr and "step:AMPLITUDE@STEP" in r.stderr


def _svg_run(tmp_path, *args):
    import matplotlib

    out = tmp_path / "run.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text: the labels can be read
        r = cli_inproc("run", *args, "--plot", out)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    return out.read_text()


def test_run_plot_threshold_and_time_unit(tmp_path):
    svg = _svg_run(tmp_path, "adex", "--T", "1500", "--input", "step:900@100")
    assert "time (ms)" in svg  # adex declares dt in ms
    assert "threshold" in svg
    # the threshold: a horizontal dashed line in the threshold color (V_peak, a constant)
    dashed = re.findall(r'<path d="M ([\d.]+) ([\d.]+)\s+L ([\d.]+) ([\d.]+)[^"]*"[^>]*style="[^"]*stroke-dasharray'
                        r'[^"]*stroke: #d62728', svg)
    assert dashed and any(y1 == y2 for _, y1, _, y2 in dashed), "no horizontal dashed threshold line"
    svg = _svg_run(tmp_path, "lif", "--T", "60", "--input", "step:1.5@20")
    assert ">step<" in svg and "time (" not in svg  # lif counts steps


def test_check_directory(tmp_path):
    (tmp_path / "a.neuron").write_text(LIF)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.neuron").write_text(ODE)
    bad = [c for c in CLI_CASES if c.id == "unknown_in_update"][0]
    (tmp_path / "sub" / "c.neuron").write_text(bad.text)
    (tmp_path / "notes.txt").write_text("not a model")
    r = cli_inproc("check", tmp_path)
    no_traceback(r)
    assert r.returncode == 1
    assert f"{tmp_path / 'a.neuron'}: ok" in r.stdout and f"{tmp_path / 'sub' / 'b.neuron'}: ok" in r.stdout
    line, col = bad.positions()[0]
    assert f"{tmp_path / 'sub' / 'c.neuron'}:{line}:{col}: error:" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli_inproc("check", empty)
    no_traceback(r)
    assert r.returncode == 1 and "no `.neuron`, `.layer` or `.rule` files" in r.stderr
    # a directory's .layer files are checked too (a broken one alone: an error, not "no files")
    layers = tmp_path / "layers"
    layers.mkdir()
    (layers / "b.layer").write_text("layer B:\n    neuron lif\n    size 4\n    input s size 3\n"
                                    "    synapses W from s to nowhere\n")
    r = cli_inproc("check", layers)
    no_traceback(r)
    assert r.returncode == 1 and f"{layers / 'b.layer'}:5:" in r.stderr


def test_doc_command(tmp_path):
    out = tmp_path / "site"
    r = cli_inproc("doc", "lif", "if", "-o", out)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert "1/2 lif" in r.stderr and "2/2 if" in r.stderr  # progress per model
    for f in ("index.html", "index.md", "lif.html", "lif.md", "if.html", "lif.response.png", "if.fi.png"):
        assert (out / f).is_file(), f
    assert str(out / "index.html") in r.stdout


def test_doc_errors(tmp_path):
    r = cli_inproc("doc", "nosuchmodel", "-o", tmp_path / "o")
    no_traceback(r)
    assert r.returncode == 1 and "nosuchmodel" in r.stderr
    f = tmp_path / "file"
    f.write_text("x")
    r = cli_inproc("doc", "lif", "-o", f, "--no-plots")
    no_traceback(r)
    assert r.returncode == 1 and "not a directory" in r.stderr
    r = cli_inproc("doc", "lif", "-o", ROOT / "docs", "--no-plots")
    no_traceback(r)
    assert r.returncode == 1 and "flexdsl's own documentation" in r.stderr


# ------------------------------------------------------------------- rules and layers by name, their options
RULE_FILE = ROOT / "neurons" / "stdp_sj.rule"


@pytest.mark.parametrize("opts", [["--equations"], ["--backward"], ["--triton"], ["--neuron"], ["--eprop"],
                                  ["--torch"], ["--backend", "cpu"], ["--detach-reset"], ["--dt", "1"]])
def test_show_rule_refuses_the_options_of_a_neuron_model(opts):
    """They printed the same module as plain `show` with status 0."""
    r = cli_inproc("show", RULE_FILE, *opts)
    no_traceback(r)
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert "error:" in r.stderr and (opts[0] if opts[0] != "--backend" else "--cpu") in r.stderr
    assert "plasticity rule" in r.stderr or "NIR" in r.stderr


def test_show_layer_refuses_dt():
    r = cli_inproc("show", ROOT / "neurons" / "rlif.layer", "--dt", "1")
    no_traceback(r)
    assert r.returncode == 1 and "--dt" in r.stderr


@pytest.mark.parametrize("name, path", [("stdp_additive", "stdp_additive.rule"),
                                        ("stdp_additive.rule", "stdp_additive.rule"),
                                        ("neurons/stdp_additive.rule", "stdp_additive.rule"),
                                        ("rlif", "rlif.layer"), ("ff_lif.layer", "ff_lif.layer")])
def test_show_and_check_take_library_rules_and_layers_by_name(name, path, tmp_path):
    """`flexdsl show|check stdp_additive` said "no such file or library model" (`flexdsl doc` took it)."""
    r = cli_inproc("show", name, cwd_free=tmp_path)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert r.stdout == cli_inproc("show", ROOT / "neurons" / path).stdout
    r = cli_inproc("check", name, cwd_free=tmp_path)
    assert r.returncode == 0 and ": ok — " + ("rule" if path.endswith(".rule") else "layer") in r.stdout, r.stderr


def test_a_name_of_nothing_gets_rules_and_layers_in_its_hint():
    r = cli_inproc("show", "stdp_addtive")
    assert r.returncode == 1 and "`stdp_additive`" in r.stderr
    r = cli_inproc("check", "zzqq")
    assert r.returncode == 1 and "rules: " in r.stderr and "stdp_additive" in r.stderr and "rlif" in r.stderr


@pytest.mark.parametrize("model, kind", [("neurons/rlif.layer", "a layer"), ("rlif", "a layer"),
                                         ("stdp_sj", "a plasticity rule"), (RULE_FILE, "a plasticity rule")])
def test_run_of_a_layer_or_rule_says_run_simulates_neuron_models(model, kind):
    """`run x.layer` said "store_state_seqs, check_finite and surrogate_function are options of a neuron
    module, not of a layer": options the user never gave."""
    r = cli_inproc("run", model, "--T", "5")
    no_traceback(r)
    assert r.returncode == 1 and f"simulates a neuron model; `{model}` is {kind}" in r.stderr, r.stderr
    assert "store_state_seqs" not in r.stderr and "hint: " in r.stderr
    assert ("flexdsl.load(" if kind == "a layer" else "flexdsl.load_rule(") in r.stderr
