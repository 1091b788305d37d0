"""Constraints that hold through training (issue 19): a learnable param with a `where` bound
trains as the Parameter `raw_<name>` through a parametrization built from the bound, `m.<name>`
reads its value, and checkpoints of trained models load (also in a fresh process); PyTorch's own
tools on flexdsl params (parametrizations, weight_norm-style wrappers, functional_call, param
groups); SpikingJelly's names for recorded sequences (`v_seq`, AttributeMonitor).

References: the parametrization computed here from its definition (float64 softplus/sigmoid),
central finite differences in float64, the unconstrained model with the same value, SpikingJelly's
LIFNode and AttributeMonitor, a fresh Python process."""

from __future__ import annotations

import copy
import io
import math
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.functional import softplus

import flexdsl

from tolerances import assert_close, scan_ops

ROOT = Path(__file__).resolve().parent.parent
LIF_TEXT = (ROOT / "neurons" / "lif.neuron").read_text()


def _x(T=10, shape=(3, 4), seed=0, scale=2.5, dtype=torch.float32):
    return torch.rand(T, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


# ------------------------------------------------------------------ the parametrization
def test_the_values_are_the_parametrization_of_the_raw_parameters():
    m = flexdsl.load("lif", learnable=True)
    assert {n for n, _ in m.named_parameters()} == {"raw_tau", "v_threshold", "raw_v_reset"}
    assert m.tau.item() == 2.0 and m.v_reset.item() == 0.0  # the values given at load, read back exactly
    with torch.no_grad():
        m.raw_tau.fill_(0.3)
        m.raw_v_reset.fill_(-1.2)
        m.v_threshold.fill_(1.5)
    assert m.tau.item() == (1 + softplus(torch.tensor(0.3, dtype=torch.float64))).item()
    assert m.v_reset.item() == (1.5 - softplus(torch.tensor(-1.2, dtype=torch.float64))).item()
    s = flexdsl.load("snn_leaky", learnable="beta", beta=0.8)
    assert s.beta.item() == 0.8
    with torch.no_grad():
        s.raw_beta.fill_(-0.7)
    assert s.beta.item() == torch.sigmoid(torch.tensor(-0.7, dtype=torch.float64)).item()
    # the same outputs as the model with these values as plain params
    x = _x()
    plain = flexdsl.load("lif", tau=m.tau.item(), v_reset=m.v_reset.item(), v_threshold=1.5)
    assert torch.equal(m(x), plain(x))


def test_the_values_at_load_are_exact_and_the_outputs_match_the_fixed_model():
    """A bounded learnable param starts at its value (in float64 within an ulp or two, so exactly
    in the float32 a call computes in): the library models match their non-learnable selves."""
    x = _x(seed=1)
    for name, params in [("lif", {}), ("lif", {"tau": 3.7, "v_reset": -0.1}), ("snn_leaky", {"beta": 0.95}),
                         ("cuba_lif", {}), ("alif", {})]:
        fixed = flexdsl.load(name, **params)
        learn = flexdsl.load(name, learnable=True, **params)
        for k, v in fixed.param_values().items():
            got = torch.as_tensor(getattr(learn, k)).detach()
            assert got.float().item() == torch.tensor(float(v)).float().item(), (name, k)
            assert got.double().item() == pytest.approx(float(v), rel=1e-15, abs=1e-300), (name, k)
        a, b = fixed(x), learn(x)
        for p, q in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(p, q), name


def test_gradients_through_the_parametrization_equal_finite_differences():
    text = LIF_TEXT.replace("sigmoid(alpha=4.0)", "atan(alpha=2.0)")
    for backend in ("torch", "cpu"):
        # (no spike: finite differences see a spike as a step, autograd as its surrogate)
        m = flexdsl.loads(text, learnable=["tau", "v_reset"], backend=backend, tau=3.0, v_reset=-0.2,
                          v_threshold=1e6).double()
        x = _x(T=6, seed=2, scale=1.2, dtype=torch.float64)
        w = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).reshape(x.shape)

        def loss(m=m, x=x, w=w):
            m.reset()
            m(x)
            return (m.state_seqs["v"] * w).sum()

        m.store_state_seqs = True
        loss().backward()
        for raw in (m.raw_tau, m.raw_v_reset):
            g = raw.grad.item()
            r0, h = raw.item(), 1e-6
            with torch.no_grad():
                raw.fill_(r0 + h)
                up = loss().item()
                raw.fill_(r0 - h)
                down = loss().item()
                raw.fill_(r0)
            assert g == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-9), backend


