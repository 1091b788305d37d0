"""Random histories against fresh modules (issue 36): a module (a neuron module, or a recurrent
layer) goes through a random history of what users do to it — calls, assignments through the API
(valid or not), optimizer steps (some with NaN gradients), in-place writes (`.data`, or under
`no_grad`), resets, dtype moves, `torch.compile` — and after every change, each call is compared
with a freshly built module given the same param values and the same states: the same outputs
(to the rounding of the values read back), or both refuse with a located `FlexDSLError`. A module
never returns a number a fresh module with its values would not."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import flexdsl
from flexdsl import FlexDSLError

from tolerances import assert_close, layer_ops, scan_ops

SCALE = float(os.environ.get("FLEXDSL_FUZZ_SCALE", "1"))
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])

# a bounded learnable param (tau > 1), an unbounded learnable denominator (a), a per-channel
# buffer (k, inside an exp), a float param (th)
MODEL = """neuron Hist:
    input x
    param tau = 2.0 where tau > 1 learnable
    param a = 1.0 learnable
    param k = 0.5
    param th = 1.0
    state v = 0.0
    update:
        v = v + (x / a * exp(k) - v) / tau
    spike when v >= th surrogate sigmoid(alpha=4.0)
    on spike:
        v = 0.0
    output spike, v
"""
C = 3  # channels of k
VALUES = [0.5, 2.0, 3.0, -1.0, 0.0, 1e-50, 1e30, 200.0, float("nan"), float("inf")]


@st.composite
def histories(draw, layer: bool) -> list[tuple]:
    ops: list[tuple] = []
    for _ in range(draw(st.integers(3, 9))):
        kind = draw(st.sampled_from(["call", "call", "assign", "optimizer", "data", "no_grad", "reset", "dtype",
                                     "compile"]))
        if kind in ("assign", "data", "no_grad"):
            names = ["tau", "a", "k", "th"] if kind == "assign" else ["a", "k"] + (["raw_tau"] if kind == "data" else [])
            ops.append((kind, draw(st.sampled_from(names)), draw(st.sampled_from(VALUES))))
        elif kind == "optimizer":
            ops.append((kind, draw(st.sampled_from([1e-2, 1.0, 1e6])), draw(st.booleans())))
        elif kind == "dtype":
            ops.append((kind, draw(st.sampled_from(["double", "float"]))))
        else:
            ops.append((kind, draw(st.integers(0, 2**31 - 1))))
    return ops


def _fresh(m, layer):
    """A module built from scratch with `m`'s param values (and a layer's weights), or the
    FlexDSLError building it raises."""
    neuron = m.neuron if layer else m
    vals = {}
    for n, v in neuron.param_values().items():
        vals[n] = v.detach().double().clone() if isinstance(v, torch.Tensor) and v.numel() > 1 else float(v)
    try:
        fresh = flexdsl.loads(MODEL, param_shapes={"k": (C,)}, backend="torch", **vals)
        if layer:
            fresh = flexdsl.recurrent(fresh, C, C, backend="torch")
    except FlexDSLError as e:
        return e
    _same_dtypes(fresh, m)  # (what m holds in which dtype, after its moves)
    target = fresh.neuron if layer else fresh
    try:
        for n, v in vals.items():  # (again, in those dtypes: a bounded param's raw value found in float64 when it is one)
            setattr(target, n, v)
    except FlexDSLError as e:
        return e
    if layer:
        with torch.no_grad():  # (m's weights, in their dtype)
            for n in ("W_in", "W_rec", "bias"):
                getattr(fresh, n).copy_(getattr(m, n))
    return fresh


def _same_dtypes(fresh, m) -> None:
    """Each parameter and buffer of `fresh` in the dtype of `m`'s of the same name."""
    mine = dict(m.named_parameters()) | dict(m.named_buffers())
    with torch.no_grad():
        for n, t in [*fresh.named_parameters(), *fresh.named_buffers()]:
            if n in mine and t.dtype != mine[n].dtype:
                t.data = t.data.to(mine[n].dtype)


