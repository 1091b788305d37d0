"""The CPU backend (C++ kernels built with the compiler PyTorch uses): every library model
against the torch backend in float32 and float64 (outputs, final states, state sequences,
gradients of the inputs, of the learnable params and of the initial states), what `auto`
picks, broadcasting, per-channel params, odd shapes, thread counts, names that are C++
keywords or macros, the disk cache of built libraries, and the fallback to the torch loop (one
warning) where no compiler is found or a build fails."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sympy as sp
import torch

import flexdsl
from flexdsl import backends
from flexdsl.backends.cpu import CALLS, build
from flexdsl.backends.cpu.emit import CppPrinter
from flexdsl.frontend.catalog import ALL_FUNCTIONS
from flexdsl.ir.functions import SYMPY

from tolerances import assert_close, scan_ops

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not backends.get("cpu").available(),
                                reason="no C++ compiler: the fallback is tested in a subprocess below")
SCALE = {"hodgkin_huxley": 15.0, "morris_lecar": 60.0, "izhikevich": 20.0, "izhikevich_2003": 20.0, "adex": 2e-9,
         "eif": 3.0, "qif": 3.0, "resonate_fire": 3.0}


def _x(T=9, shape=(3, 7), seed=0, scale=2.0, dtype=torch.float32):
    return (torch.rand(T, *shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            * scale).to(dtype)


def _run(m, xs, state=None):
    """Outputs, final states, state sequences and gradients (inputs, learnable params, initial
    states given as tensors that require grad) of one call with a weighted loss."""
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    st = {k: v.detach().clone().requires_grad_(True) for k, v in state.items()} if state else None
    m.store_state_seqs = True
    if st is None:
        out = m(*xs)
        fins = dict(m._states)
    else:
        out, fins = m.step(*xs, state=st)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outs)
    loss = loss + sum((f * 0.5).sum() for f in fins.values())
    loss.backward()
    return {"out": [o.detach() for o in outs], "fin": {k: v.detach() for k, v in fins.items()},
            "seqs": {k: v.detach() for k, v in m.state_seqs.items()} if st is None else {},
            "gx": [x.grad for x in xs], "gp": {n: p.grad for n, p in m.named_parameters()},
            "gs": {k: v.grad for k, v in st.items()} if st else {}}


def _close(a, b, ops, what):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    assert_close(a, b, ops=ops, what=what)


def _same(ra, rb, model: str, x: torch.Tensor):
    """The C++ kernels against the torch backend: within the counted operations of x's steps
    (a param's gradient: a sum over x's elements), relative to each value's largest magnitude."""
    ops = scan_ops(model, max(x.shape[0], 1), x.numel())
    for a, b in zip(ra["out"], rb["out"]):
        _close(a, b, ops, "output")
    for key in ("fin", "seqs", "gp", "gs"):
        assert ra[key].keys() == rb[key].keys(), key
        for k in ra[key]:
            _close(ra[key][k], rb[key][k], ops, f"{key} {k}")
    for a, b in zip(ra["gx"], rb["gx"]):
        _close(a, b, ops, "input gradient")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("model", flexdsl.library())
def test_every_library_model_matches_the_torch_backend(model, dtype):
    x = _x(scale=SCALE.get(model, 2.0), dtype=dtype)
    before = dict(CALLS)
    a = flexdsl.load(model, backend="cpu").to(dtype)
    b = flexdsl.load(model, backend="torch").to(dtype)
    ra, rb = _run(a, [x]), _run(b, [x])
    _same(ra, rb, model, x)
    # spikes are decisions: the same ones (both backends compute the step in the same order)
    assert torch.equal(ra["out"][0], rb["out"][0])
    # from given initial states that require grad (their gradients come back)
    state = {k: v * 0.5 for k, v in b.initial_state(x).items()}
    _same(_run(a, [x], state), _run(b, [x], state), model, x)
    assert CALLS["fwd"] > before["fwd"] and CALLS["bwd"] > before["bwd"]  # the kernels ran


