"""Numerics that never silently lie (exact integration, removable singularities, finiteness).

* Coupled linear states (`exact`): 2- and 3-state systems whose time constants are equal,
  1 ulp apart, or 1e-12 ... 1e-3 apart, with plain and learnable params, float64 and float32,
  on both backends, against a float64 simulation with `scipy.linalg.expm` (forward) and
  `torch.linalg.matrix_exp` under autograd (gradients; itself checked against central
  differences of the scipy simulation at the defective point).
* `dv/dt = -g*v + I` with the input g at and near 0 (`exact`, `exponential_euler`): values and
  gradients against the closed form evaluated in 100-digit mpmath.
* Compile time of linear systems of up to 4 states with symbolic params, in a subprocess with
  a timeout (a hang fails instead of blocking CI).
* `check_finite=True` on a diverging EIF: the state, the step (against SpikingJelly's
  EIFNode, which goes non-finite at the same step) and the element.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mpmath
import numpy as np
import pytest
import scipy.linalg
import torch

import flexdsl

from tolerances import scan_ops, tol

SEPARATIONS = ["0", "1ulp", 1e-12, 1e-9, 1e-6, 1e-3]
CASES = [("torch", torch.float64), ("torch", torch.float32), ("triton", torch.float32)]


def _tols(text: str, dtype) -> tuple[float, float]:
    """(forward, gradients) relative bounds against the float64 reference (scipy's expm, autograd):
    T steps of the model's counted operations in `dtype`, the propagator computed once on the host
    in float64 and rounded to `dtype` (one more rounding)."""
    ops = scan_ops(text, T, backward=False) + 1
    return tol(dtype, ops, ref_dtype=torch.float64), tol(dtype, scan_ops(text, T, T * N) + 1, ref_dtype=torch.float64)


DT = 1.0
T, N = 12, 3

TWO = """\
neuron Cuba:
    input x
    param dt = 1.0
    param tau_s = 5.0 where tau_s > 0{learn}
    param tau_m = 5.0 where tau_m > 0{learn}
    state i = 0.0
    state v = 0.2
    equations:
        di/dt = -i / tau_s + x
        dv/dt = (-v + i) / tau_m
    output i, v
"""

# a chain with equal time constants at separation 0: a Jordan block of size 3 (the hardest case
# for closed forms), plus a feed-forward term from x to z
THREE = """\
neuron Chain:
    input x
    param dt = 1.0
    param tau_1 = 5.0 where tau_1 > 0{learn}
    param tau_2 = 5.0 where tau_2 > 0{learn}
    param tau_3 = 5.0 where tau_3 > 0{learn}
    param k = 0.3{learn}
    state a = 0.1
    state b = 0.0
    state c = -0.2
    equations method exact:
        da/dt = (x - a) / tau_1
        db/dt = (a - b) / tau_2
        dc/dt = (b - c) / tau_3 + k * a
    output a, b, c
"""


def system(name: str, p: dict[str, float]):
    """(A, B, initial states) of dx/dt = A x + B*input, in float64."""
    if name == "two":
        A = np.array([[-1 / p["tau_s"], 0.0], [1 / p["tau_m"], -1 / p["tau_m"]]])
        return A, np.array([1.0, 0.0]), np.array([0.0, 0.2])
    A = np.array([[-1 / p["tau_1"], 0.0, 0.0], [1 / p["tau_2"], -1 / p["tau_2"], 0.0],
                  [p["k"], 1 / p["tau_3"], -1 / p["tau_3"]]])
    return A, np.array([1 / p["tau_1"], 0.0, 0.0]), np.array([0.1, 0.0, -0.2])


def propagator(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E = expm(A dt) and F B = int_0^dt expm(A s) B ds, from scipy's expm of the augmented matrix."""
    n = A.shape[0]
    M = np.zeros((n + 1, n + 1))
    M[:n, :n] = A * DT
    M[:n, n] = B * DT
    X = scipy.linalg.expm(M)
    return X[:n, :n], X[:n, n]


def simulate_scipy(name: str, p: dict[str, float], x: np.ndarray) -> np.ndarray:
    A, B, s0 = system(name, p)
    E, FB = propagator(A, B)
    s = np.repeat(s0[:, None], x.shape[1], axis=1)
    out = []
    for xt in x:
        s = E @ s + FB[:, None] * xt[None, :]
        out.append(s.copy())
    return np.stack(out)  # [T, n, N]


def simulate_autograd(name: str, p: dict[str, float], x: np.ndarray, w: np.ndarray, wrt: list[str]):
    """The gradients of sum(w * states) with respect to `wrt`, by torch autograd through
    torch.linalg.matrix_exp (float64)."""
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in wrt) for k, v in p.items()}
    z = torch.zeros((), dtype=torch.float64)
    if name == "two":
        ts, tm = leaves["tau_s"], leaves["tau_m"]
        A = torch.stack([torch.stack([-1 / ts, z]), torch.stack([1 / tm, -1 / tm])])
        B = torch.stack([z + 1, z])
        s0 = torch.tensor([0.0, 0.2], dtype=torch.float64)
    else:
        t1, t2, t3, k = leaves["tau_1"], leaves["tau_2"], leaves["tau_3"], leaves["k"]
        A = torch.stack([torch.stack([-1 / t1, z, z]), torch.stack([1 / t2, -1 / t2, z]),
                         torch.stack([k, 1 / t3, -1 / t3])])
        B = torch.stack([1 / t1, z, z])
        s0 = torch.tensor([0.1, 0.0, -0.2], dtype=torch.float64)
    n = A.shape[0]
    M = torch.cat([torch.cat([A * DT, (B * DT)[:, None]], 1), torch.zeros(1, n + 1, dtype=torch.float64)], 0)
    X = torch.linalg.matrix_exp(M)
    E, FB = X[:n, :n], X[:n, n]
    s = s0[:, None].expand(n, x.shape[1])
    loss = torch.zeros((), dtype=torch.float64)
    xt_all = torch.as_tensor(x, dtype=torch.float64)
    wt = torch.as_tensor(w, dtype=torch.float64)
    for t in range(x.shape[0]):
        s = E @ s + FB[:, None] * xt_all[t][None, :]
        loss = loss + (wt[t] * s).sum()
    grads = torch.autograd.grad(loss, [leaves[k] for k in wrt])
    return {k: g.item() for k, g in zip(wrt, grads)}


