"""Fuzzing (hypothesis): grammar-aware random models and mutations of the library's models
go through `flexdsl.loads`, `flexdsl.load` (from a file), one call of the module and
`flexdsl check`. Whatever the input, only a located `FlexDSLError` may escape, the CLI never
prints a traceback, and each case finishes in under a second. At least 5,000 cases per run
(`FLEXDSL_FUZZ_SCALE` multiplies the counts for longer local runs)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
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
SETTINGS = dict(deadline=None, database=None,  # (repeatable draws, or new ones: tests/conftest.py)
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def _warm_up() -> None:
    """Imports and first-time setup (sympy, the parser tables) are not a case's time."""
    m = flexdsl.load("lif", backend="torch")
    m(torch.ones(2, 3, dtype=torch.float64))
    flexdsl.compile("cuba_lif").step  # noqa: B018 - lowering imports sympy


_warm_up()


CPU_BUDGET = 10.0  # seconds of this process's CPU time per case: a hang guard, not a speed claim


class Overrun(Exception):
    pass


@contextlib.contextmanager
def cpu_budget(seconds: float):
    """Raise `Overrun` once this process has used `seconds` of CPU time inside the block. CPU
    time, not wall time: other work on the machine does not count, so the bound is about the
    input (a pathological one blows up every time), never about the machine's load."""

    def overrun(signum, frame):
        raise Overrun(f"more than {seconds:g} s of CPU time")

    old = signal.signal(signal.SIGPROF, overrun)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def run_case(text: str, tmp: Path | None = None) -> None:
    """The pipeline on one model text: only FlexDSLError may escape, within a CPU budget far
    beyond any real case (a blow-up, not a slow machine, is what it catches)."""
    try:
        with cpu_budget(CPU_BUDGET):
            _one_case(text, tmp)
    except Overrun as e:
        pytest.fail(f"{e} for:\n{text}")


def _one_case(text: str, tmp: Path | None) -> None:
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


# ------------------------------------------------------------------ grammar-aware models
# A quarter of the models mix hostile pieces into plausible ones; the others are plausible, so
# that a good share get through the checker and exercise lowering, code generation and a call.
HOSTILE = [False]


class _Mix:
    def __init__(self, sane: list[str], hostile: list[str]) -> None:
        self.sane, self.hostile = st.sampled_from(sane), st.sampled_from(sane * 3 + hostile)


def mix(sane: list[str], hostile: list[str]) -> _Mix:
    return _Mix(sane, hostile)


def pick(draw, m: _Mix) -> str:
    return draw(m.hostile if HOSTILE[0] else m.sane)


NUMBERS = mix(["0", "1", "2.5", ".5", "1e-3", "0.0", "9", "3", "0.25", "1.5"], ["1e999", "100", "1e308", "007"])
FUNCS = mix(["exp", "log", "sqrt", "abs", "sin", "cos", "tanh", "sigmoid", "relu", "min", "max", "clip", "where",
             "heaviside"], ["atan", "foo", "spike", "exp2"])
ARITY = {"min": 2, "max": 2, "clip": 3, "where": 3}
SURROGATES = mix(["sigmoid", "atan", "rect", "triangle", "fast_sigmoid", "piecewise_quadratic", "straight_through",
                  "super_spike", "erf"], ["nope", "exp"])
KWARGS = mix([""], ["alpha=2.0", "alpha=0.5", "alpha=0", "slope=1e999", "k=1", "alpha=-1"])


@st.composite
def expr(draw, names: list[str], depth: int = 0) -> str:
    leaves = names + ["0", "1", "2.5", ".5"] if names else ["0", "1", "2.5"]
    if depth >= 3 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(leaves)) if draw(st.booleans()) else pick(draw, NUMBERS)
    kind = draw(st.integers(0, 5))
    a = draw(expr(names, depth + 1))
    if kind <= 2:
        op = pick(draw, mix(["+", "-", "*", "/"], ["**", "//", "%"]))
        b = draw(expr(names, depth + 1))
        if op == "/" and not HOSTILE[0]:
            b = f"(1.5 + abs({b}))"
        return f"({a} {op} {b})"
    if kind == 3:
        return f"-{a}"
    f = pick(draw, FUNCS)
    n = ARITY.get(f, 1) + (draw(st.sampled_from([0] * 9 + [1, -1])) if HOSTILE[0] else 0)
    args = [a] + [draw(expr(names, depth + 1)) for _ in range(max(n - 1, 0))]
    if f == "where" and args:
        args[0] = f"{args[0]} {draw(st.sampled_from(['>', '<=', '==']))} {draw(expr(names, depth + 1))}"
    return f"{f}({', '.join(args[:max(n, 0)])})"