def test_auto_picks_the_cpu_kernels_for_float_cpu_tensors():
    assert backends.choose("auto", [torch.zeros(2)]).name == "cpu"
    assert backends.choose("auto", [torch.zeros(2, dtype=torch.float64)]).name == "cpu"
    assert backends.choose("auto", [torch.zeros(2, dtype=torch.bfloat16)]).name == "torch"
    before = CALLS["fwd"]
    m = flexdsl.load("lif")  # backend="auto"
    x = _x()
    assert torch.equal(m(x), flexdsl.load("lif", backend="torch")(x)) and CALLS["fwd"] == before + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):  # other dtypes run on the torch backend
        assert m(x.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(flexdsl.FlexDSLError, match="float32 or float64"):
        flexdsl.load("lif", backend="cpu")(x.bfloat16())
    with pytest.raises(flexdsl.FlexDSLError, match="CPU tensors"):
        flexdsl.load("lif", backend="cpu")(x.to("meta"))


def test_broadcast_inputs_per_channel_params_and_odd_shapes():
    text = """neuron Two:
    input x, y
    param tau = 2.0
    param w = 0.5 learnable
    state v = 0.0
    update:
        v = v + (x * w - v) / tau + y
    spike when v >= 1.0
    on spike:
        v = 0.0
    output spike, v
"""
    for dtype in (torch.float32, torch.float64):
        for shapes in (((9, 4, 5), (9, 1, 5)), ((9, 5), (9, 5)), ((9, 1), (9, 6)), ((0, 3), (0, 3)), ((4, 0), (4, 0))):
            xs = [_x(shape=s[1:], T=s[0], seed=i, dtype=dtype) for i, s in enumerate(shapes)]
            kw = {"tau": torch.linspace(1.5, 3.0, shapes[0][-1]) if shapes[0][-1] > 1 else 2.0}
            # (a per-channel param has at least one channel: with 0 lanes, w stays one value)
            ps = {"w": (shapes[0][-1],)} if shapes[0][-1] > 0 else None
            a = flexdsl.loads(text, backend="cpu", param_shapes=ps, **kw).to(dtype)
            b = flexdsl.loads(text, backend="torch", param_shapes=ps, **kw).to(dtype)
            if 0 in shapes[0]:  # nothing to differentiate: the forward's shapes and values
                for p, q in zip(a(*xs), b(*xs)):
                    assert p.shape == q.shape and torch.equal(p, q)
                continue
            _same(_run(a, xs), _run(b, xs), text, xs[0].expand(torch.broadcast_shapes(*shapes)))
    # a non-contiguous input (a transposed batch) and a view with a step stride
    x = _x(T=6, shape=(5, 4)).transpose(1, 2)
    assert not x.is_contiguous()
    _same(_run(flexdsl.load("plif", backend="cpu"), [x]), _run(flexdsl.load("plif", backend="torch"), [x]), "plif", x)
    x = _x(T=12, shape=(3, 4))[::2]
    _same(_run(flexdsl.load("alif", backend="cpu"), [x]), _run(flexdsl.load("alif", backend="torch"), [x]), "alif", x)


def test_results_do_not_depend_on_the_thread_count():
    x = _x(T=20, shape=(64, 300))
    m = flexdsl.load("plif", backend="cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        r1 = _run(m, [x])
        m.reset()
        m.w.grad = None
        torch.set_num_threads(max(2, threads))
        r2 = _run(m, [x])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(r1["out"][0], r2["out"][0]) and torch.equal(r1["gx"][0], r2["gx"][0])
    assert torch.equal(r1["gp"]["w"], r2["gp"]["w"])


def test_check_finite_and_functional_step_on_the_cpu_kernels():
    found = []
    for backend in ("cpu", "torch"):
        m = flexdsl.load("eif", backend=backend, check_finite=True, v_threshold=1e300)
        with pytest.raises(flexdsl.NonFiniteError) as e:
            m(torch.full((200, 2), 0.5, dtype=torch.float64))  # (1e300 is beyond float32: a float64 call)
        found.append((e.value.what, e.value.step, e.value.index))
    assert found[0] == found[1] and found[0][:2] == ("v", 9)  # where the torch backend finds it (README example)
    f = flexdsl.load("alif", backend="cpu")
    x = _x(T=10)
    full = f(x)
    g = flexdsl.load("alif", backend="cpu")
    state, outs = g.initial_state(x), []
    for chunk in x.split(3):
        out, state = g.step(chunk, state)
        outs.append(out)
    assert torch.equal(torch.cat(outs), full) and torch.equal(state["a"], f._states["a"])


def test_names_that_are_cpp_keywords_or_macros():
    """Model names reach C++ with a trailing underscore: keywords, macros and library names
    of the headers cannot collide."""
    text = """neuron N:
    input double
    param NAN = 2.0
    param errno = 1.0
    param M_PI = 0.0
    state INFINITY = 0.0
    state std = 0.5
    update:
        INFINITY = INFINITY + (double - (INFINITY - M_PI)) / NAN + std * 0.0
        std = std * 0.5
    spike when INFINITY >= errno
    on spike:
        INFINITY = M_PI
    output spike
"""
    x = _x()
    _same(_run(flexdsl.loads(text, backend="cpu"), [x]), _run(flexdsl.loads(text, backend="torch"), [x]), text, x)


def test_the_printer_spells_every_built_in_function():
    scalars = set()
    for name, f in ALL_FUNCTIONS.items():
        args = sp.symbols("a b c", real=True)[: f.arity]
        if name == "where":
            args = (sp.StrictGreaterThan(args[0], 0), *args[1:])
        text = CppPrinter(scalars)._print(SYMPY[f.sympy](*args))
        head = CppPrinter.SPELL[name].split("{")[0]
        assert head in text, (name, text)
        assert "Symbol" not in text and "Function" not in text and "math." not in text, (name, text)


def test_generated_source_is_readable_and_cached(tmp_path, capsys):
    c = flexdsl.compile("lif")
    src = c.artefact("cpu").source
    assert "// line 22: v = v + (x - (v - v_reset)) / tau" in src and "#pragma omp simd" in src
    from flexdsl.cli import main

    assert main(["show", "lif", "--cpu"]) in (0, None) and capsys.readouterr().out == src  # flexdsl show --cpu
    # a second process loads the built library from the cache, without building
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path)}
    code = ("import torch, flexdsl\nfrom flexdsl.backends.cpu import build\n"
            "flexdsl.load('lif', backend='cpu')(torch.rand(3, 4))\nprint(len(build.BUILD_TIMES))\n")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert first.stdout.split() == ["1"] and second.stdout.split() == ["0"], first.stderr + second.stderr
    # a damaged library (its SHA-256 no longer matches) is rebuilt, not loaded
    (lib,) = [p for p in tmp_path.rglob("*.so")]
    lib.write_bytes(lib.read_bytes()[:1000])
    third = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert third.stdout.split() == ["1"], third.stderr


