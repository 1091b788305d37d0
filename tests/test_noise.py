"""Noise in the language (issue 21): white noise `xi` in ODEs and the draws `randn()`/`rand()`,
against independent references.

- the generator: Random123's known-answer vectors of Philox4x32-10; the same numbers from the torch
  implementation, Triton's own `tl.philox` (interpreter) and the C++ kernels; draws that depend on
  (seed, step, element) only: other Triton block sizes, other thread counts, other step blocks of
  the torch path, a sequence given in pieces, save vs recompute plans;
- every noisy test model on the torch, Triton and C++ backends from one seed: the same draws
  bit for bit, outputs and gradients to rounding (the standard of every torch-vs-kernel test), spikes
  equal; other seeds differ;
- gradients of the sampled trajectory (the reparametrization through `sigma`): the kernels' derived
  backward against torch autograd, and against central finite differences in float64 at a fixed seed;
- seeds: torch.manual_seed repeats a run, `seed=` repeats a call, `generator=`, reset() draws anew,
  the functional form, torch.compile;
- every bad input of the issue is a located error saying what to write instead.
(Statistics and convergence orders: tests/test_noise_stats.py.)
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import

import pytest  # noqa: E402
import torch  # noqa: E402

import flexdsl  # noqa: E402
from flexdsl import backends  # noqa: E402
from flexdsl.backends import random as R  # noqa: E402
from flexdsl.backends.cpu import CALLS  # noqa: E402
from flexdsl.backends.triton import LAUNCHES  # noqa: E402

CPU = backends.get("cpu").available()

# ------------------------------------------------------------------ the noisy test models
from noisy_models import ESCAPE, GBM, LIF_EM, MODELS, NLIF, OU, SCALE, TWO  # noqa: E402
from tolerances import assert_close, layer_ops, scan_ops  # noqa: E402


def _tuple(o):
    return o if isinstance(o, tuple) else (o,)


def _close(a, b, ops: int, what=""):
    """Two backends' float32 results within `ops` roundings of each other, relative to the
    largest value (tests/tolerances.py); the draws are bit-equal, so only the arithmetic differs."""
    assert_close(a, b, ops=ops, what=what)


def _call(text, backend, x, seed, dtype=torch.float32, plan=None):
    """Outputs, final states and gradients (input, learnable params) of one call with `seed`."""
    m = flexdsl.loads(text, backend=backend).to(dtype)
    if plan is not None:
        m.compiled.program("triton").train_plan = plan
    xx = x.detach().clone().to(dtype).requires_grad_(True)
    outs = _tuple(m(xx, seed=seed))
    w = [torch.linspace(-1, 1, o.numel(), dtype=dtype).reshape(o.shape) for o in outs]
    loss = sum((o * wi).sum() for o, wi in zip(outs, w)) + sum(getattr(m, s).sum() for s in m.state_names)
    params = list(m.parameters())
    grads = torch.autograd.grad(loss, [xx, *params])
    if plan is not None:
        m.compiled.program("triton").default_train_plans()
    return [o.detach() for o in outs], [getattr(m, s).detach() for s in m.state_names], grads, m


# ------------------------------------------------------------------ the generator
def test_philox_known_answers():
    """Random123's known-answer vectors of Philox4x32-10 (counter, key -> four words)."""
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in kat:
        got = R.philox(key[0] | (key[1] << 32), *(torch.tensor([c], dtype=torch.int64) for c in ctr))
        assert tuple(int(g) for g in got) == want


