"""The torch backend: the generated single-step `core`, run step by step with autograd.

It runs everywhere (CPU, CUDA, any float dtype, float64 included) and is the reference the
other backends are tested against. The multi-step loop calls `core` on `x.unbind(0)`, so a
call of T steps does O(T) work in forward and backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from ...store.generated import load_module
from ..base import ANY, IR, Artefact, Capabilities, NoiseKey, RunResult, ScanSpec, key_tensor
from ..random import NoiseStream
from .scan import ScanOps


class TorchProgram:
    computes_in = None  # the inputs' dtype

    def __init__(self, module: ModuleType, meta: dict[str, Any], key: str = "", source: str = "") -> None:
        self.module = module
        self.source = source
        self.core = module.core
        self.key = key
        self.name = str(meta.get("name", "neuron"))
        self.n_outputs = len(meta["outputs"])
        self.n_inputs = len(meta["inputs"])
        self.n_states = len(meta["states"])
        self.draws = int(meta.get("draws", 0))  # random draws per step and element (0: no noise)
        self.ops: ScanOps | None = None  # the time loop as custom ops (made by `prepare_trace`)

    def prepare_trace(self, ir: IR) -> None:
        """Before a torch.compile trace (outside it): the custom ops that make the time loop one
        graph node, with the derived backward printed from the model's symbolic VJP."""
        if self.ops is not None:
            return
        from .emit import emit_core_backward

        step = ir.step
        mod = load_module("torchscan", self.key, self.source + emit_core_backward(step, ir.backward))
        ns = f"flexdsl_{''.join(ch for ch in self.name.lower() if ch.isascii() and ch.isalnum())[:24]}_{self.key[:16]}"
        self.ops = ScanOps(ns, self.loop, mod.core_backward, self.n_inputs, self.n_states, self.n_outputs,
                           [p.learnable for p in step.params], self.stream if self.draws else None)

    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool, noise: NoiseKey | None = None) -> RunResult:
        if self.ops is not None and torch.compiler.is_compiling():
            return self._run_op(inputs, states, params, store_seqs, noise)
        outs, fins, seqs, _ = self.loop(inputs, states, params, store_seqs, False, noise)
        return RunResult(outs, fins, seqs if store_seqs else None)

    def stream(self, noise: NoiseKey | None, T: int, shape, dtype: torch.dtype, device: torch.device
               ) -> NoiseStream | None:
        """The draws of a call (None for a model without noise)."""
        if not self.draws:
            return None
        if noise is None:
            raise ValueError(f"{self.name} draws random numbers: its program needs the call's NoiseKey")
        return NoiseStream(noise.seed, noise.t0, tuple(shape), dtype, device, T)

    def _run_op(self, inputs, states, params, store_seqs: bool, noise: Any = None) -> RunResult:
        """The traced call: one custom op (its autograd formula is the derived backward)."""
        assert self.ops is not None
        x0 = inputs[0]
        shape = x0.shape[1:] if len(inputs) == 1 else torch.broadcast_shapes(*(x.shape[1:] for x in inputs))
        prm = [p if isinstance(p, torch.Tensor) else torch.tensor(float(p), dtype=torch.float64, device=x0.device)
               for p in params]
        st = [_state(s, shape, x0.dtype, x0.device) for s in states]
        grad = torch.is_grad_enabled()
        save = grad and any(t.requires_grad for t in [*inputs, *st, *prm])
        key = key_tensor(noise)
        res = self.ops.fwd(list(inputs), st, prm, bool(store_seqs), save, *([key] if key is not None else []))
        n_out, n_st = self.n_outputs, self.n_states
        return RunResult(list(res[:n_out]), list(res[n_out:n_out + n_st]),
                         list(res[n_out + n_st:n_out + 2 * n_st]) if store_seqs else None)

    def loop(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], store_seqs: bool,
             keep_prev: bool, noise: NoiseKey | None = None) -> tuple[list, list, list, list]:
        """`core` over the T steps: (outputs [T, *shape], final states, state sequences (with
        `store_seqs`), the state before each step (with `keep_prev`)); `noise` keys the draws."""
        x0 = inputs[0]
        T, dtype = x0.shape[0], x0.dtype
        shape = x0.shape[1:] if len(inputs) == 1 else torch.broadcast_shapes(*(x.shape[1:] for x in inputs))
        prm = [p if isinstance(p, torch.Tensor) else torch.tensor(float(p), dtype=torch.float64) for p in params]
        st = [_state(s, shape, dtype, x0.device) for s in states]
        n_out = self.n_outputs
        outs: list[list[torch.Tensor]] = [[] for _ in range(n_out)]
        seqs: list[list[torch.Tensor]] = [[] for _ in st]
        prevs: list[list[torch.Tensor]] = [[] for _ in st]
        steps = list(zip(*(x.unbind(0) for x in inputs)))
        core = self.core
        stream = self.stream(noise, T, shape, dtype, x0.device)
        extra: list[Any] = []
        for t, xs in enumerate(steps):
            if keep_prev:
                for i, s in enumerate(st):
                    prevs[i].append(s)
            if stream is not None:
                extra = [stream.at(t)]
            res = core(*xs, *st, *prm, *extra)
            res = [r if isinstance(r, torch.Tensor) else _full(shape, r, dtype, x0.device) for r in res]
            res = [r.to(dtype) if r.dtype != dtype else r for r in res]
            for i in range(n_out):
                outs[i].append(res[i])
            st = res[n_out:]
            if store_seqs:
                for i, s in enumerate(st):
                    seqs[i].append(s)
        if T == 0:
            # no step: outputs [0, *shape] (the inputs' broadcast step shape) and the initial states,
            # joined to the graph of every input, state and param (with zero gradients), as a
            # step would be and as the other backends are
            z = x0.new_zeros(())
            for t in (*inputs, *st, *prm):
                if t.requires_grad:
                    z = z + t.reshape(-1)[:0].sum()  # (exactly 0 whatever t holds; its gradient is 0)
            empty = x0.new_zeros((0, *shape)) + z
            return ([empty.clone() for _ in range(n_out)], [s.expand(shape).to(dtype) + z for s in st],
                    [empty.clone() for _ in st], [empty.clone() for _ in st])
        return ([_stack(o, shape) for o in outs], list(st), [_stack(s, shape) for s in seqs] if store_seqs else [],
                [_stack(s, shape) for s in prevs] if keep_prev else [])


