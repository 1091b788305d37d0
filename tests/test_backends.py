"""The back half's interfaces: every printer covers every built-in function, the registries
agree, and a new backend is one module plus a registry entry (a printer-driven NumPy backend,
defined here, gives the torch backend's results on every library model)."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

import flexdsl
from flexdsl import backends
from flexdsl.backends.printer import BasePrinter
from flexdsl.backends.torch.emit import TorchPrinter
from flexdsl.backends.triton.emit import HostPrinter, TritonPrinter
from flexdsl.frontend.catalog import ALL_FUNCTIONS, METHODS, SURROGATES
from flexdsl.ir.functions import SYMPY
from flexdsl.ir.integrate import INTEGRATORS
from flexdsl.ir.surrogates import BUILTIN_SURROGATES

PRINTERS = [TorchPrinter, TritonPrinter, HostPrinter]


@pytest.mark.parametrize("printer", PRINTERS, ids=lambda p: p.__name__)
@pytest.mark.parametrize("name", sorted(ALL_FUNCTIONS))
def test_every_printer_prints_every_function(printer, name):
    f = ALL_FUNCTIONS[name]
    assert set(printer.SPELL) == set(ALL_FUNCTIONS), f"{printer.__name__}: spellings for {sorted(printer.SPELL)}"
    args = sp.symbols("a b c", real=True)[: f.arity]
    if name == "where":
        args = (sp.StrictGreaterThan(args[0], 0), *args[1:])
    expr = SYMPY[f.sympy](*args)
    text = printer()._print(expr)
    # the printed call uses the record's spelling (its text before the first argument)
    head = printer.SPELL[name].split("{")[0]
    if name not in ("detach",) and head:
        assert head in text, (name, text)
    assert "Symbol" not in text and "Function" not in text


def test_registries_agree():
    assert {f.sympy for f in ALL_FUNCTIONS.values()} == set(SYMPY)
    assert set(INTEGRATORS) == set(METHODS)
    assert set(BUILTIN_SURROGATES) == set(SURROGATES)


def test_host_printer_matches_numeric_forms():
    """The host spelling of each user function computes what its numeric form computes."""
    env = {"math": math, "_sigmoid": lambda x: 1 / (1 + math.exp(-x)), "_relu": lambda x: max(x, 0.0),
           "_clip": lambda x, lo, hi: min(max(x, lo), hi), "_host_exprel": lambda z: math.expm1(z) / z if z else 1.0}
    a, b, c = sp.symbols("a b c", real=True)
    vals = {"a": 0.7, "b": 1.3, "c": 2.0}
    for name, f in ALL_FUNCTIONS.items():
        if not f.user:
            continue
        args = (a, b, c)[: f.arity]
        if name == "where":
            expr = SYMPY[f.sympy](sp.StrictGreaterThan(a, b), b, c)
            expected = f.numeric(vals["a"] > vals["b"], vals["b"], vals["c"])
        else:
            expr = SYMPY[f.sympy](*args)
            expected = f.numeric(*(vals[s.name] for s in args))
        got = eval(HostPrinter()._print(expr), env, dict(vals))  # noqa: S307 - printed by the test's own printer
        assert got == pytest.approx(expected), name


# ------------------------------------------------------------------ a new backend: NumPy (tests/numpy_backend/)
# Everything a new code-printing backend needs, in one folder: a printer (a BasePrinter with its own
# SPELL table), an emitter printing the step and its derived backward from the IR, a program running
# the time loop (forward, backward, noise), a layer scan, and one registry entry (the `numpy_backend`
# fixture of tests/conftest.py). No file of flexdsl changes.


def _drive(name: str) -> list[torch.Tensor]:
    """Inputs that make the model fire (a scan of amplitudes, float64)."""
    n_in = len(flexdsl.compile(name).checked.inputs)
    g = torch.Generator().manual_seed(1)
    amp = torch.tensor([0.5, 2.0, 8.0, 30.0, 120.0, 500.0, 2000.0], dtype=torch.float64)
    return [torch.rand(60, 7, dtype=torch.float64, generator=g) * amp for _ in range(n_in)]


@pytest.mark.parametrize("name", flexdsl.library())
def test_a_printer_driven_numpy_backend_matches_every_library_model(name, numpy_backend):
    """A new backend is one printer, one emitter, one program and a registry entry: NumPy, run on
    every library model, gives the torch backend's outputs and state sequences in float64."""
    m_t = flexdsl.load(name, backend="torch", store_state_seqs=True)
    m_np = flexdsl.load(name, backend="numpy", store_state_seqs=True)
    xs = _drive(name)
    with torch.no_grad():
        a, b = m_np(*xs), m_t(*xs)
    for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(u, v, rtol=1e-9, atol=1e-9, equal_nan=True)
    assert set(m_np.state_seqs) == set(m_t.state_seqs)
    for s in m_t.state_seqs:
        torch.testing.assert_close(m_np.state_seqs[s], m_t.state_seqs[s], rtol=1e-9, atol=1e-9, equal_nan=True)
    assert "torch" not in m_np.compiled.artefact("numpy").source


