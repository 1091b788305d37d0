"""Small inference calls of a recurrent layer replayed from CUDA graphs.

A layer's call launches some 30 GPU operations (conversions, the input product, allocations,
the scan), each costing the host 10-40 us: for small layers (the SHD-shaped H = 256, T = 100,
B = 64 runs ~0.4 ms on the GPU) the host's work is most of the call. Where a call needs no
gradient, the same launches are captured once per call signature into two CUDA graphs and
replayed:

    g1: the exactness checks of the input and of the feedback (`_Guess`'s conversions)
        -> the host copies their verdicts and records an event
    g2: the input product and the scan
    -> the host waits for the event only (the verdicts), clones the outputs

A graph replays exactly the kernels the eager call launches, on the same values, so its
results are the eager call's, bit for bit. The key (`graph_key`) holds all that the captured
launches depend on: shapes, dtypes, the float values of states and params, the settings, the
stream, and the address of every tensor the graph reads in place (the weights, tensor
params); the call's own tensors (input, feedback, other inputs, state tensors) are copied into
the graph's static buffers first. A key seen once runs eagerly (it compiles the kernels); the
second time it is captured (at most `CAPTURES` times a program: signatures that keep changing
run eagerly). If the verdicts say "not exact", the call runs eagerly, checked
first, as without graphs. Off with FLEXDSL_RECURRENT_GRAPHS=0; only for layers of at most
`MAX_ELEMENTS` values per output and input (larger calls keep the GPU busy while the host
prepares: a graph would add the copies and save nothing).
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..settings import CHOICES, INTS, env_choice

MAX_ELEMENTS = 1 << 23  # T * B * H and T * B * F at most (a graph's buffers: ~8 such values a element)
KEEP = 4  # graphs kept per program (the least recently used dropped)
CAPTURES = 16  # captures per program at most (then eagerly: call signatures that keep changing)
# other threads' CUDA calls (a DataLoader's pinning thread) are not restricted while this one captures
MODE = "thread_local"


def tracks_grad(tensors: Iterable[torch.Tensor | None]) -> bool:
    """Whether autograd records a call on these tensors (grad mode on and one of them requires a
    gradient): a Function's `needs_input_grad` says so even under no_grad."""
    if torch.is_grad_enabled():
        for t in tensors:  # (a loop, not a generator: no Python call per tensor, on every layer call)
            if t is not None and t.requires_grad:
                return True
    return False


def eligible(prog: Any, x: torch.Tensor, tensors: Iterable[torch.Tensor], noise: Any, hidden: int) -> bool:
    """Whether this call may replay a graph: a Triton program on CUDA, no gradient wanted, no
    noise, no autocast, small, not turned off, and the program not checking first."""
    if not (x.is_cuda and getattr(prog, "fused_products", False)) or noise is not None:
        return False
    if getattr(prog, "check_first", False) or getattr(prog, "graphs_off", False):
        return False
    if env_choice("FLEXDSL_RECURRENT_GRAPHS") == "0" or torch.is_autocast_enabled("cuda"):
        return False
    if tracks_grad(tensors):
        return False
    if x.dim() != 3:
        return False
    T, B, F = x.shape
    return 0 < T * B * max(F, hidden) <= MAX_ELEMENTS


def _bits(v: float) -> bytes:
    return struct.pack("d", float(v))


def _pinned(t: torch.Tensor) -> tuple:
    """What a graph reading `t` in place depends on: its address and layout."""
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


def _copied(t: Any) -> tuple:
    """What a graph copying `t` into its static buffer depends on (not its address)."""
    if isinstance(t, torch.Tensor):
        return ("t", tuple(t.shape), t.dtype)
    return ("f", None if t is None else _bits(t))


def graph_key(x: torch.Tensor, w_in: torch.Tensor | None, b: torch.Tensor | None, w: torch.Tensor,
              s0: torch.Tensor, s0_zero: bool, inputs: Sequence[Any], states: Sequence[Any],
              params: Sequence[Any], dense: bool) -> tuple:
    """All that a captured call depends on besides the values of its copied tensors."""
    env = tuple(os.environ.get(n) for n in _SETTINGS)
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None
    mode = torch.is_inference_mode_enabled()  # (inference tensors: the static buffers of one mode only)
    return (tuple(x.shape), x.dtype, x.device, stream, env, mode, dense, s0_zero, tuple(s0.shape), s0.dtype,
            None if w_in is None else _pinned(w_in), None if b is None else _pinned(b), _pinned(w),
            tuple(_copied(v) for v in inputs), tuple(_copied(v) for v in states),
            tuple(_pinned(p) if isinstance(p, torch.Tensor) else ("f", _bits(p)) for p in params))


_SETTINGS = tuple(sorted(n for n in (*INTS, *CHOICES) if n.startswith("FLEXDSL_"))) + (
    "FLEXDSL_RECURRENT_TILE", "FLEXDSL_PRODUCT_TILE")