def test_without_a_compiler_auto_falls_back_with_one_warning(tmp_path):
    code = """
import warnings, torch, flexdsl
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as w:
    a = flexdsl.load("lif")(torch.rand(5, 3) * 2)
    b = flexdsl.load("plif")(torch.rand(5, 3) * 2)
msgs = [str(x.message) for x in w if "flexdsl" in str(x.message)]
assert len(msgs) == 1 and "\\n" not in msgs[0] and "compiler" in msgs[0], msgs
torch.manual_seed(0); x = torch.rand(5, 3) * 2
assert torch.equal(flexdsl.load("lif")(x), flexdsl.load("lif", backend="torch")(x))
try:
    flexdsl.load("lif", backend="cpu")
except flexdsl.FlexDSLError as e:
    assert "compiler" in str(e), e
else:
    raise AssertionError("backend='cpu' without a compiler loaded")
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path),
           "CXX": str(tmp_path / "no-such-c++")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_failed_build_falls_back_with_one_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise build.BuildError("the C++ compiler failed: error: something", "<test>")

    monkeypatch.setattr(build, "library", broken)
    text = f"# {uuid.uuid4().hex}\n" + flexdsl.compile("lif").text
    with pytest.warns(RuntimeWarning, match="could not be built"):
        m = flexdsl.loads(text, backend="cpu")
    x = _x()
    assert torch.equal(m(x), flexdsl.load("lif", backend="torch")(x))


def test_custom_ops_pass_opcheck():
    """torch.library.opcheck: the fake implementations, the schema and the autograd formula
    agree with the kernels."""
    m = flexdsl.load("plif", backend="cpu")
    prog = m.compiled.program("cpu")
    prog._register_ops()
    x = _x(T=5, shape=(2, 3)).requires_grad_(True)
    w = torch.tensor(-0.3, requires_grad=True)
    args = ([x], [], [w], [0.0], [2.0, 0.0, 1.0, 0.0], [False, False, True, False, False], False, True)
    torch.library.opcheck(prog.op_fwd, args)


# ------------------------------------------------------------------ issue 36: broken compilers
_CALL = """
import json, warnings, torch, flexdsl
from flexdsl.backends.cpu import CALLS, build
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as w:
    x = torch.rand(6, 3, generator=torch.Generator().manual_seed(0)) * 2
    m = flexdsl.load("lif", backend="cpu")
    same = torch.equal(m(x), flexdsl.load("lif", backend="torch")(x)) and torch.equal(m(x), m(x))
print(json.dumps({"builds": len(build.BUILD_TIMES), "kernel_calls": CALLS["fwd"], "same": same,
                  "warnings": [str(x.message) for x in w if "flexdsl" in str(x.message)]}))
