"""Property tests (hypothesis): random expressions go through parse -> sympy -> torch printer
and compute what Python computes for the same text; random LIF params keep SpikingJelly's
semantics of charge, fire, reset; and over random models and random histories of calls (shapes,
aliased inputs, dtypes, the functional form, gradients, param changes, resets) the Triton kernels
(interpreter) return what a fresh torch-backend module given the same history returns."""

from __future__ import annotations

import math
import os

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import flexdsl

from tolerances import assert_close, scan_ops

NAMES = ["x", "v", "a", "b"]


@st.composite
def expressions(draw, depth: int = 0) -> str:
    if depth > 3 or draw(st.booleans()):
        if draw(st.booleans()):
            return draw(st.sampled_from(NAMES))
        return repr(draw(st.floats(min_value=0.1, max_value=3.0, allow_nan=False)).__round__(3))
    kind = draw(st.sampled_from(["+", "-", "*", "/", "neg", "exp", "tanh", "sigmoid", "abs", "min", "max", "pow"]))
    a = draw(expressions(depth=depth + 1))
    if kind in "+-*/":
        b = draw(expressions(depth=depth + 1))
        if kind == "/":
            return f"({a}) / (1.5 + abs({b}))"
        return f"({a}) {kind} ({b})"
    if kind == "neg":
        return f"-({a})"
    if kind == "pow":
        return f"({a}) ** 2"
    if kind == "exp":
        return f"exp(tanh({a}))"
    if kind in ("min", "max"):
        b = draw(expressions(depth=depth + 1))
        return f"{kind}({a}, {b})"
    return f"{kind}({a})"


def python_value(expr: str, env: dict[str, float]) -> float:
    """The same text evaluated by Python itself (the test's independent reference)."""
    funcs = {"exp": math.exp, "tanh": math.tanh, "abs": abs, "min": min, "max": max,
             "sigmoid": lambda z: 1.0 / (1.0 + math.exp(-z))}
    return eval(expr, {"__builtins__": {}}, {**funcs, **env})  # noqa: S307 - test-generated text only


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(expressions(), st.lists(st.floats(-2, 2), min_size=4, max_size=4))
def test_expression_semantics_match_python(expr: str, vals: list[float]) -> None:
    text = f"""neuron Expr:
    input x
    param a = 0.7
    param b = 1.3
    state v = 0.0
    update:
        v = {expr}
    output v
"""
    x, v, a, b = vals
    m = flexdsl.loads(text, a=a, b=b).to(torch.float64)
    m.v = torch.tensor([v], dtype=torch.float64)
    out = m(torch.tensor([[x]], dtype=torch.float64))
    ref = python_value(expr, {"x": x, "v": v, "a": a, "b": b})
    assert math.isclose(out.item(), ref, rel_tol=1e-12, abs_tol=1e-12), (expr, out.item(), ref)


@settings(max_examples=40, deadline=None)
@given(st.floats(1.01, 10.0), st.floats(0.1, 2.0), st.floats(-1.0, 0.0),
       st.lists(st.floats(-1.0, 3.0), min_size=1, max_size=12))
def test_lif_charge_fire_reset(tau: float, vth: float, vreset: float, xs: list[float]) -> None:
    """flexdsl's LIF equals the textbook recurrence (SpikingJelly's LIFNode semantics) in float64."""
    m = flexdsl.load("lif", tau=tau, v_threshold=vth, v_reset=vreset).to(torch.float64)
    s = m(torch.tensor(xs, dtype=torch.float64).reshape(-1, 1))
    v = vreset
    for t, x in enumerate(xs):
        h = v + (x - (v - vreset)) / tau
        spike = 1.0 if h >= vth else 0.0
        v = spike * vreset + (1 - spike) * h
        assert s[t, 0].item() == spike
    assert math.isclose(m.v.item(), v, rel_tol=1e-12, abs_tol=1e-12)


# ------------------------------------------------------------------ Triton kernels = torch backend, over histories
# Random models of an exact family (dyadic constants, decays 1/2 and 1/4, inputs in quarters,
# at most 4 steps a call): every value is exact in float32 and float16 on both backends, so a
# call's outputs must be equal, not close, whatever came before it.
DYADIC = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, -0.5, -1.0])


@st.composite
def exact_models(draw) -> tuple[str, dict]:
    two = draw(st.booleans())
    spiking = draw(st.booleans())
    second = draw(st.booleans())
    lines = ["neuron Prop:", "    input x, y" if two else "    input x",
             f"    param a = {draw(st.sampled_from([0.5, 0.25]))}{' learnable' if draw(st.booleans()) else ''}",
             f"    param b = {draw(DYADIC)}{' learnable' if draw(st.booleans()) else ''}",
             f"    param th = {draw(st.sampled_from([0.5, 1.0, 2.0]))}", "    state v = 0.0"]
    if second:
        lines.append(f"    state w = {draw(DYADIC)}")
    lines.append("    update:")
    lines.append("        v = a * v + b * x" + (" - y" if two else "") + (" + 0.5 * w" if second else ""))
    if second:
        lines.append(draw(st.sampled_from(["        w = 0.5 * w + where(x > 0.25, 0.5, -0.25)",
                                           "        w = clip(w + x, -2, 2) * 0.5", "        w = max(w, x) * 0.25",
                                           "        w = min(w * 0.5, y)" if two else "        w = min(w * 0.5, x)"])))
    if spiking:
        lines.append("    spike when v >= th")
        lines += ["    on spike:", draw(st.sampled_from(["        v = 0.0", "        v -= th"]))]
        lines.append("    output spike, v")
    else:
        lines.append("    output v")
    shapes = {"a": (4,)} if draw(st.booleans()) else {}
    return "\n".join(lines) + "\n", shapes