def _state(s: Any, shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A state as the step starts from it, in the call's dtype: a float16 state kept from an
    earlier call must not make a float32 call compute `a * v` in float16 (a 0-d param does not
    promote it), as the other backends compute in the call's precision. A 0-d state (an initial
    value computed from tensor params, as under torch.compile) is broadcast to the step's shape:
    a 0-d float32 state with a 0-d float64 param would make `v - E_L` a float64 operation, where a
    float state computes it in float32."""
    if not isinstance(s, torch.Tensor):
        return torch.full(shape, float(s), dtype=dtype, device=device)
    s = s if s.dtype == dtype else s.to(dtype)
    return s.expand(shape) if s.dim() == 0 else s


def _full(shape, value, dtype: torch.dtype, device) -> torch.Tensor:
    """A constant result, rounded to `dtype` as a computed one would be (1e300 is inf in float32,
    as in the other backends; the module refuses such a model before a call)."""
    v = float(value)
    if abs(v) > torch.finfo(dtype).max:
        v = math.copysign(math.inf, v)
    return torch.full(shape, v, dtype=dtype, device=device)


def _stack(seq: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """[T, *shape] from the steps' values (a value that does not depend on the inputs may have a
    smaller, broadcastable shape, e.g. a constant output)."""
    if all(t.shape == shape for t in seq):
        return torch.stack(seq)
    common = torch.broadcast_shapes(shape, *(t.shape for t in seq))
    return torch.stack([t.expand(common) for t in seq])


class TorchBackend:
    name = "torch"
    title = "the generated PyTorch single-step core"  # (what `flexdsl show --torch` prints)
    docs_title = 'PyTorch core (backend="torch")'  # (a model page shows this backend's code)
    capabilities = Capabilities(devices=(ANY,), dtypes=(ANY,), scans=True)  # (everywhere, every float dtype)

    def available(self) -> bool:
        return True

    def accepts(self, inputs: Sequence[torch.Tensor]) -> bool:
        return True

    def version(self) -> str:
        return ""  # the generated source does not depend on the torch version

    def emit(self, ir: IR) -> Artefact:
        from ..._sympy import load as sympy_ready

        sympy_ready()  # (before the emitter's modules import it: one thread at a time)
        from .emit import emit_core


        step = ir.step
        meta = {"name": step.name, "inputs": [s.name for s in step.inputs], "states": [s.name for s in step.states],
                "params": [p.name for p in step.params], "outputs": [n for n, _ in step.outputs],
                "derived": [p.name for p in step.params if p.derived]}
        if step.draws:
            meta["draws"] = step.draws
        return Artefact("torch", emit_core(step), meta)

    def load(self, artefact: Artefact, key: str) -> TorchProgram:
        return TorchProgram(load_module("torch", key, artefact.source), artefact.meta, key, artefact.source)

    def load_scan(self, spec: ScanSpec, key: str) -> Any:
        """The layer scan: the step and its derived backward printed from the schedule."""
        from .recurrent import load_recurrent

        return load_recurrent(spec.ir, key, spec.port, spec.source, spec.dense)

    def load_eprop(self, ir: IR, key: str, port: int) -> Any:
        """The e-prop step of a model (`backends/eprop.py`): one step and its eligibility factors."""
        from .eprop import load_eprop

        return load_eprop(ir, key, port)

    def backward_source(self, step: Any, backward: Any) -> str:
        """`core_backward`, the derived VJP of one step as torch code (appended to `core`'s module:
        `Compiled.torch_backward`)."""
        from .emit import emit_core_backward

        return emit_core_backward(step, backward)


__all__ = ["TorchBackend", "TorchProgram"]
