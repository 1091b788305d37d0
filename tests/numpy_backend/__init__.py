"""A NumPy backend, as a new backend is written: one folder and one registry line
(`backends.register("numpy", NumpyBackend())`, in tests/conftest.py's `numpy_backend` fixture).

`printer.py` spells every built-in function (a `BasePrinter` with its `SPELL` table) and the
draws; `emit.py` prints one module per model from the IR's schedule (the step, its invariants and
its derived backward); `program.py` runs a neuron call (forward, and the derived backward as its
autograd gradient; a noisy model's draws through flexdsl's Philox, `noise.py`); `scan.py` runs a
recurrent layer's scan (forward and backpropagation through time). It computes in float64 and
declares what it does in its `capabilities`: CPU tensors of float32 and float64, computed in
float64, training, noise and layer scans, not torch.compile (its loops are NumPy, no custom op).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flexdsl.backends.base import Capabilities, ScanSpec
from flexdsl.store import cache
from flexdsl.store.cache import Artefact
from flexdsl.store.generated import load_module

from .emit import emit
from .program import NumpyProgram
from .scan import NumpyScan


class NumpyBackend:
    name = "numpy"
    title = "the generated NumPy step (forward, derived backward)"
    capabilities = Capabilities(devices=("cpu",), dtypes=("float64", "float32"), computes_in="float64",
                                scans=True, compile=False)

    def available(self) -> bool:
        return True

    def accepts(self, inputs: Any) -> bool:
        return False  # only when asked for by name

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def emit(self, ir: Any) -> Artefact:
        return Artefact("numpy", *emit(ir))

    def load(self, artefact: Artefact, key: str) -> NumpyProgram:
        return NumpyProgram(load_module("numpytest", key, artefact.source), artefact.meta)

    def load_scan(self, spec: ScanSpec, key: str) -> NumpyScan:
        art = cache.get_or_make(key, lambda: Artefact("numpyscan", *emit(spec.ir)))
        return NumpyScan(load_module("numpyscan", key, art.source), art.meta, spec.port, spec.source, spec.dense)


__all__ = ["NumpyBackend", "NumpyProgram", "NumpyScan"]