def test_a_learning_rate_far_too_large_keeps_every_value_in_bounds():
    """Each step drives the raw values far out: tau stays > 1 (strictly, also where 1 + softplus
    rounds to 1), beta stays in [0, 1], v_reset < v_threshold, whatever the optimizer does."""
    m = flexdsl.load("lif", learnable=True)
    s = flexdsl.load("snn_leaky", learnable=["beta", "threshold"])
    x = _x(seed=3)
    for model, sign in ((m, 1.0), (m, -1.0), (s, 1.0), (s, -1.0)):
        opt = torch.optim.SGD(model.parameters(), lr=1e6)
        for _ in range(3):
            model.reset()
            opt.zero_grad()
            out = model(x)
            out = out[0] if isinstance(out, tuple) else out
            reg = sum(sign * getattr(model, n) for n in ("tau", "v_reset", "beta", "threshold")
                      if n in model.param_values())
            (out.sum() + 1e3 * reg).backward()
            opt.step()
        raws = [p for n, p in model.named_parameters() if n.startswith("raw_")]
        assert max(abs(r.item()) for r in raws) > 100  # (far out)
    assert m.tau.item() > 1 and m.v_reset.item() < m.v_threshold.item()
    assert 0 <= s.beta.item() <= 1 and s.threshold.item() > 0
    assert torch.isfinite(m(x)).all()


