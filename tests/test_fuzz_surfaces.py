"""Fuzz of the surfaces added after the neuron module (issue 36): recurrent layers, noise, bounded
learnable params and compiled calls, on the torch backend and the CPU kernels, in float32 and
float64, with param values from the extreme ones (1e-50, 1e30, 0, negative, NaN, inf) and in-place
changes (an optimizer step from a NaN gradient, `.data` writes) before the call.

Every case holds:
- no raw exception: building, assigning and calling either work or raise a located `FlexDSLError`;
- one rule everywhere: the call refuses exactly when a fresh float64 module (or layer) on the torch
  backend, given the same values, refuses the same call in the same precision; where neither
  refuses, the outputs equal the reference's, to the rounding of the call's precision
  (tests/tolerances.py) in float64, and in float32 they are finite wherever the float64 reference
  stays well inside float32's range (a NaN there is a silently wrong number);
- a compiled call (a smaller family: each compiles) returns the eager call's outputs, bit for bit,
  or raises the eager call's error.

With tests/test_fuzz.py, tests/test_fuzz_trust.py, tests/test_histories.py and
tests/test_properties.py this makes more than 10,000 generated cases a run
(`FLEXDSL_FUZZ_SCALE` multiplies them)."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flexdsl
from flexdsl import FlexDSLError
from flexdsl.backends import get as get_backend

from noisy_models import NLIF
from tolerances import assert_close, layer_ops, scan_ops

SCALE = float(os.environ.get("FLEXDSL_FUZZ_SCALE", "1"))
SETTINGS = dict(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
CPU = get_backend("cpu").available()
BACKENDS = ["torch", *(["cpu"] if CPU else [])]

# a bounded learnable param (tau > 1), an unbounded learnable denominator (a), a per-channel
# buffer inside an exp (k), a constrained float (th)
BOUNDED = """neuron Bounded:
    input x
    param tau = 2.0 where tau > 1 learnable
    param a = 1.0 learnable
    param k = 0.5
    param th = 1.0 where th > 0
    state v = 0.0
    update:
        v = v + (x / a * exp(k) - v) / tau
    spike when v >= th surrogate sigmoid(alpha=4.0)
    on spike:
        v = 0.0
    output spike, v