def separated(name: str, sep, dtype: torch.dtype) -> dict[str, float]:
    """Params with the time constants `sep` apart ("1ulp": adjacent values of `dtype`), as the
    values `dtype` holds."""
    base = torch.tensor(5.0, dtype=dtype)
    if sep == "1ulp":
        up = torch.tensor(10.0, dtype=dtype)
        t2 = torch.nextafter(base, up)
        t3 = torch.nextafter(t2, up)
    else:
        t2 = (base.double() + float(sep)).to(dtype)
        t3 = (base.double() + 2 * float(sep)).to(dtype)
    if name == "two":
        return {"dt": DT, "tau_s": base.item(), "tau_m": t2.item()}
    k = torch.tensor(0.3, dtype=dtype).item()
    return {"dt": DT, "tau_1": base.item(), "tau_2": t2.item(), "tau_3": t3.item(), "k": k}


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def test_reference_gradients_agree_with_central_differences_at_the_defective_point():
    """The autograd reference (matrix_exp) against central differences of the scipy simulation,
    at equal time constants (a Jordan block), so the reference itself is not the thing tested."""
    gen = np.random.default_rng(0)
    x = gen.uniform(0, 1, size=(T, N))
    w = gen.normal(size=(T, 3, N))
    p = separated("three", "0", torch.float64)
    got = simulate_autograd("three", p, x, w, ["tau_1", "tau_2", "tau_3", "k"])
    for k in got:
        h = 1e-5
        hi, lo = dict(p), dict(p)
        hi[k] += h
        lo[k] -= h
        fd = ((w * simulate_scipy("three", hi, x)).sum() - (w * simulate_scipy("three", lo, x)).sum()) / (2 * h)
        assert abs(got[k] - fd) <= 1e-7 * max(abs(fd), 1.0), (k, got[k], fd)


def _value_grad(m, k):
    """The gradient of a learnable param's value: bounded (`where k > 0`), it trains as
    k = softplus(raw_k) (the bounds' parametrization), so d/dk = d/draw_k / sigmoid(raw_k); an
    unbounded one is its own Parameter."""
    raw = getattr(m, "raw_" + k, None)
    if raw is None:
        return getattr(m, k).grad
    return raw.grad / torch.sigmoid(raw.detach())


