"""Fuzzing the classes of issue 18 ("no silent wrong numbers"), hypothesis-driven:

- extreme constants (overflowing, underflowing, NaN-making, integers beyond 64 bits, values
  beyond float32 or float16, unit products) in every position of a model, and numbers written
  with non-ASCII digits: only a located `FlexDSLError` may escape, and where a model runs, the
  torch backend and the Triton kernels agree (both refuse it, or both give the same numbers);
- aliased inputs and gradients: random call sequences that hand one tensor to several input
  slots, or one gradient tensor to several outputs, on a long-lived Triton module whose launch
  plans persist across cases, each call equal to the torch backend;
- threads on a cold start: fresh processes whose threads compile different new models at once.

10,486 cases per run (6,500 + 2,000 + 150 + 1,500 + 300 + 36), in about two minutes on two CPU
cores (`FLEXDSL_FUZZ_SCALE` multiplies the counts for longer local runs); each test states its
count."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flexdsl
from flexdsl.runtime.compiler import compile_text

from tolerances import assert_close, condition, scan_ops

ROOT = Path(__file__).resolve().parent.parent
SCALE = float(os.environ.get("FLEXDSL_FUZZ_SCALE", "1"))
SETTINGS = dict(deadline=None, database=None,  # (repeatable draws, or new ones: tests/conftest.py)
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------ extreme constants
EXTREME = [
    "1e308", "1.7976931348623157e308", "1e309", "1e-308", "1e-320", "4.9e-324", "1e-400", "0e400", "0.0e-999",
    "-0.0", "18446744073709551616", "18446744073709551617", "9223372036854775808", "1" + "0" * 30,
    "1" + "0" * 400, "0." + "0" * 330 + "1", "123456789012345678901234567890.5", "1e308*10", "1e308*10 - 1e308*10",
    "-(1e200*1e200)", "1e-200*1e-200", "exp(710)", "exp(-746)", "log(0)", "sqrt(-1)", "0/0", "1/0", "(-8)**(1/3)",
    "2**1024", "2**-1075", "where(1 > 0, 1e308*10, 0)", "clip(1e309, 0, 1)", "min(1e308, 1e308*10)", "1e38",
    "3.5e38", "-3.5e38", "65504", "65520", "1e5", "-1e300", "1e300", "(1e308 + 1e308) / 2", "1e-45", "1e-46",
    # integers no float64 holds exactly (sympy folds them exactly; torch's scalars and Triton's integer constants
    # stop at 64 bits), negative square roots and fractional powers of negative constants
    "2**70", "-2**64", "2**53 + 1", "3**40", "10**20", "4294967296*4294967296", "2**63", "9007199254740993",
    "2**70 * 2**70", "2**200", "2**1023 * 2", "2**-1074", "sqrt(-2)", "sqrt(-1e-300)", "(-1)**0.5", "sqrt(1 - 2)",
    "sqrt(2**70 - 2**71)", "(-2)**(1/2)",
]
NON_ASCII = ["1\u06605", "\uff13.5", "\u0663", "1e\u0665", "\u0663.\u0665", "2\u0e52", "\u00b2", "\u2155", "\u0969"]
SANE = ["0", "1", "0.5", "2.0", "0.25", "3", "1.5", "-1.0"]
SLOTS = ["P1", "P2", "P3", "S1", "S2", "C1", "C2", "C3", "C4", "C5", "C6", "C7"]

TEMPLATE = """neuron F:
    input x
    param a = {P1} where a > {P2}
    param b = {P3}{LEARN}
    state v = {S1}
    state w = {S2}
    update:
        v = v * {C1} + x * a + {C2}
        w = where(x > {C3}, {C4}, w * b)
    spike when v >= {C5} surrogate sigmoid(alpha={C6})
    on spike:
        v = {C7}
    output spike, v
"""
ODE = """neuron G:
    input x
    param tau = {P1}
    param dt = {P3}
    param k = {C6}
    state v = {S1}
    equations method {M}:
        dv/dt = (x * {C1} - v) / tau + k * {C2}
    spike when v >= {C5}
    on spike:
        v = {C7}
    output spike
"""
UNITS = """neuron U:
    input I : nA
    param C = {U1}
    param dt = 0.1 ms
    state v = {U2}
    equations:
        dv/dt = I / C
    output v
