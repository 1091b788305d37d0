"""Fuzzing (hypothesis): grammar-aware random models and mutations of the library's models
go through `flexdsl.loads`, `flexdsl.load` (from a file), one call of the module and
`flexdsl check`. Whatever the input, only a located `FlexDSLError` may escape, the CLI never
prints a traceback, and each case finishes in under a second. At least 5,000 cases per run
(`FLEXDSL_FUZZ_SCALE` multiplies the counts for longer local runs)."""

from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flexdsl
from flexdsl import cli

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = sorted((ROOT / "neurons").glob("*.neuron"))
SCALE = float(os.environ.get("FLEXDSL_FUZZ_SCALE", "1"))
SETTINGS = dict(deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def _warm_up() -> None:
    """Imports and first-time setup (sympy, the parser tables) are not a case's time."""
    m = flexdsl.load("lif", backend="torch")
    m(torch.ones(2, 3, dtype=torch.float64))
    flexdsl.compile("cuba_lif").step  # noqa: B018 - lowering imports sympy


_warm_up()


def run_case(text: str, tmp: Path | None = None) -> None:
    """The pipeline on one model text: only FlexDSLError may escape; < 1 s."""
    t0 = time.perf_counter()
    try:
        m = flexdsl.loads(text, backend="torch")
        xs = [torch.linspace(-2.0, 3.0, 6, dtype=torch.float64).reshape(2, 3) for _ in m.compiled.checked.inputs]
        with torch.no_grad():
            m(*xs)
    except flexdsl.FlexDSLError as e:
        assert e.format().startswith(e.filename)  # located: FILE[:LINE:COL]: error: ...
    if tmp is not None:
        path = tmp / "case.neuron"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["check", str(path)])
        assert code in (0, 1) and "Traceback" not in err.getvalue()
        if code == 1:
            assert "error:" in err.getvalue()
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"{elapsed:.2f} s for:\n{text}"


# ------------------------------------------------------------------ grammar-aware models
NAMES = ["x", "v", "w", "a", "b", "tau", "dt", "I", "torch", "tl", "range", "float", "spike", "where", "exp",
         "v_fin", "out_v", "_hidden", "neuron", "T", "état", "x1"]
NUMBERS = ["0", "1", "2.5", ".5", "1e-3", "0.0", "1e999", "9", "100", "3"]
FUNCS = ["exp", "log", "sqrt", "abs", "sin", "cos", "tanh", "sigmoid", "relu", "min", "max", "clip", "where",
         "heaviside", "atan", "foo"]
ARITY = {"min": 2, "max": 2, "clip": 3, "where": 3}
SURROGATES = ["sigmoid", "atan", "rect", "triangle", "fast_sigmoid", "piecewise_quadratic", "straight_through",
              "super_spike", "erf", "nope"]


@st.composite
def expr(draw, names: list[str], depth: int = 0) -> str:
    if depth >= 3 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(names + NUMBERS))
    kind = draw(st.integers(0, 5))
    a = draw(expr(names, depth + 1))
    if kind <= 2:
        op = draw(st.sampled_from(["+", "-", "*", "/", "**"]))
        return f"({a} {op} {draw(expr(names, depth + 1))})"
    if kind == 3:
        return f"-{a}"
    f = draw(st.sampled_from(FUNCS))
    n = ARITY.get(f, 1) + draw(st.sampled_from([0, 0, 0, 0, 1, -1]))
    args = [a] + [draw(expr(names, depth + 1)) for _ in range(max(n - 1, 0))]
    if f == "where" and args:
        args[0] = f"{args[0]} {draw(st.sampled_from(['>', '<=', '==']))} {draw(expr(names, depth + 1))}"
    return f"{f}({', '.join(args[:max(n, 0)])})"