def test_a_trained_checkpoint_loads_in_a_fresh_process(tmp_path):
    """The issue's case: train a bounded learnable param at a learning rate that drives its raw
    value far out of bounds, save, load into a fresh model in a new process: it loads, the value
    is in bounds, the outputs are equal."""
    x = _x(seed=4)
    m = flexdsl.load("lif", learnable=["tau", "v_reset"])
    opt = torch.optim.SGD(m.parameters(), lr=1e5)
    for _ in range(3):
        m.reset()
        opt.zero_grad()
        (m(x).sum() + 1e4 * (m.tau + m.v_reset)).backward()  # drives tau down to 1, v_reset down
        opt.step()
    assert m.raw_tau.item() < -100 and m.tau.item() > 1
    m.reset()
    torch.save({"state": m.state_dict(), "x": x, "out": m(x)}, tmp_path / "ckpt.pt")
    script = textwrap.dedent(f"""
        import torch, flexdsl
        d = torch.load({str(tmp_path / 'ckpt.pt')!r})
        m = flexdsl.load("lif", learnable=["tau", "v_reset"])
        m.load_state_dict(d["state"])
        assert m.tau.item() > 1 and m.v_reset.item() < m.v_threshold, (m.tau, m.v_reset)
        assert torch.equal(m(d["x"]), d["out"])
        print("ok", repr(m.tau.item()))
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ok ") and float(r.stdout.split()[1]) == m.tau.item()
    fresh = flexdsl.load("lif", learnable=["tau", "v_reset"])  # and here
    fresh.load_state_dict(m.state_dict())
    assert torch.equal(fresh(x), torch.load(tmp_path / "ckpt.pt")["out"])


def test_checkpoints_across_learnability():
    """A checkpoint of the plain model (tau a float) loads into the learnable one (its raw value
    set to give tau), and one saved before bounds existed (tau a Parameter value) too."""
    x = _x(seed=5)
    plain = flexdsl.load("lif", tau=3.0, v_threshold=1.2)
    learn = flexdsl.load("lif", learnable=True)
    learn.load_state_dict(plain.state_dict())
    assert learn.tau.item() == 3.0 and torch.equal(learn(x), plain(x))
    old = {"tau": torch.tensor(4.0), "v_threshold": torch.tensor(1.0), "v_reset": torch.tensor(0.0),
           "_extra_state": {"flexdsl": 1, "model": "LIF", "params": {}}}
    learn.load_state_dict(old)
    assert learn.tau.item() == 4.0
    fixed = flexdsl.load("lif")
    with pytest.raises(flexdsl.FlexDSLError, match="`raw_tau`, the Parameter of a bounded learnable `tau`"):
        fixed.load_state_dict(flexdsl.load("lif", learnable="tau").state_dict())
    assert fixed.tau == 2.0


def test_assignments_set_the_raw_value_and_refuse_what_the_bound_cannot_hold():
    m = flexdsl.load("lif", learnable=True)
    m.tau = 5.0
    assert m.tau.item() == 5.0 and isinstance(m.raw_tau, torch.nn.Parameter)
    raw = m.raw_tau.detach().clone()
    with pytest.raises(flexdsl.FlexDSLError, match="violates the constraint of `tau`"):
        m.tau = 0.5
    with pytest.raises(flexdsl.FlexDSLError, match="is bounded, so it trains as the Parameter `raw_tau`"):
        m.tau = torch.nn.Parameter(torch.tensor(3.0))
    assert torch.equal(m.raw_tau, raw)  # nothing was changed
    # moving a bound keeps the other param's value (v_reset < v_threshold)
    m.v_reset = -0.5
    with torch.no_grad():
        m.v_threshold.fill_(2.0)
    assert m.v_reset.item() == pytest.approx(0.5)  # (v_reset follows v_threshold when trained...)
    m.v_threshold = 3.0  # ...but an assignment keeps it
    assert m.v_reset.item() == pytest.approx(0.5, abs=1e-12) and m.v_threshold.item() == 3.0
    with pytest.raises(flexdsl.FlexDSLError, match="`v_threshold = 0.5` violates the constraint of `v_reset`"):
        m.v_threshold = 0.5
    assert m.v_threshold.item() == 3.0 and m.v_reset.item() == pytest.approx(0.5, abs=1e-12)


def test_a_value_on_a_closed_bound_is_refused_for_a_learnable_param():
    text = "neuron G:\n    input x\n    param g = 0.0 where g >= 0\n    state v = 0.0\n    update:\n" \
           "        v = v + g * x\n    output v\n"
    flexdsl.loads(text)  # fine when not learnable
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.loads(text, learnable="g")
    assert "lies on the bound of `g`, which training never reaches" in e.value.reason
    assert (e.value.line, e.value.column) == (3, 11) and "g = softplus(raw_g)" in e.value.reason
    m = flexdsl.loads(text, learnable="g", g=0.5)
    with pytest.raises(flexdsl.FlexDSLError, match="lies on the bound"):
        m.g = 0.0
    assert m.g.item() == 0.5


@pytest.mark.parametrize("where,col,msg", [
    ("where g - 0.5 > 0", 25, "it does not bound `g` alone"),
    ("where g * g < 4", 25, "it does not bound `g` alone"),
    ("where -2 * g < 0", 25, "it does not bound `g` alone"),
    ("where g != 2", 25, "`!=` is not a bound"),
    ("where g == 1", 25, "`==` is not a bound"),
])
def test_a_constraint_that_is_no_bound_is_a_located_error_for_a_learnable_param(where, col, msg):
    text = f"neuron G:\n    input x\n    param g = 1.0 {where}\n    state v = 0.0\n    update:\n" \
           "        v = v + g * x\n    output v\n"
    flexdsl.loads(text)  # fine when not learnable
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.loads(text, learnable=True)
    assert (e.value.line, e.value.column) == (3, col) and msg in e.value.reason
    assert "`g > a`, `g < b` or `a < g < b`" in e.value.hint


def test_a_constraint_of_another_param_bounds_its_learnable_param():
    text = ("neuron G:\n    input x\n    param a = 1.0 learnable\n    param b = 0.5 where b < a * a\n"
            "    state v = 0.0\n    update:\n        v = v + a * b * x\n    output v\n")
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.loads(text)
    assert "the constraint of `b`, `b < a * a`" in e.value.reason and (e.value.line, e.value.column) == (4, 25)
    assert "or make `a` not learnable" in e.value.hint
    m = flexdsl.loads(text.replace("b < a * a", "b < a"))  # a > b: a = b + softplus(raw_a)
    assert m.compiled.checked.bounds["a"].formula() == "a = b + softplus(raw_a)"
    m = flexdsl.loads(text.replace("b < a * a", "b < 2 * a"))  # a positive factor: a > b/2
    assert m.compiled.checked.bounds["a"].formula() == "a = (b/2) + softplus(raw_a)"
    assert m.a.item() == 1.0
    m.b = 1.5  # a keeps its value, inside its new bound
    assert m.a.item() == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(flexdsl.FlexDSLError, match="violates the constraint of `b`"):
        m.b = 2.5


def test_bounds_with_units_and_per_channel_values():
    m = flexdsl.load("lif_ode", learnable=["tau_m", "R"], tau_m=torch.tensor([8.0, 10.0, 12.0]),
                     param_shapes={"tau_m": (3,), "R": (3,)})
    assert m.raw_tau_m.shape == (3,) and torch.equal(m.tau_m, torch.tensor([8.0, 10.0, 12.0], dtype=torch.float64))
    m.R = "20 MOhm"
    assert torch.equal(m.R, torch.full((3,), 20.0, dtype=torch.float64))
    ref = flexdsl.load("lif_ode", tau_m=torch.tensor([8.0, 10.0, 12.0]), R=20.0)
    x = _x(T=40, shape=(2, 3), scale=3.0)
    assert torch.equal(m(x), ref(x))


def test_torch_compile_traces_the_parametrization_without_recompiling():
    torch._dynamo.reset()
    m = flexdsl.load("lif", learnable=["tau", "v_reset"], backend="torch")
    calls = []

    def backend(gm, example):
        calls.append(1)
        return gm.forward

    cm = torch.compile(m, backend=backend, fullgraph=True)
    x = _x(seed=6)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    for _ in range(3):
        m.reset()
        opt.zero_grad()
        out = cm(x)
        (out.sum() + m.tau).backward()
        opt.step()
        m.reset()
        assert torch.equal(cm(x), m(x))
    m.v_threshold = 1.3
    m.reset()
    assert torch.equal(cm(x), flexdsl.load("lif", tau=m.tau.item(), v_reset=m.v_reset.item(), v_threshold=1.3)(x))
    assert len(calls) == 1


# ------------------------------------------------------------------ the inverse, over the whole range
def _one_param(where: str, default: float) -> str:
    return (f"neuron G:\n    input x\n    param a = -3.0\n    param g = {default} where {where}\n"
            "    state v = 0.0\n    update:\n        v = v + g * x\n    output v\n")


def _sigma(r: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(r >= 0, 1 / (1 + np.exp(-np.abs(r))), np.exp(-np.abs(r)) / (1 + np.exp(-np.abs(r))))


def _readback_bound(kind: str, v: np.ndarray, r: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The documented promise of `m.g = v` read back: within one ulp of the largest magnitude
    the parametrization combines (v, its bounds, v's distance to them), or one step of the
    float64 raw value where that step is larger (the value's change between neighbouring raw
    values: slope x ulp(raw), softplus' = sigmoid (1 above its switch at 20), sigmoid' = s(1-s))."""
    if kind == "lower":
        mags, slope = [v, np.full_like(v, lo), v - lo], np.where(r > 20, 1.0, _sigma(r))
    elif kind == "upper":
        mags, slope = [v, np.full_like(v, hi), hi - v], np.where(r > 20, 1.0, _sigma(r))
    else:
        mags, slope = [v, np.full_like(v, lo), np.full_like(v, hi - lo)], (hi - lo) * _sigma(r) * _sigma(-r)
    big = np.max(np.abs(np.stack(mags)), axis=0)
    return np.maximum(np.spacing(big), slope * np.spacing(np.abs(r)))


def _around(c: float) -> list[float]:
    """Values on both sides of `c`: 1 to 20 ulps, and 1e-15 to 1e-1 relative."""
    out = [float(np.nextafter(c, c + s)) for s in (-1, 1)]
    out += [c + s * j * np.spacing(c) for s in (-1, 1) for j in (2, 3, 7, 20)]
    return out + [c * (1 + s * 10.0**k) for s in (-1, 1) for k in range(-15, 0)]


# (kind, model, learnable param, load options, its bounds (lo, hi), values: tiny and huge distances
# to the bounds, both sides of softplus's switch (raw 20: distance 20, and 20.000000002 where its
# two branches meet), both sides of sigmoid's (raw -700), ulps away from each bound)
_SWITCH = 20.000000002061153  # log1p(exp(20)): the largest value of softplus's lower branch
_RANGES = [
    ("lower", "lif", "tau", {}, (1.0, None),
     [1 + 10.0**k for k in range(-15, 308)] + [1 + j * 2.0**-52 for j in range(1, 40)]
     + [1 + x for x in _around(20.0) + _around(_SWITCH) + _around(21.0)] + [1.7e308, 3.7, 7.0]),
    ("lower", _one_param("g > 0", 1.0), "g", {}, (0.0, None),
     [10.0**k for k in range(-307, 308)] + [2.2250738585072014e-308] + _around(20.0) + _around(_SWITCH)
     + _around(2.0**-1020) + [5e-300, 0.01, 0.3, 0.69314718055994531, 1.0]),
    ("lower", _one_param("g > a", 1.0), "g", {}, (-3.0, None),
     [-3 + 10.0**k for k in range(-15, 308)] + [-3 + x for x in _around(20.0) + _around(_SWITCH)]
     + _around(-1e-9) + [0.0, -1.0, 17.0]),
    ("upper", "lif", "v_reset", {"learnable": ["v_reset"]}, (None, 1.0),
     [1 - 10.0**k for k in range(-16, 308)] + [1 - x for x in _around(20.0) + _around(_SWITCH)]
     + [1e-12, 1e-9, -1e-9, 0.0, -1.7e308]),
    ("interval", "snn_leaky", "beta", {}, (0.0, 1.0),
     [10.0**k for k in range(-307, 0)] + [1 - 10.0**-k for k in range(1, 16)]
     + [1 - j * 2.0**-53 for j in range(1, 20)] + _around(math.exp(-700.0)) + _around(0.5) + [0.95]),
    ("interval", _one_param("-2.5 < g < 7", 1.0), "g", {}, (-2.5, 7.0),
     [-2.5 + 10.0**k for k in range(-15, 1)] + [7 - 10.0**k for k in range(-15, 1)]
     + [-2.5 + 9.5 * math.exp(-700.0) * (1 + 10.0**k) for k in range(-12, 0)] + [0.0, 1.0, 6.9]),
]


@pytest.mark.parametrize("kind,model,name,options,limits,values", _RANGES,
                         ids=[f"{r[0]}-{r[2]}-{i}" for i, r in enumerate(_RANGES)])
def test_a_value_set_reads_back_as_promised_over_the_whole_range(kind, model, name, options, limits, values):
    """`m.g = v` reads back `v` to the documented promise, for values close to a bound and far from
    it, on both sides of the switch points of softplus and sigmoid, as one value and as a
    per-channel tensor; and as a float32 call sees it wherever float32 tells `v` from its
    neighbours at that promise. (Before: 3.5e5 ulps off above softplus's switch.)"""
    lo, hi = limits
    v = np.array(sorted({float(x) for x in values if (lo is None or x > lo) and (hi is None or x < hi)}))
    v = v[np.isfinite(v)]
    load = flexdsl.loads if "\n" in model else flexdsl.load
    opts = {"learnable": name, **options}
    m = load(model, param_shapes={name: (len(v),)}, **opts)
    setattr(m, name, torch.tensor(v, dtype=torch.float64))  # every value at once, per channel
    got = getattr(m, name).detach().numpy()
    r = getattr(m, "raw_" + name).detach().numpy()
    bound = _readback_bound(kind, v, r, lo, hi)
    worst = np.argmax(np.abs(got - v) / bound)
    within = bool(np.all(np.abs(got - v) <= bound))
    assert within, f"v={v[worst]!r} read back {got[worst]!r} (raw {r[worst]!r}), bound {bound[worst]:.3g}"
    small = np.abs(v) < float(np.finfo(np.float32).max) / 2
    seen32 = small & (np.spacing(np.abs(np.where(small, v, 0)).astype(np.float32)).astype(np.float64) > 4 * bound)
    assert np.array_equal(got[seen32].astype(np.float32), v[seen32].astype(np.float32))
    assert seen32.sum() >= 20
    one = load(model, **opts)  # and one value at a time, for a few of them
    for x in v[:: max(1, len(v) // 25)]:
        setattr(one, name, float(x))
        assert getattr(one, name).item() == got[np.searchsorted(v, x)]  # (the same computation per channel)


# ------------------------------------------------------------------ strictly inside, in the call's precision
DIVIDES = """neuron Divides:
    input x
    param tau = 2.0 where tau > 1
    param c = 0.5 where 0 < c < 1
    param k = 3.0 where k < 4
    param a = 0.5
    param g = 2.0 where g > 2 * a
""" + "".join(f"    state {n}{i} = 0.0\n" for n in "dq" for i in range(5)) + """    update:
""" + "".join(f"        d{i} = x * ({e})\n        q{i} = x / ({e})\n" for i, e in
              enumerate(["tau - 1", "c", "1 - c", "4 - k", "g - 2 * a"])) + \
    "    output " + ", ".join(f"d{i}, q{i}" for i in range(5)) + "\n"


def test_no_raw_value_puts_a_value_on_its_bound_in_the_precision_of_the_call():
    """Every finite raw value, however far out (an optimizer's huge step included), gives values
    strictly inside their bounds as the call's precision holds them, far enough that dividing by
    the distance to the bound is finite there: a model that divides by it runs on every backend
    and dtype, each quotient finite and positive. A raw value that is not finite gives NaN, never a
    finite value that hides it."""
    x = torch.ones(1, 3)
    raws = [1e308, -1e308, 1e30, -1e30, 1e6, -1e6, 800.0, -800.0, 710.0, -710.0, 40.0, -40.0, 20.000001, -20.0, 0.0]
    runs = [("torch", d) for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)]
    runs += [("triton", d) for d in (torch.float32, torch.float16, torch.bfloat16)]
    runs += [("cpu", d) for d in (torch.float32, torch.float64)]
    for backend, dtype in runs:
        for big in raws:
            m = flexdsl.loads(DIVIDES, learnable=["tau", "c", "k", "g"], backend=backend)
            with torch.no_grad():
                for n in ("raw_tau", "raw_c", "raw_k", "raw_g"):
                    getattr(m, n).fill_(big)
            outs = m(x.to(dtype))  # distances to the bounds d_i, as the call computes them, and 1/d_i
            assert all(o.dtype == dtype and bool(torch.isfinite(o).all()) for o in outs), (backend, dtype, big)
            assert all(bool((d > 0).all()) for d in outs[::2]), (backend, dtype, big, outs[::2])
            assert m.tau.item() > 1 and 0 < m.c.item() < 1 and m.k.item() < 4 and m.g.item() > 2 * m.a
    # the issue's case: an optimizer step far too large drives each value onto its bound in float32
    m = flexdsl.loads(DIVIDES, learnable=["tau", "c", "k", "g"], backend="torch")
    opt = torch.optim.SGD(m.parameters(), lr=1e30)
    xs = torch.ones(2, 3)
    for sign in (1.0, -1.0):
        opt.zero_grad()
        (sign * (m.tau + m.c - m.k + m.g)).backward()
        opt.step()
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            m.reset()
            outs = m(xs.to(dtype))
            assert all(bool(torch.isfinite(o).all()) for o in outs) and all(bool((d > 0).all()) for d in outs[::2])
    for bad in (float("inf"), float("-inf"), float("nan")):
        with torch.no_grad():
            m.raw_tau.fill_(bad)
        assert math.isnan(m.tau.item())


# ------------------------------------------------------------------ PyTorch's own tools
class _Half(torch.nn.Module):
    def forward(self, w):
        return w / 2

    def right_inverse(self, w):
        return w * 2


def test_register_parametrization_on_flexdsl_params():
    from torch.nn.utils import parametrize

    x = _x(seed=7)
    w0 = torch.tensor([0.1, -0.2, 0.3, 0.4])
    m = flexdsl.load("plif", w=w0, param_shapes={"w": (4,)})
    parametrize.register_parametrization(m, "w", _Half())  # the issue's crash (KeyError: 'w')
    assert {n for n, _ in m.named_parameters()} == {"parametrizations.w.original"}
    assert torch.equal(m.w, w0) and torch.equal(m.parametrizations.w.original.detach(), 2 * w0)  # (right inverse)
    with torch.no_grad():
        m.parametrizations.w.original.copy_(w0)
    out = m(x)
    assert torch.equal(out, flexdsl.load("plif", w=w0 / 2)(x))
    out.sum().backward()
    assert m.parametrizations.w.original.grad is not None
    m.w = torch.full((4,), 0.3)  # through the right inverse
    assert torch.equal(m.parametrizations.w.original.detach(), torch.full((4,), 0.6))
    b = flexdsl.load("lif", learnable="tau")
    parametrize.register_parametrization(b, "raw_tau", _Half())  # on a bounded param's Parameter
    assert b.tau.item() == 2.0
    b(x).sum().backward()
    assert b.parametrizations.raw_tau.original.grad is not None


def test_weight_norm_style_wrappers_on_flexdsl_params():
    import warnings

    x = _x(seed=8)
    w0 = torch.tensor([0.1, -0.2, 0.3, 0.4])
    ref = flexdsl.load("plif", w=w0, param_shapes={"w": (4,)})(x)
    m = flexdsl.load("plif", w=w0, param_shapes={"w": (4,)})
    torch.nn.utils.parametrizations.weight_norm(m, "w", dim=0)
    out = m(x)
    # weight_norm recomputes w = g * v / |v| (3 operations) before the same 10 steps
    assert_close(out, ref, ops=scan_ops("plif", x.shape[0], 3, backward=False))
    out.sum().backward()
    assert m.parametrizations.w.original0.grad is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        old = flexdsl.load("plif", w=w0, param_shapes={"w": (4,)})
        torch.nn.utils.weight_norm(old, "w", dim=0)  # deletes the Parameter, sets `w` before each call
        assert {n for n, _ in old.named_parameters()} == {"w_g", "w_v"}
        out = old(x)
        assert_close(out, ref, ops=scan_ops("plif", x.shape[0], 3, backward=False))
        out.sum().backward()
        assert old.w_g.grad is not None and old.w_v.grad is not None
        old.reset()
        copy.deepcopy(old)
        buf = io.BytesIO()
        torch.save(old, buf)
        torch.nn.utils.remove_weight_norm(old, "w")
        assert {n for n, _ in old.named_parameters()} == {"w"} and isinstance(old.w, torch.nn.Parameter)
        sn = flexdsl.load("plif", w=w0.reshape(4, 1), param_shapes={"w": (4, 1)})
        torch.nn.utils.spectral_norm(sn, "w")
        assert torch.isfinite(sn(x.reshape(10, 3, 4, 1))).all()


def test_functional_call_with_a_dict_of_params():
    from torch.func import functional_call

    m = flexdsl.load("lif", learnable=True, backend="torch").double()
    x = _x(seed=9, dtype=torch.float64)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in m.named_parameters()}
    out = functional_call(m, params, (x,))
    m.reset()
    out.sum().backward()
    ref = m(x)
    m.reset()
    ref.sum().backward()
    assert torch.equal(out, ref)
    for k, p in m.named_parameters():
        assert torch.equal(params[k].grad, p.grad)  # (the same computation on the same values)
    # a value by the param's own name is used as given (PyTorch's rule for parametrized names)
    tau = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    out = functional_call(m, {"tau": tau}, (x,))
    m.reset()
    assert torch.equal(out, flexdsl.load("lif", tau=3.0).double()(x))
    out.sum().backward()
    assert tau.grad is not None and m.tau.item() == 2.0  # and the module is as it was


def test_optimizer_param_groups_by_name():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), flexdsl.load("lif", learnable=True))
    groups = [{"params": [p for n, p in m.named_parameters() if ".raw_" in n], "lr": 0.1},
              {"params": [p for n, p in m.named_parameters() if ".raw_" not in n], "lr": 0.01}]
    assert [len(g["params"]) for g in groups] == [2, 3]
    opt = torch.optim.Adam(groups)
    m(_x(seed=10)).sum().backward()
    opt.step()
    assert m[1].tau.item() != 2.0