@pytest.mark.parametrize("learnable", [False, True], ids=["plain", "learnable"])
@pytest.mark.parametrize("backend,dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("name", ["two", "three"])
def test_coupled_exact_against_expm(name, backend, dtype, learnable):
    text = (TWO if name == "two" else THREE).format(learn=" learnable" if learnable else "")
    gen = np.random.default_rng(1)
    x32 = torch.as_tensor(gen.uniform(0, 1, size=(T, N)), dtype=dtype)
    x = x32.double().numpy()  # the reference sees the values the model sees
    n_states = 2 if name == "two" else 3
    w = gen.normal(size=(T, n_states, N))
    fwd_tol, grad_tol = _tols(text, dtype)
    for sep in SEPARATIONS:
        p = separated(name, sep, dtype)
        overrides = {k: v for k, v in p.items() if k != "dt"}
        m = flexdsl.loads(text, backend=backend, **overrides).to(dtype)
        assert m.compiled.method == "exact"
        if learnable:  # Parameters are made in float32: set the exact values after .to(dtype)
            for k, v in overrides.items():
                setattr(m, k, v)  # (bounded `tau > 0`: sets raw_tau, tau = softplus(raw_tau))
                assert getattr(m, k).item() == pytest.approx(v, rel=2e-16) if dtype == torch.float64 else \
                    getattr(m, k).item() == torch.tensor(v, dtype=dtype).item()
        outs = m(x32)
        seqs = torch.stack(list(outs), 1)  # [T, n, N]
        ref = simulate_scipy(name, p, x)
        err = _rel(seqs.detach(), ref)
        assert err <= fwd_tol, f"{name} sep={sep} {backend} {dtype}: forward error {err:.2e}"
        if learnable:
            (seqs * torch.as_tensor(w, dtype=dtype)).sum().backward()
            wrt = sorted(overrides)
            want = simulate_autograd(name, p, x, w, wrt)
            for k in wrt:
                g = _value_grad(m, k)
                assert g is not None and torch.isfinite(g).all(), (k, sep, g)
                e = abs(g.item() - want[k]) / max(abs(want[k]), 1e-3)
                assert e <= grad_tol, f"{name} sep={sep} {backend} {dtype}: d/d{k} {g.item()!r} vs {want[k]!r}"


@pytest.mark.parametrize("learnable", [False, True], ids=["buffers", "learnable"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_per_channel_time_constants(backend, learnable):
    """Per-channel params (float64 buffers, or float32 Parameters) give one propagator per
    channel: a batch of matrix exponentials, each channel's entries read by its lanes."""
    C = 4
    text = TWO.format(learn=" learnable" if learnable else "")
    m = flexdsl.loads(text, backend=backend, param_shapes={"tau_s": (C,), "tau_m": (C,)})
    tau_s = torch.tensor([5.0, 5.0, 2.0, 7.0])
    tau_m = torch.tensor([5.0, torch.nextafter(torch.tensor(5.0), torch.tensor(9.0)).item(), 2.001, 3.0])
    if learnable:
        m.tau_s, m.tau_m = tau_s, tau_m  # (their raw Parameters: tau = softplus(raw_tau))
    else:
        m.tau_s, m.tau_m = tau_s, tau_m
    gen = np.random.default_rng(2)
    # the step's shape is the params' shape: each lane reads its own entry of the propagators
    x = torch.as_tensor(gen.uniform(0, 1, size=(T, C)), dtype=torch.float32)
    w = gen.normal(size=(T, 2, C))  # [T, (i, v), channel]
    i, v = m(x)
    if learnable:
        (torch.stack([i, v], 1) * torch.as_tensor(w, dtype=torch.float32)).sum().backward()
    for c in range(C):
        p = {"dt": DT, "tau_s": float(tau_s[c]), "tau_m": float(tau_m[c])}
        xc = x[:, c:c + 1].double().numpy()
        ref = simulate_scipy("two", p, xc)
        fwd_tol, grad_tol = _tols(text, torch.float32)
        assert _rel(torch.stack([i[:, c:c + 1], v[:, c:c + 1]], 1).detach(), ref) <= fwd_tol, c
        if learnable:
            want = simulate_autograd("two", p, xc, w[:, :, c:c + 1], ["tau_s", "tau_m"])
            for k in want:
                got = _value_grad(m, k)[c].item()
                assert abs(got - want[k]) <= grad_tol * max(abs(want[k]), 1e-3), (c, k, got, want[k])


def test_exact_coupled_with_a_varying_coefficient_is_a_located_error():
    text = textwrap.dedent("""\
        neuron V:
            input I
            param dt = 0.1
            state v = 0.0
            state w = 0.0
            equations method exact:
                dv/dt = -v + I * w
                dw/dt = -w + v
            output v
        """)
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.compile(text)
    msg = str(e.value)
    assert msg.startswith("<string>:7:10: error: method `exact` does not apply"), msg  # at `v` of dv/dt
    assert "`I`" in msg and "exponential_euler" in msg
    # without a method, such a system is integrated with euler (the contract's fallback)
    assert flexdsl.compile(text.replace(" method exact", "")).method == "euler"


# --------------------------------------------------------------------------- input coefficients near 0
G_VALUES = [0.0, 1e-30, 1e-8, -1e-8, 1e-5, -1e-5, 1e-3, 0.2, 1 / 1.5, -1 / 1.5, 0.6666, 0.6667, 2.0, -3.0, 40.0]
H = 1.5  # dt: g*dt crosses the series/closed-form switch of exprel's derivative at |g| = 1/1.5


def _exprel(z):
    return mpmath.expm1(z) / z if z != 0 else mpmath.mpf(1)


def _exprel_d(z):
    if z == 0:
        return mpmath.mpf(1) / 2
    # the closed form cancels ~2*log10(1/|z|) digits: work with that many more
    with mpmath.workdps(mpmath.mp.dps + int(2 * max(0, -mpmath.log10(abs(z)))) + 10):
        return ((z - 1) * mpmath.exp(z) + 1) / z**2


def reference_g(g: np.ndarray, I: np.ndarray, v0: float, w: np.ndarray):
    """v_{t+1} = v_t exp(-g_t h) + I_t h exprel(-g_t h) in 100-digit arithmetic; the gradients of
    sum(w*v) with respect to g and I by hand (reverse mode)."""
    with mpmath.workdps(100):
        h = mpmath.mpf(H)
        Tn, Nn = g.shape
        V = np.zeros((Tn, Nn))
        dG = np.zeros((Tn, Nn))
        dI = np.zeros((Tn, Nn))
        for n in range(Nn):
            vs = [mpmath.mpf(v0)]
            for t in range(Tn):
                z = -mpmath.mpf(g[t, n]) * h
                vs.append(vs[-1] * mpmath.exp(z) + mpmath.mpf(I[t, n]) * h * _exprel(z))
                V[t, n] = float(vs[-1])
            gv = mpmath.mpf(0)
            for t in reversed(range(Tn)):
                gv += mpmath.mpf(w[t, n])
                z = -mpmath.mpf(g[t, n]) * h
                dG[t, n] = float(gv * (-h * vs[t] * mpmath.exp(z) - mpmath.mpf(I[t, n]) * h * h * _exprel_d(z)))
                dI[t, n] = float(gv * h * _exprel(z))
                gv = gv * mpmath.exp(z)
    return V, dG, dI


@pytest.mark.parametrize("method", ["exact", "exponential_euler"])
@pytest.mark.parametrize("backend,dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_input_coefficient_at_and_near_zero(method, backend, dtype):
    text = textwrap.dedent(f"""\
        neuron Leak:
            input g, I
            param dt = {H}
            state v = 0.5
            equations method {method}:
                dv/dt = -g * v + I
            output v
        """)
    m = flexdsl.loads(text, backend=backend)
    gen = np.random.default_rng(3)
    steps = 3
    g = torch.tensor([G_VALUES] * steps, dtype=dtype)
    I = torch.as_tensor(gen.uniform(0.5, 1.5, size=g.shape), dtype=dtype)
    w = gen.normal(size=g.shape)
    g.requires_grad_()
    I.requires_grad_()
    v = m(g, I)
    (v * torch.as_tensor(w, dtype=dtype)).sum().backward()
    V, dG, dI = reference_g(g.detach().double().numpy(), I.detach().double().numpy(), 0.5, w)
    eps = torch.finfo(dtype).eps
    # each value within a few roundings of the analytic limit (g = 0: v + I*dt exactly)
    assert np.allclose(v.detach().double().numpy(), V, rtol=8 * eps, atol=0), (v, V)
    assert np.allclose(I.grad.double().numpy(), dI, rtol=8 * eps, atol=8 * eps * np.abs(dI).max())
    assert np.allclose(g.grad.double().numpy(), dG, rtol=16 * eps, atol=16 * eps * np.abs(dG).max())
    # the first step at g = 0 is the analytic limit: v0 + I*dt
    assert v[0, 0].item() == pytest.approx(0.5 + I[0, 0].item() * H, rel=2 * eps)


def test_exprel_torch_ops_against_mpmath():
    """ops.exprel and its autograd derivative, float64 and float32, on a grid through 0 and the
    switch point |z| = 1 of the derivative's series, within a few ulps of 100-digit values."""
    from flexdsl.backends.torch import ops

    zs = [0.0, 1e-300, -1e-30, 1e-12, -1e-7, 3e-4, -0.2, 0.5, -0.999999, -1.0, 1.0, 1.000001, -1.5, 3.0, -30.0,
          80.0, -700.0]
    for dtype in (torch.float64, torch.float32):
        z = torch.tensor(zs, dtype=dtype, requires_grad=True)
        y = ops.exprel(z)
        y.sum().backward()
        eps = torch.finfo(dtype).eps
        with mpmath.workdps(100):
            for k, zk in enumerate(z.detach().tolist()):
                want, dwant = _exprel(mpmath.mpf(zk)), _exprel_d(mpmath.mpf(zk))
                assert abs(y[k].item() - float(want)) <= 2 * eps * abs(float(want)), (dtype, zk, y[k].item())
                assert abs(z.grad[k].item() - float(dwant)) <= 4 * eps * abs(float(dwant)), (dtype, zk, z.grad[k])


# --------------------------------------------------------------------------- compile time
BOUND_MODELS = {
    "adex_linear": """\
neuron AdExLinear:
    input I
    param dt = 0.1
    param tau_m = 10.0
    param tau_w = 100.0
    param E_L = -70.0
    param a = 2.0 learnable
    state v = E_L
    state w = 0.0
    equations:
        dv/dt = (-(v - E_L) - w + I) / tau_m
        dw/dt = (a * (v - E_L) - w) / tau_w
    output v
""",
    "damped_oscillator": """\
neuron Damped:
    input I
    param dt = 0.1
    param k = 4.0
    state x = 0.0
    state y = 0.0
    equations:
        dx/dt = y
        dy/dt = -k * x - 0.3 * y + I
    output x
""",
    "coupled_3": """\
neuron Coupled3:
    input I
    param dt = 0.1
    param a = 1.0 learnable
    param b = 2.0
    param c = 3.0
    param d = 0.5
    state x = 0.0
    state y = 0.0
    state z = 0.0
    equations:
        dx/dt = -a * x + b * y - c * z + I
        dy/dt = d * x - b * y + a * z
        dz/dt = c * x + d * y - a * z
    output x
""",
    "coupled_4": """\
neuron Coupled4:
    input I, J
    param dt = 0.1
    param a = 1.0
    param b = 2.0 learnable
    param c = 3.0
    param d = 0.5
    param e = 0.25
    state x = 0.0
    state y = 0.0
    state z = 0.0
    state u = 0.0
    equations method exact:
        dx/dt = -a * x + b * y - c * z + d * u + I
        dy/dt = d * x - b * y + a * z - c * u + e * J
        dz/dt = c * x + d * y - a * z + b * u + I / e
        du/dt = a * x - d * y + c * z - b * u - e
    output x
""",
    # coefficients that expand into thousands of terms: found linear by differentiation
    "big_coefficients": """\
neuron Big:
    input I
    param dt = 0.1
    param a = 0.1
    param b = 0.2
    param c = 0.3
    param d = 0.4
    param e = 0.5 learnable
    state v = 0.0
    state w = 0.0
    equations:
        dv/dt = (a + b + c + d + e)**12 * (I - v) + w
        dw/dt = -w * (a + b + c)**8 + (a + b)**6 * v
    output v
""",
}

_BOUND_SCRIPT = """
import json, sys
import flexdsl
c = flexdsl.compile("lif_ode")  # imports (sympy, torch, triton, jinja2) are not compile time
c.backward, c.schedule, c.torch_source, c.triton_source
out = {}
for name, text in json.loads(sys.stdin.read()).items():
    c = flexdsl.compile(text)
    c.backward, c.schedule, c.torch_source, c.triton_source
    out[name] = c.method
print(json.dumps(out))
"""


def test_linear_systems_compile_fast(tmp_path):
    """Linear systems of up to 4 states with symbolic params compile (lowering, backward,
    schedule, both backends' sources) with the exact method; in a subprocess with a timeout far
    beyond any load, so that a hang (no symbolic eigenvalues: none expected) fails instead of
    blocking CI. How fast is measured by bench/, not asserted here."""
    env = dict(os.environ, FLEXDSL_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
        [str(Path(flexdsl.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    try:
        r = subprocess.run([sys.executable, "-c", _BOUND_SCRIPT], input=json.dumps(BOUND_MODELS), env=env,
                           capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("compiling the linear systems did not finish within 600 s (a hang)")
    assert r.returncode == 0, r.stderr
    times = json.loads(r.stdout.strip().splitlines()[-1])
    for name, method in times.items():
        assert method == "exact", (name, method)


def test_four_coupled_states_step_like_expm():
    """The 4-state system of the compile-time test computes the scipy propagator's step."""
    m = flexdsl.loads(BOUND_MODELS["coupled_4"], backend="torch", store_state_seqs=True).double()
    gen = np.random.default_rng(4)
    I = torch.as_tensor(gen.normal(size=(6, 2)))
    J = torch.as_tensor(gen.normal(size=(6, 2)))
    m(I, J)
    a, b, c, d, e = 1.0, 2.0, 3.0, 0.5, 0.25
    A = np.array([[-a, b, -c, d], [d, -b, a, -c], [c, d, -a, b], [a, -d, c, -b]])
    X = scipy.linalg.expm(np.block([[A * 0.1, np.eye(4) * 0.1], [np.zeros((4, 8))]]))
    E, F = X[:4, :4], X[:4, 4:]
    s = np.zeros((4, 2))
    for t in range(6):
        forcing = np.stack([I[t].numpy(), e * J[t].numpy(), I[t].numpy() / e, np.full(2, -e)])
        s = E @ s + F @ forcing
        for k, name in enumerate("xyzu"):
            np.testing.assert_allclose(m.state_seqs[name][t].detach().numpy(), s[k], rtol=1e-12, atol=1e-13)


# --------------------------------------------------------------------------- check_finite
def _state_pos(stem: str, state: str) -> tuple[str, int, int]:
    path = Path(flexdsl.compile(stem).filename)
    for k, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith(f"state {state} "):
            return str(path), k, line.index(state) + 1
    raise AssertionError(state)


def _sj_eif_first_nonfinite(x: torch.Tensor, v_threshold: float) -> tuple[int, tuple[int, ...]]:
    """The first step and element at which SpikingJelly's EIFNode (same params) is not finite."""
    from spikingjelly.activation_based import neuron, surrogate

    node = neuron.EIFNode(tau=2.0, delta_T=1.0, theta_rh=0.8, v_threshold=v_threshold, v_rest=0.0, v_reset=-0.1,
                          surrogate_function=surrogate.Sigmoid(alpha=4.0), step_mode="s")
    for t in range(x.shape[0]):
        node(x[t])
        v = node.v if isinstance(node.v, torch.Tensor) else torch.full_like(x[t], node.v)
        bad = ~torch.isfinite(v)
        if bad.any():
            flat = int(bad.reshape(-1).nonzero()[0, 0])
            return t, tuple(int(i) for i in np.unravel_index(flat, tuple(v.shape)))
    raise AssertionError("SpikingJelly's EIF stayed finite")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_check_finite_names_state_step_and_element_of_a_diverging_eif(backend):
    # a threshold far above the rheobase: v climbs until exp((v - theta_rh)/delta_T) overflows
    # float32, v becomes inf and the hard reset turns it into NaN
    x = torch.full((40, 2, 3), 0.2)
    x[:, 1, 1] = 0.45
    x[:, 0, 2] = 0.3
    want_step, want_index = _sj_eif_first_nonfinite(x, 200.0)
    m = flexdsl.load("eif", backend=backend, v_threshold=200.0, check_finite=True)
    assert m.check_finite is True
    with pytest.raises(flexdsl.FlexDSLError) as e:
        m(x)
    err = e.value
    path, line, col = _state_pos("eif", "v")
    text = str(err)
    assert text.startswith(f"{path}:{line}:{col}: error: state `v` became "), text
    assert f"at step {want_step} " in text and f"element {want_index}" in text, text
    assert (err.what, err.step, err.index) == ("v", want_step, want_index)
    assert not np.isfinite(err.value)
    assert "clip" in text and "exp(min(" in text  # how to avoid it
    # the state before that step is in the hint, and the whole call is kept on the error
    prev = err.state_seqs["v"][want_step - 1][want_index].item()
    assert f"v = {prev:.6g}" in text
    assert torch.isfinite(err.state_seqs["v"][: want_step]).all()
    # the failed call did not change the module's state
    assert float(m.v) == pytest.approx(-0.1)


def test_check_finite_costs_nothing_when_off_and_changes_no_result():
    x = torch.full((40, 2, 3), 0.5)
    off = flexdsl.load("eif", v_threshold=200.0)
    assert off.check_finite is False
    s = off(x)  # silent NaN, as without the option
    assert torch.isnan(off.v).any()
    on = flexdsl.load("eif", check_finite=True)
    x2 = torch.rand(30, 4) * 2
    assert torch.equal(on(x2), flexdsl.load("eif")(x2))
    assert on.state_seqs == {}  # the sequences read for the check are not kept unless asked for
    on.reset()
    assert on(torch.zeros(0, 4)).shape == (0, 4)  # no step, nothing to find
    assert s.shape == x.shape


def test_check_finite_blames_a_non_finite_input_and_a_param():
    m = flexdsl.load("lif", check_finite=True)
    x = torch.ones(10, 4)
    x[3, 2] = float("nan")
    with pytest.raises(flexdsl.FlexDSLError, match=r"state `v` became nan at step 3 .*element \(2,\)") as e:
        m(x)
    assert "the input `x` is not finite at step 3" in str(e.value)
    p = flexdsl.load("plif", check_finite=True)
    with torch.no_grad():
        p.w.fill_(float("inf"))
    with pytest.raises(flexdsl.FlexDSLError, match=r"param `w` is inf"):
        p(torch.ones(3, 2))


def test_check_finite_on_the_command_line(tmp_path, capsys):
    env = dict(os.environ, FLEXDSL_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
        [str(Path(flexdsl.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-m", "flexdsl", "run", "eif", "--param", "v_threshold=1e300", "--input", "0.5",
            "--T", "20"]
    r = subprocess.run([*args, "--check-finite"], env=env, capture_output=True, text=True, timeout=120)
    path, line, col = _state_pos("eif", "v")
    assert r.returncode == 1
    assert r.stderr.startswith(f"{path}:{line}:{col}: error: state `v` became nan at step "), r.stderr
    assert "Traceback" not in r.stderr
    from flexdsl.cli import main  # without the flag: the NaN goes through silently

    assert main(args[3:]) == 0
    assert "state v: final nan" in capsys.readouterr().out


def test_clipped_exponent_from_the_eif_docstring_stays_finite_and_exact_below_the_clip():
    """The clip shown in eif.neuron's docstring: finite where the library model diverges, and
    bit-for-bit the library model where the clip is not reached."""
    text = Path(flexdsl.compile("eif").filename).read_text()
    clipped = "v = v + (x + v_rest - v + delta_T * exp(min((v - theta_rh) / delta_T, 20.0))) / tau"
    assert clipped in text  # the docstring shows it
    body = text.replace("        v = v + (x + v_rest - v + delta_T * exp((v - theta_rh) / delta_T)) / tau",
                        "        " + clipped)
    assert body != text
    x = torch.full((40, 2, 3), 0.5)
    with pytest.raises(flexdsl.FlexDSLError):  # the library model diverges ...
        flexdsl.load("eif", v_threshold=200.0, check_finite=True)(x)
    m = flexdsl.loads(body, v_threshold=200.0, check_finite=True)
    m(x)  # no error
    x2 = torch.rand(50, 8) * 3
    assert torch.equal(flexdsl.loads(body)(x2), flexdsl.load("eif")(x2))


def test_an_overflowing_propagator_is_a_located_error():
    """A growth rate times dt beyond float64's exp range: the derived param that overflows is
    named at its equation, when the params are set (not as a NaN later)."""
    text = textwrap.dedent("""\
        neuron Unstable:
            input x
            param dt = 1.0
            param r = 1.0
            state a = 0.0
            state b = 0.0
            equations:
                da/dt = r * a + x
                db/dt = a - b
            output b
        """)
    m = flexdsl.loads(text)
    with pytest.raises(flexdsl.FlexDSLError, match=r"^<string>:8:10: error: with these params the step is not "
                                                   r"defined: `E_a_a` \(method `exact`\) is not finite"):
        m.r = 800.0
    with pytest.raises(flexdsl.FlexDSLError, match="E_a_a"):
        flexdsl.loads(text, r=800.0)
