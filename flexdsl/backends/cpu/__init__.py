"""The CPU backend: C++ kernels generated from the step and its symbolic backward, built once
per model with the C++ compiler PyTorch uses (OpenMP over lanes, the time loop inside), run on
tensors' data pointers through custom ops (one graph node for torch.compile).

`emit.py` prints the kernels (`templates/kernels.cpp.j2`, sympy's C++ printer), `build.py`
compiles and caches the library, `launch.py` runs it (`CpuProgram`: custom ops, autograd).
`backend="auto"` picks it for float32 and float64 CPU tensors where a compiler is found (else,
with one warning, the torch backend's loop); `backend="cpu"` asks for it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ...store.generated import load_module
from ..base import IR, Artefact, Capabilities, ScanSpec, transformed
from . import build
from .abi import CpuABI
from .launch import CALLS, DTYPES, CpuProgram

_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(f"flexdsl: {msg}", RuntimeWarning, stacklevel=4)


class CpuBackend:
    name = "cpu"
    title = "the generated C++ kernels of the CPU backend (forward, backward)"  # (what `flexdsl show --cpu` prints)
    capabilities = Capabilities(devices=("cpu",), dtypes=("float32", "float64"), scans=True)

    def refusal(self, x: torch.Tensor) -> tuple[str, str] | None:
        """Why a layer's scan cannot run on inputs like `x` here ((message, hint)), or None."""
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
            return (f"backend='cpu' runs float32 and float64 CPU tensors, but the input is {x.dtype} on {x.device}",
                    "use backend='auto' (the scan that fits the input) or backend='torch'")
        return None

    def load_scan(self, spec: ScanSpec, key: str) -> Any:
        """The layer scan on the model's C++ kernels (None where they could not be built: the
        layer runs the reference backend's scan)."""
        from .recurrent import load_recurrent

        return load_recurrent(self, spec, key)

    def available(self) -> bool:
        return build.why_unavailable() is None

    def why_unavailable(self) -> str | None:
        return build.why_unavailable()

    def accepts(self, inputs: Sequence[torch.Tensor]) -> bool:
        x0 = inputs[0]
        if x0.device.type != "cpu" or x0.dtype not in DTYPES or (
                not torch.compiler.is_compiling() and any(transformed(x) for x in inputs)):
            return False
        why = build.why_unavailable()
        if why is not None and not build.disabled():
            _warn_once(f"{why}: CPU neurons run on the torch backend's step-by-step loop (set CXX to a C++ "
                       "compiler for the compiled CPU kernels)")
        return True

    def version(self) -> str:
        return build.version()

    def emit(self, ir: IR) -> Artefact:
        from ..torch.emit import emit_core
        from .emit import emit

        source, abi = emit(ir)
        step = ir.step
        torch_meta = {"name": step.name, "inputs": [s.name for s in step.inputs],
                      "states": [s.name for s in step.states], "params": [p.name for p in step.params],
                      "outputs": [n for n, _ in step.outputs], "derived": [p.name for p in step.params if p.derived]}
        return Artefact("cpu", source, {"abi": abi.to_dict(), "torch_source": emit_core(step),
                                        "torch_meta": torch_meta, "filename": step.checked.filename})

    def load(self, artefact: Artefact, key: str) -> CpuProgram:
        from ..torch import TorchProgram

        meta = artefact.meta
        abi = CpuABI.from_dict(meta["abi"])
        fallback = TorchProgram(load_module("cpufallback", key, meta["torch_source"]), meta["torch_meta"],
                                key, meta["torch_source"])
        try:
            lib, openmp = build.library(artefact.source, abi.name, str(meta.get("filename", abi.name)))
        except build.BuildError as e:
            _warn_once(f"the CPU kernels of {abi.name} could not be built ({e.reason.splitlines()[0]}); it runs "
                       "on the torch backend's loop")
            return CpuProgram(None, False, abi, key, fallback, str(e))
        return CpuProgram(lib, openmp, abi, key, fallback)


__all__ = ["CpuBackend", "CpuProgram", "CALLS"]