# ------------------------------------------------------------------ recording
def _monitor():
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:  # SpikingJelly's monitor module imports tensorboard, which only its GPU monitor uses
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = None
        sys.modules["torch.utils.tensorboard"] = stub
    from spikingjelly.activation_based import monitor

    return monitor


def test_state_sequences_have_spikingjellys_names():
    from spikingjelly.activation_based import neuron

    monitor = _monitor()
    x = _x(seed=11, shape=(3, 4), scale=3.0)
    lin = torch.nn.Linear(4, 5)
    fx = torch.nn.Sequential(lin, flexdsl.load("lif", store_v_seq=True))
    sj = torch.nn.Sequential(copy.deepcopy(lin), neuron.LIFNode(step_mode="m", store_v_seq=True))
    mon_fx = monitor.AttributeMonitor("v_seq", pre_forward=False, net=fx,
                                      instance=flexdsl.runtime.module.NeuronModule)
    mon_sj = monitor.AttributeMonitor("v_seq", pre_forward=False, net=sj, instance=neuron.LIFNode)
    fx(x)
    sj(x)
    assert mon_fx.monitored_layers == ["1"] and len(mon_fx.records) == 1
    assert torch.equal(mon_fx.records[0], mon_sj.records[0])
    assert torch.equal(fx[1].v_seq, fx[1].state_seqs["v"])
    # a forward hook in multi-step mode sees the last state as `v` and the whole sequence as `v_seq`
    seen = {}
    fx[1].register_forward_hook(lambda mod, args, out: seen.update(v=mod.v, v_seq=mod.v_seq))
    fx[1].reset()
    fx(x)
    assert torch.equal(seen["v"], seen["v_seq"][-1]) and seen["v_seq"].shape == (10, 3, 5)
    plain = flexdsl.load("lif")
    plain(x)
    with pytest.raises(AttributeError, match="store_state_seqs=True"):
        _ = plain.v_seq
    assert not hasattr(plain, "v_seq")


@pytest.mark.parametrize("r", [19.999999, 20.0, 20.000001, 25.0, 36.0, 39.9, 45.0])
def test_softplus_bounds_are_exact_in_float64_across_the_switch(r):
    """`a + softplus(raw)` above raw = 20 was raw itself (torch's default switch): 2e-9 off the exact
    softplus (1e5 float64 ulps at 20), a downward jump at the switch and a slope of 1 instead of
    sigmoid(raw). alif's `tau_m > 0`: tau_m = softplus(raw_tau_m), against the exact softplus
    `log1p(exp(raw))` and its derivative, in float64."""
    m = flexdsl.load("alif", learnable=["tau_m"]).double()
    with torch.no_grad():
        m.raw_tau_m.fill_(r)
    exact = math.log1p(math.exp(r))
    tau = m.tau_m
    assert abs(float(tau) - exact) <= 4 * 2.0 ** -53 * exact
    (g,) = torch.autograd.grad(tau.sum(), m.raw_tau_m)
    assert abs(float(g) - 1 / (1 + math.exp(-r))) <= 4 * 2.0 ** -53
