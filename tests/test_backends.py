"""The back half's interfaces: every printer covers every built-in function, the registries
agree, and a new backend is one module plus a registry entry (a printer-driven NumPy backend,
defined here, gives the torch backend's results on every library model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch

import flexdsl
from flexdsl import backends
from flexdsl.backends.base import RunResult
from flexdsl.backends.printer import BasePrinter, lhs_rhs_lines
from flexdsl.backends.torch.emit import TorchPrinter
from flexdsl.backends.triton.emit import HostPrinter, TritonPrinter
from flexdsl.frontend.catalog import ALL_FUNCTIONS, METHODS, SURROGATES
from flexdsl.ir.functions import SYMPY
from flexdsl.ir.integrate import INTEGRATORS
from flexdsl.ir.surrogates import BUILTIN_SURROGATES
from flexdsl.store.cache import Artefact
from flexdsl.store.generated import load_module

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
           "_clip": lambda x, lo, hi: min(max(x, lo), hi)}
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


# ------------------------------------------------------------------ a new backend: NumPy, printer-driven
# Everything a new code-printing backend needs, in this test module only: a printer (a BasePrinter
# with its own SPELL table), an emitter printing the step from the IR, a program running the
# time loop, and one registry entry. No file of flexdsl changes.
_NP_PROLOGUE = """import numpy as np


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _exprel(z):
    z = np.asarray(z, dtype=np.float64)
    zb = np.where(z == 0, 1.0, z)
    return np.where(z == 0, 1.0, np.expm1(zb) / zb)


def _exprel_d(z):
    z = np.asarray(z, dtype=np.float64)
    small = np.abs(z) < 1.0
    zs = np.where(small, z, 0.0)
    series = np.zeros_like(z)
    for k in range(19, -1, -1):
        series = series * zs + (k + 1) / math.factorial(k + 2)
    zb = np.where(small, 1.0, z)
    return np.where(small, series, ((zb - 1.0) * np.exp(zb) + 1.0) / (zb * zb))
"""


class NumpyPrinter(BasePrinter):
    TARGET = "numpy"
    SPELL = {
        "exp": "np.exp({0})", "log": "np.log({0})", "sqrt": "np.sqrt({0})", "abs": "np.abs({0})",
        "sin": "np.sin({0})", "cos": "np.cos({0})", "tanh": "np.tanh({0})", "sigmoid": "_sigmoid({0})",
        "relu": "np.maximum({0}, 0.0)", "min": "np.minimum({0}, {1})", "max": "np.maximum({0}, {1})",
        "clip": "np.clip({0}, {1}, {2})", "where": "np.where({0}, {1}, {2})",
        "heaviside": "np.where({0} >= 0, 1.0, 0.0)", "spike_ge": "np.where({0} >= 0, 1.0, 0.0)",
        "spike_gt": "np.where({0} > 0, 1.0, 0.0)", "detach": "{0}", "sign": "np.sign({0})",
        "exprel": "_exprel({0})", "exprel_d": "_exprel_d({0})",
    }


def emit_numpy(ir) -> str:
    """`step(*inputs, *states, *params) -> (*outputs, *next states)`, printed from the IR's step."""
    step, pr = ir.step, NumpyPrinter()
    args = [pr._print(s) for s in [*step.inputs, *step.states]] + [pr._print(p.symbol) for p in step.params]
    lines = ["import math", _NP_PROLOGUE, "", f"def step({', '.join(args)}):"]
    lines += lhs_rhs_lines(pr, step.assignments)
    rets = [pr._print(v) for _, v in step.outputs] + [pr._print(v) for v in step.next_states]
    lines.append(f"    return ({', '.join(rets)},)")
    return "\n".join(lines) + "\n"


class NumpyProgram:
    def __init__(self, fn, n_outputs: int) -> None:
        self.fn, self.n_outputs = fn, n_outputs

    def run(self, inputs, states, params, *, store_seqs):
        xs = [x.detach().double().numpy() for x in inputs]
        T, shape = xs[0].shape[0], np.broadcast_shapes(*(x.shape[1:] for x in xs))
        st = [np.broadcast_to(s.detach().double().numpy() if isinstance(s, torch.Tensor) else float(s), shape)
              for s in states]
        pr = [p.detach().double().numpy() if isinstance(p, torch.Tensor) else float(p) for p in params]
        outs: list[list] = [[] for _ in range(self.n_outputs)]
        seqs: list[list] = [[] for _ in st]
        for t in range(T):
            res = [np.broadcast_to(np.asarray(r, dtype=np.float64), shape) for r in self.fn(*(x[t] for x in xs), *st, *pr)]
            for i in range(self.n_outputs):
                outs[i].append(res[i])
            st = res[self.n_outputs:]
            for i, s in enumerate(st):
                seqs[i].append(s)
        dtype = inputs[0].dtype
        stack = lambda a: torch.as_tensor(np.stack(a) if a else np.zeros((0, *shape))).to(dtype)  # noqa: E731
        return RunResult([stack(o) for o in outs], [torch.as_tensor(np.array(s)).to(dtype) for s in st],
                         [stack(q) for q in seqs] if store_seqs else None)


class NumpyBackend:
    name = "numpy"

    def available(self):
        return True

    def accepts(self, inputs):
        return False  # only when asked for by name

    def version(self):
        return np.__version__

    def emit(self, ir):
        return Artefact("numpy", emit_numpy(ir), {"outputs": [n for n, _ in ir.step.outputs]})

    def load(self, artefact, key):
        module = load_module("numpytest", key, artefact.source)
        return NumpyProgram(module.step, len(artefact.meta["outputs"]))


@pytest.fixture
def numpy_backend():
    backends.register("numpy", NumpyBackend())
    yield
    backends._FACTORIES.pop("numpy", None)
    backends._LOADED.pop("numpy", None)


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
    with pytest.raises(flexdsl.FlexDSLError, match="auto, triton, cpu, torch"):
        flexdsl.load("lif", backend="cuda-c")


def test_a_code_printing_backend_keeps_its_spellings_in_its_own_module():
    """A new target's printer names its spellings in its own `SPELL` table (no catalog edit);
    a spelling it lacks is a clear error when the class is defined, naming the function."""
    import sympy as sp

    from flexdsl.backends.printer import BasePrinter
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