"""
UNIT_VALUES = ["1e300 pF", "1e-300 pF / 1e300", "1e308 GF", "1e-308 fF", "1e200 pF * 1e200", "1e300 pF / 1e-300",
               "200 pF", "1 nF", "1e-45 pF", "3.5e38 mV", "1e38 mV", "0 mV", "-65 mV", "1e309 mV", "1e-400 mV"]


@st.composite
def extreme_model(draw, extremes=EXTREME + NON_ASCII) -> str:
    kind = draw(st.sampled_from(["template", "template", "ode", "units"]))
    if kind == "units":
        return UNITS.format(U1=draw(st.sampled_from(UNIT_VALUES[:10])), U2=draw(st.sampled_from(UNIT_VALUES[9:])))
    values = {s: draw(st.sampled_from(SANE)) for s in SLOTS}
    values["P2"], values["C6"] = "-10", "4.0"  # (a sane constraint and surrogate: the extremes decide)
    for s in draw(st.lists(st.sampled_from(SLOTS), min_size=1, max_size=3, unique=True)):
        values[s] = draw(st.sampled_from(extremes))
    values["LEARN"] = " learnable" if draw(st.booleans()) else ""
    if kind == "ode":
        values["M"] = draw(st.sampled_from(["exact", "euler", "rk4", "exponential_euler", "heun"]))
        return ODE.format(**values)
    return TEMPLATE.format(**values)


def _located(e: flexdsl.FlexDSLError) -> None:
    assert e.format().startswith(e.filename), e  # FILE[:LINE:COL]: error: ...
    assert "\x1b" not in str(e)


@settings(max_examples=int(650 * SCALE), **SETTINGS)
@given(st.lists(extreme_model(), min_size=10, max_size=10))
def test_fuzz_extreme_constants_and_digits_are_located_errors_at_check(texts):
    """6,500 models (10 per example): parse and check (defaults, constraints, units) with
    extreme constants and non-ASCII digits anywhere: a located error or a checked model,
    nothing else. Non-ASCII digits never pass as numbers."""
    for text in texts:
        try:
            compile_text(text)
        except flexdsl.FlexDSLError as e:
            _located(e)
            continue
        assert not any(d in text for d in NON_ASCII), text


X = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [3.0, 1.0, 0.0]])


def _run(text: str, backend: str, dtype: torch.dtype):
    """(outputs, final states, state sequences, the largest param) of one call, or the
    FlexDSLError; nothing else may happen."""
    try:
        m = flexdsl.loads(text, backend=backend, store_state_seqs=True)
        if dtype == torch.float64:
            m = m.double()
        out = m(X.to(dtype))
        out = out if isinstance(out, tuple) else (out,)
        values = [o.detach().double() for o in out] + [getattr(m, s).detach().double() for s in m.state_names]
        seqs = [q.detach().double() for q in m.state_seqs.values()]
        big = max((float(v.detach().abs().max()) if isinstance(v, torch.Tensor) else abs(float(v))
                   for v in m.param_values().values()), default=0.0)
        return values, seqs, big
    except flexdsl.FlexDSLError as e:
        _located(e)
        return e


def _intermediates(text: str) -> float:
    """The largest finite magnitude a float64 call on X computes inside its steps: every value the
    torch backend's generated step (`core`) holds when it returns, read from its frame."""
    largest = [0.0]

    def watch(frame, event, arg):
        code = frame.f_code
        if event == "return" and code.co_name == "core" and code.co_filename.startswith("<flexdsl-generated"):
            for v in frame.f_locals.values():
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
                    finite = v.detach()[torch.isfinite(v.detach())]
                    if finite.numel():
                        largest[0] = max(largest[0], float(finite.abs().max()))

    m = flexdsl.loads(text, backend="torch", store_state_seqs=True).double()
    sys.setprofile(watch)
    try:
        m(X.double())
    finally:
        sys.setprofile(None)
    return largest[0]


def _agree(a: torch.Tensor, b: torch.Tensor, text: str, ref) -> None:
    """A float32 result against `ref_dtype`'s: within the model's counted operations over the 3
    steps of X, relative to the largest magnitude the call computed (its outputs, states and
    state sequences, and the values inside its steps: `v + dt/2*(k1 + k2)` rounds relative to k1
    and k2 where they cancel), amplified by the float64 condition of the call where that bound is
    not met (extreme constants: cancellations)."""
    scale = max([float(t.abs().max()) for t in [*ref[0], *ref[1]] if t.numel()] + [_intermediates(text)])

    def cond() -> float:
        def run(x):
            m = flexdsl.loads(text, backend="torch", store_state_seqs=True).double()
            out = m(x)
            out = out if isinstance(out, tuple) else (out,)
            return [*out, *m.state_seqs.values()]

        return condition(run, X)

    # (both sides come as float64 copies: the arithmetic was float32's, on one side or both)
    assert_close(a, b, ops=scan_ops(text, X.shape[0], backward=False), cond=cond, scale=scale,
                 precision=torch.float32, what=text)