class Replay:
    """One captured call: the static copies of its own tensors, the two graphs, the verdicts'
    buffers and the static outputs (one call at a time: a lock)."""

    def __init__(self, x: torch.Tensor, s0: torch.Tensor | None, inputs: list, states: list) -> None:
        self.x, self.s0, self.inputs, self.states = x, s0, inputs, states
        self.g1: torch.cuda.CUDAGraph | None = None
        self.g2 = torch.cuda.CUDAGraph()
        self.flags: torch.Tensor | None = None
        self.host: torch.Tensor | None = None
        self.outs: tuple = ()
        self.lock = threading.Lock()

    def run(self, x: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any], states: Sequence[Any]
            ) -> list[torch.Tensor] | None:
        """Clones of the outputs for this call's values, or None where the verdicts say a checked
        value was not exact."""
        with self.lock:
            self.x.copy_(x)
            if self.s0 is not None:
                self.s0.copy_(s0)
            for d, v in zip((*self.inputs, *self.states), (*inputs, *states)):
                if isinstance(d, torch.Tensor):
                    d.copy_(v)
            event = None
            if self.g1 is not None and self.flags is not None and self.host is not None:
                self.g1.replay()
                self.host.copy_(self.flags, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            self.g2.replay()
            if event is not None:
                event.synchronize()
                if any(self.host.tolist()):  # type: ignore[union-attr]
                    return None
            return [o.clone() for o in self.outs]


def replay(prog: Any, key: tuple, x: torch.Tensor, s0: torch.Tensor, s0_zero: bool, inputs: Sequence[Any],
           states: Sequence[Any], checks: bool, convert: Callable, compute: Callable) -> list[torch.Tensor] | None:
    """The call's outputs from its graph (captured now if the key was seen before), or None: run
    it eagerly (a first sight of the key, a capture that failed; verdicts that were not exact:
    then the program checks first from now on, as eagerly). `convert(x, s0)` launches the checks
    where `checks` (-> (the verdicts, what `compute` takes)); `compute(x, s0, inputs, states,
    converted)` launches the rest (-> the outputs); s0 is None where it is known to be zeros."""
    graphs: OrderedDict = prog.__dict__.setdefault("_graphs", OrderedDict())
    seen: OrderedDict = prog.__dict__.setdefault("_graphs_seen", OrderedDict())
    rep = graphs.get(key)
    if rep is None:
        if key not in seen:
            seen[key] = True
            while len(seen) > 4 * KEEP:
                seen.popitem(last=False)
            return None
        if prog.__dict__.get("_graphs_made", 0) >= CAPTURES:
            prog.graphs_off = True
            return None
        prog.__dict__["_graphs_made"] = prog.__dict__.get("_graphs_made", 0) + 1
        try:
            rep = _capture(x, s0, s0_zero, inputs, states, checks, convert, compute)
        except (RuntimeError, AssertionError, TypeError):  # (a capture refused here: eagerly from now on)
            prog.graphs_off = True
            return None
        graphs[key] = rep
        while len(graphs) > KEEP:
            graphs.popitem(last=False)
    graphs.move_to_end(key)
    outs = rep.run(x, s0, inputs, states)
    if outs is None:
        graphs.pop(key, None)
        prog.check_first = True
    return outs


def _capture(x, s0, s0_zero, inputs, states, checks, convert, compute) -> Replay:
    rep = Replay(x.contiguous().clone(), None if s0_zero else s0.clone(),
                 [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs],
                 [v.clone() if isinstance(v, torch.Tensor) else v for v in states])
    dev = x.device

    def s0_of() -> torch.Tensor:
        return torch.zeros_like(s0) if rep.s0 is None else rep.s0

    # warm-up on the static buffers, on a side stream (the kernels compiled for their
    # specialisations, cuBLAS's workspace set up), as torch.cuda.graphs asks
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        compute(rep.x, s0_of(), rep.inputs, rep.states, convert(rep.x, rep.s0)[1])
    torch.cuda.current_stream(dev).wait_stream(side)
    pool = torch.cuda.graph_pool_handle()
    conv: Any = (None, None)
    if checks:
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1, pool=pool, capture_error_mode=MODE):
            flags, conv = convert(rep.x, rep.s0)
        rep.g1, rep.flags = g1, flags
        rep.host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
    else:
        conv = convert(rep.x, rep.s0)[1]  # (nothing launched)
    with torch.cuda.graph(rep.g2, pool=pool, capture_error_mode=MODE):
        rep.outs = tuple(compute(rep.x, s0_of(), rep.inputs, rep.states, conv))
    return rep


__all__ = ["tracks_grad", "eligible", "graph_key", "replay", "MAX_ELEMENTS", "Replay"]