def test_triton_philox_is_the_same_generator():
    """Triton's own `tl.philox` (its interpreter) gives the torch implementation's words for the
    counters the kernels use (element, element >> 32, step, draw)."""
    import triton
    import triton.language as tl

    @triton.jit
    def words(out, seed, t, k, N: tl.constexpr):
        offs = tl.arange(0, N).to(tl.int64) * 4099 + 12345678901
        c0 = offs.to(tl.uint32)
        zero = c0 * 0
        a, b, c, d = tl.philox(seed, c0, (offs >> 32).to(tl.uint32), zero + t, zero + k)
        tl.store(out + tl.arange(0, N) * 4 + 0, a.to(tl.int64))
        tl.store(out + tl.arange(0, N) * 4 + 1, b.to(tl.int64))
        tl.store(out + tl.arange(0, N) * 4 + 2, c.to(tl.int64))
        tl.store(out + tl.arange(0, N) * 4 + 3, d.to(tl.int64))

    N, seed, t, k = 64, 0x2F3A5C7D1E4B6A9, 777, 3
    out = torch.zeros(N, 4, dtype=torch.int64)
    words[(1,)](out, seed, t, k, N)
    elem = torch.arange(N, dtype=torch.int64) * 4099 + 12345678901
    ref = R.philox(seed, elem & R.MASK, elem >> 32, torch.full_like(elem, t), torch.full_like(elem, k))
    assert torch.equal(out, torch.stack(ref, 1) & R.MASK)


DRAWS = """neuron Draws:
    input x
    state a = 0.0
    state b = 0.0
    state c = 0.0
    update:
        a = randn() + 0*x
        b = rand()
        c = randn()
    output a, b, c
"""


@pytest.mark.parametrize("backend", ["triton", "cpu"])
def test_every_backend_draws_the_same_numbers(backend):
    """Three draws of 40 steps x 3 x 1000 elements: bit for bit the torch path's in float32 (the
    normals are computed in float64 and rounded: the backends' float64 log and cos agree to an ulp,
    which moves a float32 result with a probability of about 1e-8 per draw); in float64 (torch and
    CPU) the uniforms bit for bit, the normals to an ulp or two; normals standard, uniforms in (0, 1);
    the draws of a step are independent."""
    if backend == "cpu" and not CPU:
        pytest.skip("no C++ compiler (the CPU backend is tested where one is found)")
    x = torch.zeros(40, 3, 1000)
    seed = 2**61 + 12345
    for dtype in [torch.float32] + ([torch.float64] if backend == "cpu" else []):
        ref = flexdsl.loads(DRAWS, backend="torch").to(dtype)(x.to(dtype), seed=seed)
        got = flexdsl.loads(DRAWS, backend=backend).to(dtype)(x.to(dtype), seed=seed)
        for kind, r, g in zip(("randn", "rand", "randn"), ref, got):
            if dtype == torch.float32 or kind == "rand":
                assert torch.equal(r, g), (dtype, kind)
            else:
                torch.testing.assert_close(r, g, rtol=1e-15, atol=1e-15)
    a, b, c = ref
    assert abs(a.mean()) < 0.02 and abs(a.std() - 1) < 0.02  # 120,000 normals: 5 SE
    assert 0 < b.min() and b.max() < 1 and abs(b.mean() - 0.5) < 0.005
    assert abs(torch.corrcoef(torch.stack([a.flatten(), c.flatten()]))[0, 1]) < 0.015


def test_draws_depend_on_seed_step_and_element_only(monkeypatch):
    """Other Triton block sizes, CPU thread counts and torch step blocks; a call in pieces after
    a reset: the same numbers."""
    x = torch.zeros(30, 65)  # (65 lanes: several programs at blocks of 16 and 64, one at 512)
    ref = flexdsl.loads(DRAWS, backend="torch")(x, seed=9)
    monkeypatch.setattr(R, "STEP_BLOCK", 300)  # the torch path computes 1 step at a time
    assert all(torch.equal(a, b) for a, b in zip(ref, flexdsl.loads(DRAWS, backend="torch")(x, seed=9)))
    for block in (16, 64, 512):
        m = flexdsl.loads(DRAWS, backend="triton")
        prog = m.compiled.program("triton")
        monkeypatch.setattr(prog, "_block", lambda N, rc=False, b=block: b)
        assert all(torch.equal(a, b) for a, b in zip(ref, m(x, seed=9))), block
    if CPU:
        threads = torch.get_num_threads()
        try:
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                assert all(torch.equal(a, b) for a, b in zip(ref, flexdsl.loads(DRAWS, backend="cpu")(x, seed=9)))
        finally:
            torch.set_num_threads(threads)
    for backend in ["torch", "triton"] + (["cpu"] if CPU else []):
        m = flexdsl.loads(DRAWS, backend=backend)
        pieces = [m(x[i:j], seed=9) for i, j in [(0, 7), (7, 8), (8, 30)]]
        for k in range(3):
            assert torch.equal(torch.cat([p[k] for p in pieces]), ref[k]), backend