def _comparable(text: str, run64) -> bool:
    """Whether float32 must give the float64 result: no literal that float32 holds only
    inexactly (a spike decided on a rounding), and a float64 run whose values, params and the
    values inside its steps stay far inside float32's range (so that no product of two of them
    leaves it: `v * 2**64` with `v = 2**70` is inf in float32)."""
    import re
    import struct

    largest = 0.0
    for lit in re.findall(r"(?<![A-Za-z_])[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?", text):
        v = float(lit)
        if v != 0 and abs(v) <= 3.4e38 and struct.unpack("f", struct.pack("f", v))[0] != v:
            return False
        largest = max(largest, abs(v))
    if largest * largest >= 3.4e38:  # two literals (an initial state times a factor) may overflow float32 inside a step
        return False
    values, seqs, big = run64
    return big < 1e15 and all(bool((t.abs() < 1e15).all()) for t in [*values, *seqs]) and _intermediates(text) < 1e15


@settings(max_examples=int(500 * SCALE), **SETTINGS)
@given(st.lists(extreme_model(EXTREME), min_size=4, max_size=4))
def test_fuzz_extreme_constants_lowered_and_run(texts):
    """2,000 models (4 per example), lowered and run on the torch backend in float64 and float32:
    only located errors; a model that runs in float32 runs in float64 too, and float32 gives
    the float64 result to float32 precision wherever that result is finite and within range
    (constants and params that float32 cannot hold are refused, not rounded to inf or 0)."""
    for text in texts:
        r64 = _run(text, "torch", torch.float64)
        r32 = _run(text, "torch", torch.float32)
        if isinstance(r32, tuple):
            assert isinstance(r64, tuple), (text, r64)
            if _comparable(text, r64):
                for a, b in zip(r32[0], r64[0]):
                    _agree(a, b, text, r64)


@settings(max_examples=int(150 * SCALE), **SETTINGS)
@given(extreme_model(EXTREME))
def test_fuzz_extreme_constants_both_backends_agree(text):
    """150 models on the Triton kernels (interpreter) and the torch backend in float32: both
    refuse the model with the same located error, or both give the same numbers."""
    tri = _run(text, "triton", torch.float32)
    ref = _run(text, "torch", torch.float32)
    assert isinstance(tri, flexdsl.FlexDSLError) == isinstance(ref, flexdsl.FlexDSLError), (text, tri, ref)
    if isinstance(tri, flexdsl.FlexDSLError):
        assert (tri.line, tri.column) == (ref.line, ref.column), (text, tri, ref)
        return
    for a, b in zip(tri[0], ref[0]):
        _agree(a, b, text, ref)


# ------------------------------------------------------------------ aliased inputs and gradients
ALIAS_MODEL = """neuron Alias:
    input x, y
    param a = 0.5 learnable
    state v = 0.0
    update:
        v = a * v + x - 2 * y
    spike when v >= 1.0 surrogate sigmoid(alpha=4.0)
    on spike:
        v = 0.0
    output spike, v
"""
_MODULES: dict[str, object] = {}  # one module per backend for the whole run: its launch plans persist


def _alias_modules():
    if not _MODULES:
        _MODULES["triton"] = flexdsl.loads(ALIAS_MODEL, backend="triton")
        _MODULES["torch"] = flexdsl.loads(ALIAS_MODEL, backend="torch")
    return _MODULES["triton"], _MODULES["torch"]


SHAPES = [(4, 8), (4, 2, 4), (6, 8), (1, 8)]


@st.composite
def alias_call(draw, grads: bool):
    shape = draw(st.sampled_from(SHAPES))
    slots = draw(st.lists(st.integers(0, 2), min_size=2, max_size=2))  # which pool tensor feeds each input
    grad = draw(st.sampled_from(["same", "sum", "distinct", "one", "state"])) if grads else "none"
    return shape, slots, grad, draw(st.booleans()), draw(st.sampled_from(["save", "recompute"])), \
        draw(st.integers(0, 2**31 - 1))