@st.composite
def model(draw) -> str:
    inputs = draw(st.lists(st.sampled_from(["x", "I", "y", "torch", "x1"]), min_size=0, max_size=2, unique=True))
    params = draw(st.lists(st.sampled_from(["tau", "a", "b", "dt", "tl", "range", "float"]), max_size=3,
                           unique=True))
    states = draw(st.lists(st.sampled_from(["v", "w", "u", "spike", "T"]), min_size=0, max_size=2, unique=True))
    lines = [f"neuron {draw(st.sampled_from(['M', 'Model_1', 'x', 'neuron']))}:"]
    if draw(st.booleans()):
        lines.append('    """' + draw(st.text(max_size=20)).replace('"', "'") + '"""')
    if inputs:
        lines.append(f"    input {', '.join(inputs)}")
    visible: list[str] = []
    for p in params:
        default = draw(expr(visible)) if visible and draw(st.booleans()) else draw(st.sampled_from(NUMBERS))
        where = f" where {p} {draw(st.sampled_from(['>', '>=', '<']))} {draw(st.sampled_from(NUMBERS))}" \
            if draw(st.booleans()) else ""
        learn = " learnable" if draw(st.integers(0, 3)) == 0 else ""
        lines.append(f"    param {p} = {default}{where}{learn}")
        visible.append(p)
    for s in states:
        lines.append(f"    state {s} = {draw(expr(visible))}")
    names = visible + inputs + states
    pool = names or NAMES
    if states and draw(st.booleans()):
        method = draw(st.sampled_from(["", " method exact", " method euler", " method rk4",
                                       " method exponential_euler", " method heun", " method bogus"]))
        lines.append(f"    equations{method}:")
        for s in states:
            lines.append(f"        d{s}/dt = {draw(expr(pool))}")
    if draw(st.integers(0, 4)) > 0:
        lines.append("    update:")
        targets = states + ["loc"]
        for _ in range(draw(st.integers(1, 3))):
            op = draw(st.sampled_from(["=", "=", "+=", "-=", "*=", "/="]))
            lines.append(f"        {draw(st.sampled_from(targets))} {op} {draw(expr(pool))}")
    if draw(st.booleans()):
        sg = draw(st.sampled_from(SURROGATES))
        kw = draw(st.sampled_from(["", "alpha=2.0", "alpha=0", "slope=1e999", "k=1"]))
        lines.append(f"    spike when {draw(expr(pool))} {draw(st.sampled_from(['>=', '>']))} "
                     f"{draw(expr(pool))} surrogate {sg}({kw})")
        if states and draw(st.booleans()):
            lines.append("    on spike:")
            lines.append(f"        {draw(st.sampled_from(states))} {draw(st.sampled_from(['=', '-=', '+=']))} "
                         f"{draw(expr(pool))}")
    if draw(st.booleans()):
        lines.append(f"    output {', '.join(draw(st.lists(st.sampled_from(['spike', *states, 'loc']), min_size=1, max_size=2)))}")
    return "\n".join(lines) + "\n"


@settings(max_examples=int(1200 * SCALE), **SETTINGS)
@given(model())
def test_fuzz_grammar_aware_models(text):
    run_case(text)


# ------------------------------------------------------------------ mutations of the library
ALPHABET = list("()[]:=+-*/<>,.#\"' \t\n") + ["**", "0", "1e9", "spike", "update:", "learnable", "where",
                                              "\x00", "\x0c", "\u2028", "\x85", "\ufeff", "\r", "é", "\ud800",
                                              '"""', "    ", "neuron X:"]


@st.composite
def mutated(draw) -> str:
    text = LIBRARY[draw(st.integers(0, len(LIBRARY) - 1))].read_text()
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 4))
        i = draw(st.integers(0, len(text)))
        if kind == 0:  # delete a span
            text = text[:i] + text[i + draw(st.integers(1, 20)):]
        elif kind == 1:  # insert tokens
            text = text[:i] + "".join(draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4))) + text[i:]
        elif kind == 2:  # replace one character
            text = text[:i] + draw(st.sampled_from(ALPHABET)) + text[i + 1:]
        else:  # duplicate or drop a line
            lines = text.split("\n")
            j = draw(st.integers(0, len(lines) - 1))
            lines.insert(j, lines[j]) if kind == 3 else lines.pop(j)
            text = "\n".join(lines)
    return text


@settings(max_examples=int(3900 * SCALE), **SETTINGS)
@given(mutated())
def test_fuzz_mutated_library_models(text):
    run_case(text)


@settings(max_examples=int(150 * SCALE), **SETTINGS)
@given(st.one_of(mutated(), model()))
def test_fuzz_files_and_the_cli(tmp_path_factory, text):
    run_case(text, tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_library_models_pass_the_fuzz_harness(path):
    """The harness itself: every library model loads and runs one call (no error at all)."""
    m = flexdsl.load(str(path), backend="torch")
    xs = [torch.linspace(-2.0, 3.0, 6, dtype=torch.float64).reshape(2, 3) for _ in m.compiled.checked.inputs]
    with torch.no_grad():
        m(*xs)