"""
MODELS = {"bounded": (BOUNDED, ["tau", "a", "k", "th"]), "noisy": (NLIF, ["tau", "sigma", "v_threshold"])}
C = 3
VALUES = [0.5, 2.0, 3.0, -1.0, 0.0, 1e-50, 1e-30, 1e30, 200.0, 1.5, float("nan"), float("inf")]
CHANGES = ["none", "none", "nan_step", "data", "huge_step"]


@st.composite
def cases(draw):
    model = draw(st.sampled_from(sorted(MODELS)))
    names = MODELS[model][1]
    vals = {n: draw(st.sampled_from(VALUES)) for n in draw(st.lists(st.sampled_from(names), max_size=2, unique=True))}
    return dict(model=model, vals=vals, layer=draw(st.booleans()), backend=draw(st.sampled_from(BACKENDS)),
                dtype=draw(st.sampled_from([torch.float32, torch.float64])), T=draw(st.integers(1, 5)),
                seed=draw(st.integers(0, 2**31 - 1)), change=draw(st.sampled_from(CHANGES)),
                change_value=draw(st.sampled_from(VALUES)))


def _located(e: FlexDSLError) -> None:
    text = str(e)
    assert ":" in text.splitlines()[0] and "error" in text.splitlines()[0], text


def _build(model: str, vals: dict, layer: bool, backend: str, dtype: torch.dtype):
    """The module (a neuron module or a layer of C neurons) on `backend` in `dtype`, or the
    FlexDSLError building it raises."""
    text = MODELS[model][0]
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # (a Parameter holds its value in `dtype` from the start)
    try:
        m = flexdsl.loads(text, backend=backend, **vals)
        if layer:
            torch.manual_seed(0)
            m = flexdsl.recurrent(m, C, C, backend=backend)
    except FlexDSLError as e:
        _located(e)
        return e
    finally:
        torch.set_default_dtype(default)
    return m.to(dtype)


def _change(m, layer: bool, change: str, value: float) -> None:
    """An in-place change the API does not see."""
    neuron = m.neuron if layer else m
    params = [p for p in neuron.parameters()]
    if change == "none" or not params:
        return
    if change == "data":
        params[0].data.fill_(value)
        return
    opt = torch.optim.SGD(m.parameters(), lr=1e6 if change == "huge_step" else 1.0)
    for p in m.parameters():
        p.grad = torch.full_like(p, float("nan")) if change == "nan_step" else torch.ones_like(p)
    opt.step()


def _values(m, layer: bool) -> dict:
    neuron = m.neuron if layer else m
    out = {}
    for n, v in neuron.param_values().items():
        v = v.detach() if isinstance(v, torch.Tensor) else v
        out[n] = v.double().clone() if isinstance(v, torch.Tensor) and v.numel() > 1 else float(v)
    return out


def _call(m, x: torch.Tensor, seed: int, noisy: bool):
    try:
        out = m(x, seed=seed) if noisy else m(x)
    except FlexDSLError as e:
        _located(e)
        return e
    return [o.detach() for o in (out if isinstance(out, tuple) else (out,))]


def _reference(case: dict, m, x: torch.Tensor):
    """A fresh torch-backend float64 module with `m`'s values (and weights), called on `x` in the
    call's precision: float64 values, the precision checks of `case['dtype']`."""
    layer = case["layer"]
    try:
        vals = _values(m, layer)
    except FlexDSLError as e:
        return e
    ref = _build(case["model"], vals, layer, "torch", torch.float64)
    if isinstance(ref, FlexDSLError):
        return ref
    if layer:
        with torch.no_grad():
            for n in ("W_in", "W_rec", "bias"):
                getattr(ref, n).copy_(getattr(m, n))
    noisy = case["model"] == "noisy"
    if case["dtype"] != torch.float64:  # (the same call in float32 is what the module checks)
        probe = _build(case["model"], vals, layer, "torch", case["dtype"])
        if isinstance(probe, FlexDSLError):
            return probe
        if layer:
            with torch.no_grad():
                for n in ("W_in", "W_rec", "bias"):
                    getattr(probe, n).copy_(getattr(m, n))
        res = _call(probe, x, case["seed"], noisy)
        if isinstance(res, FlexDSLError):
            return res
    return _call(ref, x.double(), case["seed"], noisy)


def _module_and_input(case: dict):
    """(the case's module after its in-place change, its input), or None where building it is
    refused (with a located error: `_build`)."""
    m = _build(case["model"], case["vals"], case["layer"], case["backend"], case["dtype"])
    if isinstance(m, FlexDSLError):
        return None
    _change(m, case["layer"], case["change"], case["change_value"])
    g = torch.Generator().manual_seed(case["seed"])
    return m, (torch.rand(case["T"], 2, C, generator=g) * 3).to(case["dtype"])


@settings(max_examples=int(2600 * SCALE), **SETTINGS)
@given(cases())
def test_fuzz_layers_noise_and_bounded_params(case):
    built = _module_and_input(case)
    if built is None:
        return
    m, x = built
    got = _call(m, x, case["seed"], case["model"] == "noisy")
    want = _reference(case, m, x)
    if isinstance(got, FlexDSLError) or isinstance(want, FlexDSLError):
        assert isinstance(got, FlexDSLError) and isinstance(want, FlexDSLError), (case, got, want)
        return
    text = MODELS[case["model"]][0]
    ops = layer_ops(text, case["T"], 2, C, C) if case["layer"] else scan_ops(text, case["T"])
    for a, b in zip(got, want):
        if case["dtype"] == torch.float64:
            assert_close(a, b, ops=ops, what=str(case))
        else:
            inside = torch.isfinite(b) & (b.abs() < 1e30)
            assert bool(torch.isfinite(a)[inside].all()), (case, a, b)


@settings(max_examples=int(30 * SCALE), **SETTINGS)
@given(cases())
def test_fuzz_compiled_calls_equal_eager_calls(case):
    built = _module_and_input(case)
    if built is None:
        return
    m, x = built
    noisy = case["model"] == "noisy"
    torch._dynamo.reset()
    f = torch.compile(m, fullgraph=True, backend="aot_eager")
    m.reset()
    got = _call(f, x, case["seed"], noisy)
    m.reset()
    want = _call(m, x, case["seed"], noisy)
    if isinstance(got, FlexDSLError) or isinstance(want, FlexDSLError):
        assert type(got) is type(want) and str(got) == str(want), (case, got, want)
        return
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda s: f"{case}: {s}")