def _loss(kind: str, m, s: torch.Tensor, v: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Losses whose backward hands one gradient tensor to several outputs ("same": ((s + v) * c),
    "sum") or distinct ones, or reaches the kept state."""
    if kind == "same":
        return ((s + v) * c).sum()
    if kind == "sum":
        return (s + v).sum() + v.sum()
    if kind == "distinct":
        return (s * c).sum() + (v * c * 2).sum()
    if kind == "one":
        return (v * c).sum()
    return (m.v * 2).sum() + (v * c).sum()


def _alias_case(calls) -> None:
    tri, ref = _alias_modules()
    program = tri.compiled.program("triton")
    for shape, slots, grad, strided, plan, seed in calls:
        program.train_plan = plan  # (both training plans keep launch plans)
        g = torch.Generator().manual_seed(seed)
        pool = [torch.randint(-8, 9, shape, generator=g).float() / 8 for _ in range(3)]
        if strided and len(shape) == 3:
            pool = [p.transpose(1, 2).contiguous().transpose(1, 2) for p in pool]  # (non-contiguous views)
        c = torch.randint(-4, 5, shape, generator=g).float() / 4
        results = []
        for m in (tri, ref):
            m.reset()
            leaves = [p.clone().requires_grad_(grad != "none") for p in pool]
            s, v = m(*(leaves[i] for i in slots))
            out = [s.detach(), v.detach()]
            if grad != "none":
                _loss(grad, m, s, v, c).backward()
                out += [p.grad if p.grad is not None else torch.zeros_like(p) for p in leaves] + [m.a.grad.reshape(1)]
                m.a.grad = None
            results.append(out)
        ops = scan_ops(ALIAS_MODEL, shape[0], math.prod(shape))
        for k, (a, b) in enumerate(zip(*results)):
            scale = None
            if k == len(results[1]) - 1 and grad != "none":
                # a's gradient sums v[t-1] * dL/dv[t] over the call's elements, terms of either sign:
                # its rounding is relative to the sum of their magnitudes, not to the (cancelled) sum
                v, gs = results[1][1], results[1][2:-1]
                scale = math.prod(shape) * float(v.abs().max()) * max(float(g.abs().max()) for g in gs)
            assert_close(a, b, ops=ops, scale=scale, what=str((shape, slots, grad)))


@settings(max_examples=int(500 * SCALE), **SETTINGS)
@given(st.lists(alias_call(False), min_size=3, max_size=3))
def test_fuzz_aliased_inputs(calls):
    """1,500 calls (3 per example): one tensor in several input slots (m(a, a)), in random
    order with other shapes and strides, on one long-lived Triton module (its launch plans
    persist across cases): each call equals the torch backend's."""
    _alias_case(calls)


@settings(max_examples=int(150 * SCALE), **SETTINGS)
@given(st.lists(alias_call(True), min_size=2, max_size=2))
def test_fuzz_aliased_gradients(calls):
    """300 forward+backward calls (2 per example): one gradient tensor handed to several
    outputs (((s + v) * c).sum()) and aliased inputs, with both training plans: the input and
    param gradients equal the torch backend's."""
    _alias_case(calls)


# ------------------------------------------------------------------ threads on a cold start
_COLD = r'''
import sys, threading
import flexdsl
import torch
N, seed = 12, int(sys.argv[1])
barrier = threading.Barrier(N)
errors = []

def work(i):
    k = seed * 100 + i
    if i % 4 == 0:
        text = (f"neuron U{k}:\n    input I : nA\n    param C = {i + 1} pF\n    param dt = 0.1 ms\n"
                "    state v = 0 mV\n    equations:\n        dv/dt = I / C\n    output v\n")
    else:
        method = ["exact", "euler", "rk4", "exponential_euler"][i % 4]
        text = (f"neuron T{k}:\n    input x\n    param tau = {2 + i}.0\n    param dt = 0.1\n    state v = 0.0\n"
                f"    equations method {method}:\n        dv/dt = (x - v) / tau\n    spike when v >= 1\n"
                "    output spike\n")
    barrier.wait()
    try:
        if i % 3 == 0:
            flexdsl.loads(text, backend="torch")(torch.ones(3, 2))
        elif i % 3 == 1:
            flexdsl.compile(text).torch_source
        else:
            flexdsl.docs.latex(text, "step")
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")

threads = [threading.Thread(target=work, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
'''


@pytest.mark.parametrize("run", range(max(1, int(3 * SCALE))))
def test_fuzz_threads_on_a_cold_start(tmp_path, run):
    """3 fresh processes (36 threads): 12 threads each compile, load and document different new
    models at once (sympy is imported under one lock): none fails or leaves sympy half-imported."""
    env = dict(os.environ, FLEXDSL_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", _COLD, str(run)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
