"""The Triton backend: generated multi-step scan kernels (forward and derived backward).

`emit.py` prints the kernels from the schedule into templates (`templates/*.j2`), `abi.py`
describes their arguments once for the emitter and the launcher, `launch.py` runs them
(custom ops for torch.compile, autograd, launch heuristics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...store.generated import load_module
from ..base import IR, Artefact, Capabilities, ScanSpec, transformed
from .abi import KernelABI
from .launch import LAUNCHES, TritonProgram

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TritonBackend:
    name = "triton"
    title = "the generated Triton kernels (inference/training forward, backward)"  # (what `flexdsl show --triton` prints)
    docs_title = 'Triton kernels (backend="triton")'  # (a model page shows this backend's code)

    def refusal(self, x: torch.Tensor) -> tuple[str, str] | None:
        """Why a layer's scan cannot run on inputs like `x` here ((message, hint)), or None."""
        from .kernel import interpret

        if not x.is_cuda and not interpret():
            return (f"backend='triton' runs on CUDA tensors, but the input is on {x.device}",
                    "use backend='auto' (the torch path on the CPU), move the layer and the input to a GPU, or set "
                    "TRITON_INTERPRET=1 before importing flexdsl")
        if x.dtype not in DTYPES:
            return f"the Triton kernels take float32, float16 or bfloat16, not {x.dtype}", "use backend='torch' for float64"
        return None

    def __init__(self) -> None:
        self._available: bool | None = None

    @property
    def capabilities(self) -> Capabilities:
        """CUDA tensors (and CPU ones through Triton's interpreter, TRITON_INTERPRET=1) of the
        kernel dtypes, computed in float32."""
        from .kernel import interpret

        return Capabilities(devices=("cuda", "cpu") if interpret() else ("cuda",),
                            dtypes=tuple(str(d).removeprefix("torch.") for d in DTYPES), computes_in="float32",
                            scans=True, delays=True, eprop=True, plastic=True, sparse=True)

    def delay_product(self, hist: torch.Tensor, d: torch.Tensor, a: torch.Tensor, c: torch.Tensor | None,
                      D: int) -> torch.Tensor:
        """A synapse group's current over sparse whole-step delays (`delays.py`)."""
        from .delays import delay_product

        return delay_product(hist, d, a, c, D)

    def delay_spread(self, hist: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
        """Per-element relaxed delays: `out[t, ..., c] = sum_k taps[c, k] hist[D + t - k, ..., c]` (`delays.py`)."""
        from .delays import delay_spread

        return delay_spread(hist, taps)

    def delay_gauss(self, hist: torch.Tensor, w: torch.Tensor, d: torch.Tensor, coef: float, D: int,
                    past: int) -> torch.Tensor:
        """Learnable gauss synaptic delays: `out[t, ..., i] = sum_k sum_j w[i, j] g_k(d[i, j]) hist[past + t - k,
        ..., j]` (steps before the history's first 0), the taps made in the kernels (`dense_delays.py`)."""
        from .dense_delays import delay_gauss

        return delay_gauss(hist, w, d, coef, D, past)

    def eprop_walk(self, *args: Any) -> Any:
        """e-prop's per-synapse eligibility and gradients of a call (`eprop.py`)."""
        from .eprop import walk

        return walk(*args)

    def plastic_program(self, ir: Any, key: str, rule_ir: Any, rule_key: str, port: int, source: int,
                        like: torch.Tensor) -> Any:
        """The online plastic layer's kernel (`plastic.py`), or None for tensors it cannot run on."""
        from .launch import interpret
        from .plastic import program

        if not (like.is_cuda or interpret()):
            return None
        return program(ir, key, rule_ir, rule_key, port, source)

    def sparse_ops(self) -> Any:
        """Sparse inputs' products and the fused sparse-input kernel (`sparse.py`)."""
        from . import sparse

        return sparse

    def load_scan(self, spec: ScanSpec, key: str) -> Any:
        """The layer scan: a persistent kernel per direction (`templates/recurrent.py.j2`)."""
        from .recurrent import load_recurrent

        return load_recurrent(spec.ir, key, spec.port, spec.source, spec.dense)

    def available(self) -> bool:
        if self._available is None:
            try:
                import triton  # noqa: F401

                self._available = True
            except Exception:
                self._available = False
        return self._available

    def accepts(self, inputs: Sequence[torch.Tensor]) -> bool:
        x0 = inputs[0]
        return x0.is_cuda and x0.dtype in DTYPES and (torch.compiler.is_compiling()
                                                      or not any(transformed(x) for x in inputs))

    def version(self) -> str:
        from .cost import chunk_sizes

        try:
            import triton

            return f"triton {triton.__version__}, torch {torch.__version__}, chunks {chunk_sizes()}"
        except Exception:
            return f"no triton, torch {torch.__version__}, chunks {chunk_sizes()}"

    def emit(self, ir: IR) -> Artefact:
        from ..._sympy import load as sympy_ready

        sympy_ready()  # (before the emitter's modules import it: one thread at a time)
        from .emit import emit


        source, abi = emit(ir)
        return Artefact("triton", source, {"abi": abi.to_dict()})

    def load(self, artefact: Artefact, key: str) -> TritonProgram:
        mod = load_module("triton", key, artefact.source)
        return TritonProgram(mod, KernelABI.from_dict(artefact.meta["abi"]), key)


__all__ = ["TritonBackend", "TritonProgram", "LAUNCHES", "DTYPES"]