# ------------------------------------------------------------------ the models on every backend
@pytest.mark.parametrize("name", sorted(MODELS))
def test_noisy_models_agree_across_backends(name):
    """One seed: outputs, final states and gradients (input, learnable params) of the Triton
    kernels (both training plans) and the C++ kernels equal the torch path's to rounding, spikes
    exactly; another seed gives other outputs."""
    text, scale = MODELS[name], SCALE.get(name, 1.5)
    x = torch.rand(13, 11, generator=torch.Generator().manual_seed(3)) * scale
    ref = _call(text, "torch", x, 1234)
    runs = {f"triton-{plan}": _call(text, "triton", x, 1234, plan=plan) for plan in ("save", "recompute")}
    if CPU:
        runs["cpu"] = _call(text, "cpu", x, 1234)
    for kind, got in runs.items():
        for i, (a, b) in enumerate(zip(got[0], ref[0])):
            if got[3].compiled.checked.outputs[i][0] == "spike":
                assert torch.equal(a, b), (name, kind)
            else:
                _close(a, b, scan_ops(text, 13, backward=False), what=f"{name} {kind} output")
        for a, b in zip(got[1], ref[1]):
            _close(a, b, scan_ops(text, 13, backward=False), what=f"{name} {kind} state")
        for i, (a, b) in enumerate(zip(got[2], ref[2])):  # (a param's: summed over the 13 x 11 inputs)
            _close(a, b, scan_ops(text, 13, x.numel()), what=f"{name} {kind} grad {i}")
    other = _call(text, "torch", x, 1235)
    assert not all(torch.equal(a, b) for a, b in zip(other[0] + other[1], ref[0] + ref[1]))


def test_float64_cpu_kernels_and_torch_agree():
    if not CPU:
        pytest.skip("no C++ compiler")
    x = torch.rand(17, 9, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2.5
    for text in (LIF_EM, TWO, GBM.format(method="milstein")):
        a, b = _call(text, "torch", x, 77, torch.float64), _call(text, "cpu", x, 77, torch.float64)
        for u, v in zip([*a[0], *a[1], *a[2]], [*b[0], *b[1], *b[2]]):
            torch.testing.assert_close(u, v, rtol=1e-11, atol=1e-12)


# ------------------------------------------------------------------ gradients of the sampled trajectory
def test_sigma_gradient_is_the_reparametrization():
    """OU integrated `exact` is linear in sigma at a fixed seed: v_T(sigma) = v_T(0) + sigma * n, so
    d v_T / d sigma = (v_T(sigma) - v_T(0)) / sigma, which the derived backward gives on every
    backend (float64 on the torch path and the CPU kernels)."""
    x = torch.rand(25, 6, dtype=torch.float64) * 2
    for backend in ["torch"] + (["cpu"] if CPU else []):
        m = flexdsl.loads(OU, backend=backend).double()
        out = m(x, seed=5)
        out[-1].sum().backward()
        g = m.sigma.grad.item()
        with torch.no_grad():
            m.reset()
            m.sigma.fill_(0.0)
            v0 = m(x, seed=5)[-1].sum().item()
            m.reset()
            m.sigma.fill_(1.0)
            v1 = m(x, seed=5)[-1].sum().item()
        assert g == pytest.approx(v1 - v0, rel=1e-12, abs=1e-12), backend


@pytest.mark.parametrize("name", ["ou", "gbm_milstein", "gbm_heun", "two_sources_smooth"])
def test_gradients_match_finite_differences(name):
    """Central differences in float64 at a fixed seed, for every learnable param and the input
    (models without a spike rule: the trajectory is smooth in them)."""
    text = MODELS.get(name) or TWO.replace("    spike when v > 1.0\n    on spike:\n        v = 0.0\n", "")
    x = torch.rand(20, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(8)) * 0.3
    w = torch.linspace(-1, 1, 100, dtype=torch.float64).reshape(20, 5)
    for backend in ["torch"] + (["cpu"] if CPU else []):
        m = flexdsl.loads(text, backend=backend).double()

        def loss(xx, m=m):
            m.reset()
            return (_tuple(m(xx, seed=31))[0] * w).sum()

        xx = x.clone().requires_grad_(True)
        grads = torch.autograd.grad(loss(xx), [xx, *m.parameters()])
        h = 1e-6
        for (pname, p), g in zip(m.named_parameters(), grads[1:]):
            with torch.no_grad():
                v = p.item()
                p.fill_(v + h)
                up = loss(x).item()
                p.fill_(v - h)
                down = loss(x).item()
                p.fill_(v)
            assert g.item() == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-8), (name, backend, pname)
        for idx in [(0, 0), (7, 3), (19, 4)]:
            e = torch.zeros_like(x)
            e[idx] = h
            fd = (loss(x + e).item() - loss(x - e).item()) / (2 * h)
            assert grads[0][idx].item() == pytest.approx(fd, rel=1e-6, abs=1e-8), (name, backend, idx)