DOC = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)


def _names(m: _Mix):
    return m.hostile if HOSTILE[0] else m.sane


@st.composite
def model(draw) -> str:
    HOSTILE[0] = draw(st.integers(0, 3)) == 0
    inputs = draw(st.lists(_names(mix(["x", "I", "y"], ["torch", "spike", "x1"])), min_size=1, max_size=2,
                           unique=True))
    if HOSTILE[0] and draw(st.integers(0, 4)) == 0:
        inputs = []
    params = draw(st.lists(_names(mix(["tau", "a", "b", "dt", "g"], ["tl", "range", "float", "_p"])), max_size=3,
                           unique=True))
    states = draw(st.lists(_names(mix(["v", "w", "u"], ["spike", "training", "T"])), min_size=1, max_size=2,
                           unique=True))
    name = pick(draw, mix(["M", "Model_1", "Lif2"], ["neuron", "1x", "x y"]))
    lines = [f"neuron {name}:"]
    if draw(st.booleans()):
        doc = draw(st.text(max_size=10) if HOSTILE[0] else DOC)
        lines.append('    """' + doc.replace('"', "'") + '"""')
    lines.append(f"    input {', '.join(inputs)}")
    visible: list[str] = []
    for p in params:
        default = draw(expr(visible)) if visible and draw(st.booleans()) else pick(draw, NUMBERS)
        where = f" where {p} {draw(st.sampled_from(['>', '>=', '<']))} {pick(draw, NUMBERS)}" \
            if draw(st.integers(0, 3)) == 0 else ""
        learn = " learnable" if draw(st.integers(0, 3)) == 0 else ""
        lines.append(f"    param {p} = {default}{where}{learn}")
        visible.append(p)
    for s in states:
        init = draw(expr(visible)) if HOSTILE[0] or draw(st.booleans()) else pick(draw, NUMBERS)
        lines.append(f"    state {s} = {init}")
    pool = visible + inputs + states
    if draw(st.integers(0, 2)) == 0:
        method = pick(draw, mix(["", " method exact", " method euler", " method rk4", " method exponential_euler",
                                 " method heun", " method rk2"], [" method bogus"]))
        lines.append(f"    equations{method}:")
        for s in states:
            lines.append(f"        d{s}/dt = {draw(expr(pool))}")
        if "dt" not in params and draw(st.integers(0, 4)) > 0:
            lines.insert(2, "    param dt = 0.1")
    if draw(st.integers(0, 4)) > 0:
        lines.append("    update:")
        targets = states + ["loc"]
        for _ in range(draw(st.integers(1, 3))):
            target = draw(st.sampled_from(targets))
            op = pick(draw, mix(["=", "=", "+=", "-="], ["*=", "/=", "=="]))
            if target == "loc" and not HOSTILE[0]:
                op = "let loc ="
                target = ""
                pool = pool + ["loc"]
            lines.append(f"        {target}{' ' if target else ''}{op} {draw(expr(pool))}")
    spiking = draw(st.booleans())
    if spiking:
        lhs = draw(st.sampled_from(states)) if draw(st.integers(0, 3)) else draw(expr(pool))
        lines.append(f"    spike when {lhs} {draw(st.sampled_from(['>=', '>']))} {draw(expr(visible))} "
                     f"surrogate {pick(draw, SURROGATES)}({pick(draw, KWARGS)})")
        if draw(st.booleans()):
            lines.append("    on spike:")
            lines.append(f"        {draw(st.sampled_from(states))} {pick(draw, mix(['=', '-=', '+='], ['*=']))} "
                         f"{draw(expr(visible))}")
    if draw(st.integers(0, 3)) == 0:
        outs = draw(st.lists(st.sampled_from(["spike", *states, "loc"] if HOSTILE[0] or spiking else states),
                             min_size=1, max_size=2, unique=True))
        lines.append(f"    output {', '.join(outs)}")
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
