"""The back half's interfaces: every printer covers every built-in function, the registries
agree, and a new backend is one module plus a registry entry (a toy backend that runs the
torch source through NumPy, defined here, gives the torch backend's results)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import sympy as sp
import torch

import flexdsl
from flexdsl import backends
from flexdsl.backends.base import RunResult
from flexdsl.backends.torch.emit import TorchPrinter
from flexdsl.backends.triton.emit import HostPrinter, TritonPrinter
from flexdsl.frontend.catalog import ALL_FUNCTIONS, METHODS, SURROGATES
from flexdsl.ir.functions import SYMPY
from flexdsl.ir.integrate import INTEGRATORS
from flexdsl.ir.surrogates import BUILTIN_SURROGATES
from flexdsl.store.cache import Artefact

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


# ------------------------------------------------------------------ a toy backend: torch source on NumPy
class _NumpyTorch(types.SimpleNamespace):
    """The torch functions the generated core calls, on NumPy arrays."""


_np_torch = _NumpyTorch(exp=np.exp, log=np.log, sqrt=np.sqrt, abs=np.abs, sin=np.sin, cos=np.cos, tanh=np.tanh,
                        sigmoid=lambda x: 1 / (1 + np.exp(-x)), relu=lambda x: np.maximum(x, 0), sign=np.sign)
_np_ops = types.SimpleNamespace(
    fire_ge=lambda u, sg, args: (u >= 0).astype(u.dtype), fire_gt=lambda u, sg, args: (u > 0).astype(u.dtype),
    heaviside=lambda u: np.where(u >= 0, 1.0, 0.0), minimum=np.minimum, maximum=np.maximum,
    clip=np.clip, where=np.where, detach=lambda x: x)


class NumpyProgram:
    def __init__(self, source: str) -> None:
        ns: dict = {"torch": _np_torch, "ops": _np_ops}
        # the torch backend's source, its imports replaced by NumPy stand-ins
        body = source.replace("import torch\n", "").replace("from flexdsl.backends.torch import ops\n", "")
        exec(compile(body, "<numpy backend>", "exec"), ns)  # noqa: S102
        self.core = ns["core"]

    def run(self, inputs, states, params, *, store_seqs):
        xs = [x.detach().double().numpy() for x in inputs]
        shape = xs[0].shape[1:]
        st = [s.detach().double().numpy() if isinstance(s, torch.Tensor) else np.full(shape, float(s))
              for s in states]
        pr = [p.detach().double().numpy() if isinstance(p, torch.Tensor) else float(p) for p in params]
        outs, seqs = [], []
        n_st = len(st)
        for t in range(xs[0].shape[0]):
            res = self.core(*(x[t] for x in xs), *st, *pr)
            outs.append(res[: len(res) - n_st])
            st = list(res[len(res) - n_st:])
            seqs.append(st)
        dtype = inputs[0].dtype
        to = lambda a: torch.as_tensor(np.asarray(a)).to(dtype)  # noqa: E731
        outputs = [to(np.stack([o[i] for o in outs])) for i in range(len(outs[0]))]
        return RunResult(outputs, [to(s) for s in st],
                         [to(np.stack([s[i] for s in seqs])) for i in range(n_st)] if store_seqs else None)


class NumpyBackend:
    name = "numpy"

    def available(self):
        return True

    def accepts(self, inputs):
        return False  # only when asked for by name

    def version(self):
        return np.__version__

    def emit(self, ir):
        return Artefact("numpy", backends.get("torch").emit(ir).source)

    def load(self, artefact, key):
        return NumpyProgram(artefact.source)


@pytest.mark.parametrize("name", ["lif", "izhikevich", "cuba_lif", "alif"])
def test_toy_backend_is_a_module_plus_a_registry_entry(name):
    backends.register("numpy", NumpyBackend())
    try:
        x = torch.rand(12, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 4
        m_np = flexdsl.load(name, backend="numpy", store_state_seqs=True)
        m_t = flexdsl.load(name, backend="torch", store_state_seqs=True)
        a, b = m_np(x), m_t(x)
        for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.allclose(u, v, rtol=1e-12, atol=1e-12)
        for s in m_t.state_seqs:
            assert torch.allclose(m_np.state_seqs[s], m_t.state_seqs[s], rtol=1e-12, atol=1e-12)
    finally:
        backends._FACTORIES.pop("numpy", None)
        backends._LOADED.pop("numpy", None)


def test_unknown_backend_lists_the_registry():
    with pytest.raises(flexdsl.FlexDSLError, match="auto, triton, torch"):
        flexdsl.load("lif", backend="cuda-c")


def test_a_code_printing_backend_keeps_its_spellings_in_its_own_module():
    """A new target's printer names its spellings in its own `SPELL` table (no catalog edit);
    a spelling it lacks is a clear error when the class is defined, naming the function."""
    import sympy as sp

    from flexdsl.backends.printing import BasePrinter
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