def _call(f, m, layer, x):
    """(outputs, the kept states after the call) or the FlexDSLError, with the states before it."""
    neuron = m.neuron if layer else m
    before = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in neuron._states.items()}
    fb = m.feedback.detach().clone() if layer and m.feedback is not None else None
    try:
        out = f(x)
    except FlexDSLError as e:
        return e, before, fb
    return [o.detach() for o in out], before, fb


def _reference(m, layer, x, before, fb):
    ref = _fresh(m, layer)
    if isinstance(ref, FlexDSLError):
        return ref
    neuron = ref.neuron if layer else ref
    for k, v in before.items():
        neuron._states[k] = v
    if layer:
        ref.feedback = fb
    try:
        return [o.detach() for o in ref(x)]
    except FlexDSLError as e:
        return e


def _apply(m, layer, op, state) -> None:
    neuron = m.neuron if layer else m
    kind = op[0]
    if kind == "assign":
        _, name, value = op
        v = torch.full((C,), value) if name == "k" else value
        try:
            setattr(neuron, name, v)
        except FlexDSLError:
            pass  # (a refused assignment changes nothing: tests/test_trust.py)
    elif kind in ("data", "no_grad"):
        _, name, value = op
        t = getattr(neuron, name)
        if kind == "data":
            t.data.fill_(value)
        else:
            with torch.no_grad():
                t.fill_(value)
    elif kind == "optimizer":
        _, lr, nan = op
        opt = torch.optim.SGD(m.parameters(), lr=lr)
        for p in m.parameters():
            p.grad = torch.full_like(p, float("nan")) if nan else torch.randn(p.shape, dtype=p.dtype)
        opt.step()
    elif kind == "reset":
        m.reset()
    elif kind == "dtype":
        state["dtype"] = torch.float64 if op[1] == "double" else torch.float32
        m.to(state["dtype"])
        m.reset()
    elif kind == "compile":
        torch._dynamo.reset()
        state["f"] = torch.compile(m, fullgraph=True, backend="aot_eager")


def _run_history(layer: bool, ops: list[tuple]) -> None:
    torch.manual_seed(0)
    m = flexdsl.loads(MODEL, param_shapes={"k": (C,)}, backend="torch")
    if layer:
        m = flexdsl.recurrent(m, C, C, backend="torch")
    state = {"f": m, "dtype": torch.float32}
    for op in ops:
        if op[0] != "call":
            _apply(m, layer, op, state)
            continue
        g = torch.Generator().manual_seed(op[1])
        dtype = state["dtype"]
        x = (torch.rand(4, 2, C, generator=g) * 3).to(dtype)
        got, before, fb = _call(state["f"], m, layer, x)
        want = _reference(m, layer, x, before, fb)
        if isinstance(want, FlexDSLError) or isinstance(got, FlexDSLError):
            assert isinstance(got, FlexDSLError) and isinstance(want, FlexDSLError), (ops, op, got, want)
            continue
        # the fresh module holds the values read back (a bounded param's value through its raw
        # Parameter: an ulp), so each output to the rounding of 4 steps (and a layer's products)
        ops_n = layer_ops(MODEL, 4, 2, C, C) if layer else scan_ops(MODEL, 4)
        spikes, v = got
        spikes_ref, v_ref = want
        assert torch.equal(spikes, spikes_ref), ops
        assert_close(v, v_ref, ops=ops_n, what=str(ops))


@settings(max_examples=int(60 * SCALE), **SETTINGS)
@given(histories(layer=False))
def test_neuron_module_histories_equal_fresh_modules(ops):
    _run_history(False, ops)


@settings(max_examples=int(40 * SCALE), **SETTINGS)
@given(histories(layer=True))
def test_recurrent_layer_histories_equal_fresh_layers(ops):
    _run_history(True, ops)


@pytest.mark.parametrize("layer", [False, True], ids=["neuron", "layer"])
def test_an_in_place_nan_after_a_call_is_refused(layer):
    """The examples that the fresh-module comparison must catch (a regression: the params were
    checked once per precision, not after an in-place change)."""
    for op in (("optimizer", 1.0, True), ("data", "a", float("nan")), ("no_grad", "k", float("inf")),
               ("data", "raw_tau", float("nan")), ("no_grad", "a", 1e-50)):
        _run_history(layer, [("call", 1), op, ("call", 2)])