def test_torch_autograd_equals_the_derived_backward():
    """The torch path's autograd through `core` and the derived backward (`core_backward`, the
    VJP printed from the symbolic backward, replaying the draws) give the same gradients."""
    c = flexdsl.compile(MODELS["two_sources"])
    x = torch.rand(9, 4, dtype=torch.float64)
    m = flexdsl.loads(MODELS["two_sources"], backend="torch").double()
    st = {k: v.clone().requires_grad_(True) for k, v in m.initial_state(x).items()}
    xx = x.clone().requires_grad_(True)
    out, fin = m.step(xx, state=st, seed=3)
    gy = torch.randn_like(out)
    gf = {k: torch.randn_like(v) for k, v in fin.items()}
    loss = (out * gy).sum() + sum((fin[k] * gf[k]).sum() for k in fin)
    ref = torch.autograd.grad(loss, [xx, *st.values(), m.sigma_v])
    # the same, step by step backwards through the derived VJP
    prog = c.program("torch")
    params = [p if isinstance(p, torch.Tensor) else torch.tensor(float(p), dtype=torch.float64)
              for p in c.with_derived([getattr(m, n) for n in m._param_decls])]
    stream = R.NoiseStream(3, 0, (4,), torch.float64, x.device, 9)
    with torch.no_grad():
        _, _, _, prevs = prog.loop([x], list(st.values()), params, False, True, flexdsl.backends.base.NoiseKey(3))
    g_state = [gf[k] for k in m.state_names]
    gx = torch.zeros_like(x)
    g_sigma = 0.0
    for t in range(8, -1, -1):
        r = c.torch_backward(x[t], *(p[t] for p in prevs), gy[t], *g_state, *params, stream.at(t))
        gx[t] = r[0]
        g_state = list(r[1:3])
        g_sigma = g_sigma + r[3].sum()
    torch.testing.assert_close(gx, ref[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(g_state, ref[1:3]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_sigma, ref[3], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ seeds and streams
def test_seeds_streams_and_generators():
    m = flexdsl.loads(NLIF, backend="torch")
    x = torch.full((30, 50), 0.6)
    torch.manual_seed(0)
    a = m(x)
    m.reset()
    torch.manual_seed(0)
    assert torch.equal(a, m(x))  # torch.manual_seed repeats a run
    m.reset()
    assert not torch.equal(a, m(x))  # a reset draws a new seed
    b = m(x)  # the stream goes on (steps 30..59): new noise, no repetition
    assert not torch.equal(b[:5], m.step(x[:5], None, seed=0)[0])
    m.reset()
    s1 = m(x, seed=11)
    m.reset()
    assert torch.equal(s1, m(x, seed=11))  # seed= repeats a call after a reset
    g1 = m(x, generator=torch.Generator().manual_seed(5))
    g2 = m(x, generator=torch.Generator().manual_seed(5))
    assert not torch.equal(g1, g2)  # (a generator gives the seed; the steps go on)
    m.reset()
    g1 = m(x, generator=torch.Generator().manual_seed(5))
    m.reset()
    assert torch.equal(g1, m(x, generator=torch.Generator().manual_seed(5)))
    # the functional form: steps from 0; the same seed, the same draws; no seed, a new one per call
    out1, _ = m.step(x, None, seed=4)
    out2, _ = m.step(x, None, seed=4)
    assert torch.equal(out1, out2) and not torch.equal(m.step(x, None)[0], m.step(x, None)[0])
    # single-step mode: one step per call, the stream continues
    s = flexdsl.loads(NLIF, backend="torch", step_mode="s")
    ys = [s(x[t], seed=11) for t in range(30)]
    assert torch.equal(torch.stack(ys), s1)
    # m.core: one step with its own draws
    v, = m.core(x[0], torch.zeros(50))[1:]
    assert v.shape == (50,)


def test_compiled_noisy_models_equal_eager():
    """torch.compile(fullgraph=True) of a noisy model: with seed= the eager draws; the stream
    (seed, steps) advances as a graph input, without recompiling; gradients too."""
    for backend in ["torch", "triton"] + (["cpu"] if CPU else []):
        torch._dynamo.reset()
        m = flexdsl.loads(NLIF, backend=backend)
        x = torch.full((20, 4), 0.6, requires_grad=True)
        cm = torch.compile(m, fullgraph=True, backend="aot_eager")
        out = cm(x, seed=5)
        out.sum().backward()
        g = m.sigma.grad.clone()
        m.sigma.grad = None
        m.reset()
        ref = m(x, seed=5)
        ref.sum().backward()
        assert torch.equal(out, ref), backend
        assert_close(g, m.sigma.grad, ops=scan_ops(NLIF, 20, x.numel()))
        m.reset()
        a, b = cm(x), cm(x)
        assert not torch.equal(a, b) and int(m._noise_state[1]) == 40, backend


def test_recurrent_layers_of_noisy_models():
    """A recurrent layer draws what its neuron draws (elements b*H + h): with W_rec = 0 it is the
    neuron module; the Triton scan and the CPU kernels' scan equal the torch scan, gradients included."""
    for text in (NLIF, OU):
        x = torch.rand(9, 3, 6)
        for backend in ("torch", *(["cpu"] if CPU else [])):  # (the scan and the module on the same backend)
            r = flexdsl.recurrent(flexdsl.loads(text), None, 6, bias=False, backend=backend)
            with torch.no_grad():
                r.W_rec.zero_()
            assert torch.equal(r(x, seed=4), flexdsl.loads(text, backend=backend)(x, seed=4)), backend
        res = {}
        scans = ("torch", "triton", *(["cpu"] if CPU else []))
        for backend in scans:
            torch.manual_seed(1)
            r = flexdsl.recurrent(flexdsl.loads(text), 5, 6, backend=backend)
            xx = torch.rand(9, 3, 5)
            out = r(xx, seed=99)
            (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
            res[backend] = (out.detach(), r.W_rec.grad, r.neuron.sigma.grad)
        for backend in scans[1:]:
            for a, b in zip(res[backend], res["torch"]):
                _close(a, b, layer_ops(text, 9, 3, 5, 6), what=f"{text.split(':')[0]} {backend}")
    # under torch.compile: one graph node, the same draws
    for backend in ("torch", "triton", *(["cpu"] if CPU else [])):
        torch._dynamo.reset()
        torch.manual_seed(1)
        r = flexdsl.recurrent(flexdsl.loads(NLIF), 5, 6, backend=backend)
        x = torch.rand(9, 3, 5, requires_grad=True)
        out = torch.compile(r, fullgraph=True, backend="aot_eager")(x, seed=3)
        out.sum().backward()
        g = r.W_rec.grad.clone()
        r.W_rec.grad = None
        r.reset()
        ref = r(x, seed=3)
        ref.sum().backward()
        assert torch.equal(out, ref) and torch.equal(g, r.W_rec.grad), backend


def test_noise_follows_the_element_not_the_memory_layout():
    """An input in another memory layout (channels_last: the kernels run on it as it lies) draws
    the same noise for the same element: the C-order position in the step's shape."""
    x = torch.rand(6, 2, 3, 4, 5) * 1.5
    xc = x.contiguous(memory_format=torch.channels_last_3d)  # (steps [2, 3, 4, 5] stored channels last)
    assert not xc.is_contiguous()
    ref = flexdsl.loads(NLIF, backend="torch")(x, seed=8)
    for backend in ["triton"] + (["cpu"] if CPU else []):
        m = flexdsl.loads(NLIF, backend=backend)
        assert torch.equal(m(xc, seed=8), ref), backend


# ------------------------------------------------------------------ the stochastic spike
def test_escape_noise_fires_with_its_probability_and_the_default_surrogate():
    """`spike when rand() < p` fires with probability p (20,000 lanes x 50 steps, p = 0.3: within
    5 standard errors), its default surrogate is `straight_through` (d spike / d p = 1, the
    derivative of the firing probability), so the gradient of the spike count by p is the
    number of draws."""
    text = """neuron Bernoulli:
    input p
    spike when rand() < p
"""
    c = flexdsl.compile(text)
    assert c.checked.surrogate.name == "straight_through"
    m = flexdsl.loads(text, backend="torch")
    p = torch.full((50, 20000), 0.3, requires_grad=True)
    s = m(p, seed=3)
    n = s.numel()
    assert abs(s.mean().item() - 0.3) < 5 * (0.3 * 0.7 / n) ** 0.5
    s.sum().backward()
    assert torch.equal(p.grad, torch.ones_like(p))


# ------------------------------------------------------------------ the generated code and the docs
def test_generated_code_shows_the_draws_with_their_lines():
    c = flexdsl.compile(LIF_EM)
    torch_src = c.torch_source
    assert "# line 11: dv/dt = (v_rest - v + R*I)/tau_m + sigma*sqrt(2/tau_m)*xi\n    randn_xi = _noise.randn(0)" \
        in torch_src
    tri = c.triton_source
    assert "tl.philox" in tri and "_randn(_seedlo, _seedhi, _tnow, _offs, 0)" in tri and "# line 11:" in tri
    cpp = c.artefact("cpu").source
    assert "fx_philox" in cpp and "const R randn_xi_ = _d0[_i];" in cpp and "// line 11:" in cpp
    esc = flexdsl.compile(ESCAPE).torch_source
    assert "# line 10: spike when rand() < p\n    rand_1 = _noise.rand(0)" in esc


def test_docs_show_the_noise():
    """The equations as written show white noise as ξ, the derived step its draw as N(0, 1), the
    stochastic spike rule as written (`rand() < p`)."""
    assert r"\xi" in flexdsl.compile(LIF_EM).latex()
    step = flexdsl.compile(LIF_EM).latex("step")
    assert r"\mathcal{N}\left(0, 1\right)" in step
    esc = flexdsl.compile(ESCAPE).latex()
    assert r"\mathcal{U}\left(0, 1\right) \lt p" in esc


# ------------------------------------------------------------------ bad input
BAD = [
    ("xi in update", "    update:\n        v = v + xi\n", "`xi` is the white noise of an ODE", "randn()"),
    ("randn in an ODE", "    param dt = 0.1\n    equations:\n        dv/dt = -v + randn()\n",
     "`randn()` in an equation", "xi"),
    ("rk4 with noise", "    param dt = 0.1\n    equations method rk4:\n        dv/dt = -v + xi\n",
     "`rk4` does not integrate white noise", "`exact`, `euler`, `heun`, `milstein`"),
    ("exponential_euler with noise", "    param dt = 0.1\n    equations method exponential_euler:\n"
     "        dv/dt = -v + v*xi\n", "does not integrate white noise", "`euler`, `heun`, `milstein`"),
    ("noise through noise", "    param dt = 0.1\n    equations:\n        dv/dt = -v + xi*xi\n",
     "white noise must enter linearly", "f + g*xi"),
    ("noise times noise", "    param dt = 0.1\n    equations:\n        dv/dt = -v + xi*xi_2\n",
     "white noise must enter linearly", "f + g*xi"),
    ("noise in a function", "    param dt = 0.1\n    equations:\n        dv/dt = -v + exp(xi)\n",
     "white noise must enter linearly", "f + g*xi"),
    ("exact with multiplicative noise", "    param dt = 0.1\n    equations method exact:\n        dv/dt = -v + v*xi\n",
     "`exact` takes additive noise", "heun"),
    ("milstein, non-diagonal", "    param dt = 0.1\n    state w = 0.0\n    equations method milstein:\n"
     "        dv/dt = -v + xi + xi_2\n        dw/dt = -w + xi\n", "`milstein` takes one noise source per equation",
     "heun"),
    ("exact, coupled noise", "    param dt = 0.1\n    state w = 0.0\n    equations method exact:\n"
     "        dv/dt = -v + w\n        dw/dt = -w + xi\n", "not coupled", "euler"),
    ("declared xi", "    param xi = 1.0\n    update:\n        v = v + xi\n", "`xi` is Gaussian white noise",
     "eta"),
    ("randn with an argument", "    update:\n        v = v + randn(2)\n", "`randn()` takes no arguments", "sigma*randn()"),
    ("randn in a param", "    param a = randn()\n    update:\n        v = v + a\n", "draws a new value at every step",
     "`update`"),
    ("xi in the spike rule", "    param dt = 0.1\n    equations:\n        dv/dt = -v + xi\n"
     "    spike when v + xi > 1\n", "`xi` is the white noise of an ODE", "randn()"),
    ("noisy subexpression in update", "    param dt = 0.1\n    equations:\n        noise = 0.5*xi\n"
     "        dv/dt = -v + noise\n    update:\n        v += noise\n", "holds white noise", "randn()"),
]


@pytest.mark.parametrize("what,body,message,hint", BAD, ids=[b[0] for b in BAD])
def test_bad_noise_is_a_located_error(what, body, message, hint):
    text = "neuron Bad:\n    input x\n    state v = 0.0\n" + body
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.compile(text).step  # noqa: B018 (the lowering's errors too)
    err = e.value
    assert message in str(err) and hint in str(err), str(err)
    assert err.line is not None and err.line > 3 and "^" in str(err)


def test_wrong_unit_of_the_noise():
    text = LIF_EM.replace("sigma*sqrt(2/tau_m)*xi", "sigma*xi")
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.compile(text)
    msg = str(e.value)
    assert "1/sqrt(time)" in msg and "sigma*sqrt(2/tau)*xi" in msg and e.value.line == 11


def test_seed_errors():
    m = flexdsl.load("lif")
    x = torch.rand(3, 2)
    with pytest.raises(flexdsl.FlexDSLError, match="draws no random numbers"):
        m(x, seed=1)
    n = flexdsl.loads(NLIF)
    for bad in (-1, 1.5, "3", 2**62, True):
        with pytest.raises(flexdsl.FlexDSLError, match="seed"):
            n(x, seed=bad)
    with pytest.raises(flexdsl.FlexDSLError, match="not both"):
        n(x, seed=1, generator=torch.Generator())
    with pytest.raises(flexdsl.FlexDSLError, match="torch.Generator"):
        n(x, generator=3)


def test_cli_reports_bad_noise_without_a_traceback(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "bad.neuron"
    f.write_text("neuron Bad:\n    input x\n    param dt = 0.1\n    state v = 0.0\n    equations method rk2:\n"
                 "        dv/dt = -v + xi\n")
    r = subprocess.run([sys.executable, "-m", "flexdsl", "check", str(f)], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    assert "bad.neuron:6:10: error: method `rk2` does not apply" in r.stderr + r.stdout


def test_kernels_really_ran():
    before_t, before_c = LAUNCHES["fwd"], CALLS["fwd"]
    x = torch.rand(5, 3)
    flexdsl.loads(NLIF, backend="triton")(x, seed=1)
    assert LAUNCHES["fwd"] == before_t + 1
    if CPU:
        flexdsl.loads(NLIF, backend="cpu")(x, seed=1)
        assert CALLS["fwd"] == before_c + 1


def test_nir_export_of_a_noisy_model_is_a_located_error():
    pytest.importorskip("nir")
    import flexdsl.nir

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), flexdsl.loads(NLIF))
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.nir.export(net, torch.rand(5, 2, 3), dt=1e-3)
    assert "draws random numbers" in str(e.value) and e.value.line == 8 and e.value.column == 41


# ------------------------------------------------------------------ one rule for where the draws come from
def _stream_run(make, path: str, functional: bool):
    """Three calls (the third after a reset) from torch.manual_seed(123) on one path, and what the
    global generator looks like after each call."""
    torch._dynamo.reset()
    torch.manual_seed(0)  # (a layer's initial weights)
    m = make()
    f = m if path == "eager" else torch.compile(m, fullgraph=True, backend=path)
    torch.manual_seed(123)
    x = torch.full((6, 4), 0.6)
    outs, rng = [], []
    for k in range(3):
        if k == 2:
            m.reset()
        outs.append(f(x).detach())
        rng.append(torch.get_rng_state())
    if functional:  # the functional form without a seed: a seed per call
        g = torch.compile(lambda xx: m.step(xx, None)[0], fullgraph=True, backend=path) if path != "eager" else \
            (lambda xx: m.step(xx, None)[0])
        outs += [g(x).detach(), g(x).detach()]
        rng.append(torch.get_rng_state())
    return outs, rng


@pytest.mark.parametrize("kind", ["neuron", "layer"])
@pytest.mark.parametrize("backend", ["torch", "triton"] + (["cpu"] if CPU else []))
def test_random_streams_are_the_same_on_every_path(kind, backend):
    """Eager, compiled (aot_eager and Inductor), a neuron and a recurrent layer: from one
    torch.manual_seed the same draws, and the global generator advanced by exactly one seed per
    reset (and one per functional call without a seed), never on the other calls."""
    from flexdsl.runtime.noise import draw_seed

    if kind == "neuron":
        def make():
            return flexdsl.loads(NLIF, backend=backend)
    else:
        def make():
            return flexdsl.recurrent(flexdsl.loads(NLIF), None, 4, bias=False, backend=backend)

    ref, rng = _stream_run(make, "eager", kind == "neuron")
    torch.manual_seed(123)
    draw_seed()  # the one seed of the first call
    assert torch.equal(rng[0], torch.get_rng_state()) and torch.equal(rng[1], rng[0])  # none at the second
    draw_seed()
    assert torch.equal(rng[2], torch.get_rng_state())  # one after the reset
    assert not torch.equal(ref[0], ref[1])  # (the stream goes on: other noise at the next steps)
    paths = ["aot_eager"] + (["inductor"] if backend != "triton" else [])
    for path in paths:
        got, rng_c = _stream_run(make, path, kind == "neuron")
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert torch.equal(a, b), (path, kind, backend)
        for a, b in zip(rng_c, rng):
            assert torch.equal(a, b), (path, "the global generator advanced differently")