"""


def _call(tmp_path, cxx=None, **env):
    import json

    e = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache"), **env}
    e.pop("CXX", None)
    if cxx is not None:
        e["CXX"] = str(cxx)
    r = subprocess.run([sys.executable, "-c", _CALL], capture_output=True, text=True, env=e, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


def _libraries(tmp_path):
    return sorted((tmp_path / "cache").rglob("*.so"))


def test_a_compiler_that_writes_garbage_falls_back_and_nothing_damaged_is_kept(tmp_path):
    """A compiler that exits 0 but writes no library: the library cannot be loaded, so it is
    damaged -- removed with its cache entry, built once more, then the torch backend's loop runs
    the model with one warning that says why. A second process does not load it either (it builds
    and fails again); a process with a working compiler builds and runs the kernels."""
    runs = tmp_path / "runs"
    garbage = _script(tmp_path, "garbage-c++", f'echo run >> "{runs}"\n'
                                               'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
                                               'echo "not a library" > "$out"\nexit 0\n')
    for k in range(2):
        r = _call(tmp_path, garbage)
        assert r["same"] and r["kernel_calls"] == 0, r
        assert len(r["warnings"]) == 1 and "cannot be loaded" in r["warnings"][0], r["warnings"]
        assert _libraries(tmp_path) == []
        assert len(runs.read_text().split()) == 2 * (k + 1)  # (built, found damaged, built once more: per process)
    r = _call(tmp_path)
    assert r["same"] and r["kernel_calls"] > 0 and r["builds"] == 1 and r["warnings"] == [], r
    assert len(_libraries(tmp_path)) == 1


def test_a_damaged_library_the_cache_vouches_for_is_rebuilt(tmp_path):
    """A cached library whose recorded SHA-256 matches but which does not load (a broken compiler
    of an earlier run, recorded by an earlier version): removed and rebuilt, without a warning."""
    assert _call(tmp_path)["builds"] == 1
    (lib,) = _libraries(tmp_path)
    lib.write_bytes(b"\x7fELF garbage" * 100)
    code = ("import hashlib, os, sys\nfrom pathlib import Path\nfrom flexdsl.store import cache\n"
            "lib = Path(sys.argv[1]); k = lib.stem; e = cache.read(k)\n"
            "e.meta['sha256'] = hashlib.sha256(lib.read_bytes()).hexdigest(); cache.write(k, e)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-c", code, str(lib)], check=True, env=env, timeout=300)
    r = _call(tmp_path)
    assert r["same"] and r["kernel_calls"] > 0 and r["builds"] == 1 and r["warnings"] == [], r


def test_a_compiler_that_never_returns_is_stopped_at_the_time_limit(tmp_path):
    """A compiler that hangs is stopped after FLEXDSL_CPU_BUILD_TIMEOUT seconds -- its whole process
    group, the programs it started included -- and the model runs on the torch backend's loop with
    one warning naming the limit; it is not tried again without OpenMP."""
    pids = tmp_path / "pids"
    sleepy = _script(tmp_path, "sleepy-c++", f'echo $$ >> "{pids}"\nsleep 1000 &\necho $! >> "{pids}"\nwait\n')
    r = _call(tmp_path, sleepy, FLEXDSL_CPU_BUILD_TIMEOUT="2")
    assert r["same"] and r["kernel_calls"] == 0 and r["builds"] == 0, r
    assert len(r["warnings"]) == 1 and "did not finish" in r["warnings"][0] and "within 2 s" in r["warnings"][0]
    started = pids.read_text().split()
    assert len(started) == 2, started  # (one build, not a second one without OpenMP)
    for pid in started:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text(), pid  # (gone, or a zombie: not running)


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1e3", "100000000"])
def test_the_build_time_limit_is_checked(monkeypatch, value):
    monkeypatch.setenv("FLEXDSL_CPU_BUILD_TIMEOUT", value)
    with pytest.raises(flexdsl.FlexDSLError, match="FLEXDSL_CPU_BUILD_TIMEOUT"):
        build.build_timeout()
    monkeypatch.setenv("FLEXDSL_CPU_BUILD_TIMEOUT", "17")
    assert build.build_timeout() == 17
    monkeypatch.delenv("FLEXDSL_CPU_BUILD_TIMEOUT")
    assert build.build_timeout() == 60


@pytest.mark.parametrize("text", [
    "neuron A:\n    input x\n    state v = 0.0\n    update:\n        v = 0.5*v + x\n    output v\n",
    "neuron B:\n    input x\n    state v = 0.0\n    state w = 1.0\n    update:\n        v = 0.5*v + w*x\n"
    "        w = 0.9*w\n    output v\n"])
def test_a_model_without_params_backpropagates_on_the_cpu_kernels(text):
    """A model with no params: its backward returned None for the empty list of numbers, which
    autograd refused (a bare structure error) on the default backend for CPU float tensors."""
    x = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
    flexdsl.loads(text, backend="cpu")(x).sum().backward()
    got = x.grad.clone()
    x.grad = None
    flexdsl.loads(text, backend="torch")(x).sum().backward()
    assert torch.allclose(got, x.grad, rtol=0, atol=1e-15)
    assert got[0, 0] > 1.0  # (the first step's input reaches every later step)