@st.composite
def histories(draw) -> list[tuple]:
    ops = []
    for _ in range(draw(st.integers(2, 7))):
        kind = draw(st.sampled_from(["call", "call", "call", "grad", "reset", "param", "step"]))
        if kind in ("call", "grad", "step"):
            dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float16]))
            T = draw(st.integers(0, 4))
            if dtype == torch.float16:  # (few steps from a reset: every value fits float16's 11 bits exactly;
                T = min(T, 2)           # the torch backend rounds each operation to float16, the kernels only stores)
                if kind != "step":
                    ops.append(("reset",))
            ops.append((kind, T, draw(st.sampled_from([(4,), (2, 4), (1, 4)])), dtype, draw(st.booleans()),
                        draw(st.integers(0, 2**31 - 1))))
        elif kind == "param":
            ops.append((kind, draw(st.sampled_from(["a", "b", "th"])), draw(DYADIC), draw(st.booleans())))
        else:
            ops.append((kind,))
    return ops


def _apply(m, op, two: bool):
    """One operation of a history on a module: (exact values, gradients) it gives as float64
    lists (outputs and states must be equal, gradients go through the surrogate's float32
    arithmetic), None for a reset or a param change, or the FlexDSLError it raised."""
    kind = op[0]
    try:
        if kind == "reset":
            m.reset()
            return None
        if kind == "param":
            _, name, value, per_channel = op
            if name == "a":
                value = 0.5 if value > 0 else 0.25  # (a decay)
            current = getattr(m, name)
            if per_channel and isinstance(current, torch.Tensor) and current.numel() == 4:
                value = torch.tensor([value, value / 2, -value, value * 2]).clamp(-2, 2) if name != "a" else \
                    torch.tensor([value, 0.25, 0.5, value])
            m.detach()  # (the kept states' graph read the old value)
            setattr(m, name, value)
            return None
        _, T, shape, dtype, alias, seed = op
        g = torch.Generator().manual_seed(seed)
        xs = [(torch.randint(-8, 9, (T, *shape), generator=g).float() / 4).to(dtype) for _ in range(2 if two else 1)]
        if kind == "step":
            state = m.initial_state(*xs)
            state["v"] = (torch.randint(-4, 5, shape, generator=g).float() / 4).to(dtype)
            out, new = m.step(*xs, state=state)
            outs = list(out) if isinstance(out, tuple) else [out]
            return [o.detach().double() for o in outs] + [new[k].detach().double() for k in sorted(new)], []
        grad = kind == "grad" and dtype == torch.float32
        m.detach()  # (gradients of this call: the kept states enter as values, as in truncated BPTT)
        leaves = [x.clone().requires_grad_(grad) for x in xs]
        if two and alias:
            leaves[1] = leaves[0]  # one tensor in both input slots
        out = m(*leaves)
        outs = list(out) if isinstance(out, tuple) else [out]
        exact = [o.detach().double() for o in outs] + [getattr(m, s).detach().double() for s in m.state_names]
        grads: list = []
        if grad:
            c = torch.randint(-4, 5, outs[0].shape, generator=g).float() / 4
            loss = sum((o * c).sum() for o in outs)  # one gradient tensor for every output
            wrt = [*dict.fromkeys(leaves), *m.parameters()]
            grads = [torch.zeros(1, dtype=torch.float64) if gr is None else gr.double()
                     for gr in torch.autograd.grad(loss, wrt, allow_unused=True)]
            m.detach()
        return exact, grads
    except flexdsl.FlexDSLError as e:
        return e


@settings(max_examples=int(100 * float(os.environ.get("FLEXDSL_FUZZ_SCALE", "1"))), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(exact_models(), histories())
def test_triton_equals_a_fresh_torch_module_over_any_history(model, ops):
    """A random model and a random history of calls (shapes, aliased inputs, float32/float16,
    the functional form, gradients with one gradient tensor for every output), param changes
    and resets: every call on the Triton kernels (interpreter) returns what a fresh torch-backend
    module given the same history returns — equal outputs and states; gradients to float32
    rounding of the surrogate — or both refuse it with the same error."""
    text, shapes = model
    two = "input x, y" in text
    tri = flexdsl.loads(text, backend="triton", param_shapes=shapes)
    ref = flexdsl.loads(text, backend="torch", param_shapes=shapes)
    for op in ops:
        a, b = _apply(tri, op, two), _apply(ref, op, two)
        if isinstance(a, flexdsl.FlexDSLError) or isinstance(b, flexdsl.FlexDSLError):
            assert type(a) is type(b) and a.reason == b.reason, (text, op, a, b)
            continue
        if a is None or b is None:
            assert a is None and b is None
            continue
        assert len(a[0]) == len(b[0]) and len(a[1]) == len(b[1]), (text, op)
        for u, w in zip(a[0], b[0]):
            torch.testing.assert_close(u, w, rtol=0, atol=0, msg=f"{text}\n{op}")
        for u, w in zip(a[1], b[1]):  # (at most 4 steps; a param's gradient sums at most 4 x 2 x 4 terms)
            assert_close(u, w, ops=scan_ops(text, 4, 32), precision=torch.float32, what=f"{text}\n{op}")