@pytest.mark.parametrize("name", ["lif", "alif", "adex", "izhikevich", "hodgkin_huxley", "plif", "lif_refractory", "snn_synaptic"])
def test_the_numpy_backend_trains_through_the_derived_backward(name, numpy_backend):
    """Its gradient (the model's derived backward, run in NumPy) is the torch backend's, for the
    inputs, initial states and learnable params."""
    ck = flexdsl.compile(name).checked
    learn = [p.name for p in ck.params][:2]
    grads = []
    for backend in ("torch", "numpy"):
        m = flexdsl.load(name, backend=backend, learnable=learn).double()
        xs = [x[:20].clone().requires_grad_() for x in _drive(name)]
        out = m(*xs)
        out = out if isinstance(out, tuple) else (out,)
        g = torch.Generator().manual_seed(2)
        loss = sum((o * torch.randn(o.shape, dtype=o.dtype, generator=g)).sum() for o in out)
        loss = loss + sum(getattr(m, s).sum() for s in m.state_names)
        loss.backward()
        grads.append([x.grad for x in xs] + [p.grad for p in m.parameters()])
    assert len(grads[0]) == len(grads[1]) > len(_drive(name))
    for a, b in zip(*grads):  # (None: a param the outputs do not depend on; zeros)
        assert a is not None or b is not None
        torch.testing.assert_close(b if b is not None else torch.zeros_like(a), a if a is not None else
                                   torch.zeros_like(b), rtol=1e-8, atol=1e-10)


def test_the_numpy_backend_draws_the_noise_of_every_backend(numpy_backend):
    """A noisy model's draws come from flexdsl's Philox generator: the same seed, the same noise."""
    text = """neuron NoisyLIF:
    input x
    param tau = 10.0
    param sigma = 0.5
    state v = 0.0
    update:
        v = v + (x - v) / tau + sigma * randn()
    spike when v > 1.0
    output spike, v
"""
    x = torch.rand(30, 5, dtype=torch.float64) * 0.3
    a = flexdsl.loads(text, backend="torch")(x, seed=7)
    b = flexdsl.loads(text, backend="numpy")(x, seed=7)
    for u, v in zip(a, b):
        torch.testing.assert_close(v, u, rtol=1e-12, atol=1e-12)
    assert a[1].std() > 0.1


def test_what_a_backend_has_not_declared_is_a_located_error_naming_those_that_can(numpy_backend):
    from flexdsl.backends.base import Capabilities

    class Plain:  # forward only: no scans, no noise, no training, float64 only
        name = "plain"
        capabilities = Capabilities(devices=("cpu",), dtypes=("float64",), training=False, noise=False)

        def __getattr__(self, name):
            return getattr(backends.get("numpy"), name)

    backends.register("plain", Plain())
    try:
        with pytest.raises(flexdsl.FlexDSLError, match=r"backend `plain` does not run layer scans; .*`numpy`"):
            flexdsl.recurrent("lif", 3, 4, backend="plain")
        m = flexdsl.load("lif", backend="plain")
        with pytest.raises(flexdsl.FlexDSLError, match=r"backend `plain` does not run float32 tensors \(it runs "
                                                       r"float64 tensors\); .*`torch`"):
            m(torch.rand(4, 3))
        m(torch.rand(4, 3, dtype=torch.float64))  # (declared: runs)
        with pytest.raises(flexdsl.FlexDSLError, match="backend `plain` has no backward"):
            m(torch.rand(4, 3, dtype=torch.float64, requires_grad=True))
        noisy = "neuron N:\n    input x\n    state v = 0.0\n    update:\n        v = v + x + randn()\n    output v\n"
        with pytest.raises(flexdsl.FlexDSLError, match="does not draw random numbers.*`numpy`"):
            flexdsl.loads(noisy, backend="plain")
        assert "plain" not in backends.able(backends.Need(scans=True)) and "numpy" in backends.able(
            backends.Need(scans=True))
    finally:
        backends.unregister("plain")


def test_the_numpy_backend_sees_spikes_and_resets():
    """The comparison above is not vacuous: most library models fire on those inputs."""
    firing = 0
    for name in flexdsl.library():
        m = flexdsl.load(name, backend="torch")
        if m.compiled.checked.spike is None:
            continue
        with torch.no_grad():
            out = m(*_drive(name))
        firing += float((out[0] if isinstance(out, tuple) else out).sum()) > 0
    assert firing >= 20


def test_unknown_backend_lists_the_registry():
    with pytest.raises(flexdsl.FlexDSLError, match="auto, " + ", ".join(backends.names())):
        flexdsl.load("lif", backend="cuda-c")


def test_a_code_printing_backend_keeps_its_spellings_in_its_own_module():
    """A new target's printer names its spellings in its own `SPELL` table (no catalog edit);
    a spelling it lacks is a clear error when the class is defined, naming the function."""
    import sympy as sp

    from flexdsl.frontend.catalog import ALL_FUNCTIONS
    from flexdsl.ir.functions import SYMPY

    spell = {f.name: f"np_{f.name}(" + ", ".join(f"{{{i}}}" for i in range(f.arity)) + ")"
             for f in ALL_FUNCTIONS.values()}

    class NumpyPrinter(BasePrinter):
        TARGET = "numpy"
        SPELL = spell

    x, y = sp.symbols("x y", real=True)
    pr = NumpyPrinter()
    assert pr.doprint(sp.exp(x) + SYMPY["sigmoid"](y)) in ("np_exp(x) + np_sigmoid(y)", "np_sigmoid(y) + np_exp(x)")
    assert pr.doprint(SYMPY["Where"](x > 0, x, y)) == "np_where(x > 0, x, y)"

    with pytest.raises(TypeError, match=r"cannot print the built-in functions? .*clip.*SPELL"):
        class Incomplete(BasePrinter):
            TARGET = "numpy"
            SPELL = {k: v for k, v in spell.items() if k != "clip"}
