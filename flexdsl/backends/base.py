"""The backend interface: what every backend implements, and what the module calls.

A backend turns the compiled model (`IR`, `store/pipeline.py`: the checked model, the step, its
backward and their schedule, each computed on first use) into an `Artefact` (readable source
plus metadata; kept in the store's disk cache), loads an artefact into a `Program`, and a program
runs a multi-step call with explicit states and params:

    art = backend.emit(ir)                       # once per model (then from the disk cache)
    prog = backend.load(art, key)                # once per process
    res = prog.run(inputs, states, params, store_seqs=False)   # noise=NoiseKey(seed, t0) for a noisy model

`inputs` are tensors `[T, *shape]`; `states` and `params` are, in declaration order, tensors
(broadcastable to the step's shape) or Python floats; the derived params (`ir/host.py`) come
after the declared ones, computed by the runtime. `run` never reads or writes module state:
`NeuronModule` passes everything and keeps what comes back. A backend emits only its own code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..store.cache import Artefact
from ..store.pipeline import IR

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class NoiseKey:
    """What the random draws of a call depend on besides the step and the element: the generator's
    64-bit `seed` and `t0`, the step of the key that the call's first step is (its steps are t0,
    t0 + 1, ...). Draw k of step t of element i is the same on every backend (the counter-based
    generator of `backends/random.py`)."""

    seed: int
    t0: int = 0


@dataclass(frozen=True)
class ScanSpec:
    """What a backend's layer scan is made from (`Backend.load_scan`): the layer's scan stage
    product (`ir/layer.py` `LayerIR.scan`): the neuron's compiled model, the input (`port`, an
    index into the model's inputs) that receives the fed-back current, the output fed back
    (`source`, an index into its outputs, delivered one step late) and the feedback's
    connectivity (`dense`: `[H, H]` weights, else one weight per neuron `[H]`)."""

    ir: IR
    port: int
    source: int
    dense: bool


ANY = "*"  # (in `Capabilities.devices` / `dtypes`: every device type / every floating dtype)


@dataclass(frozen=True)
class Capabilities:
    """What a backend declares it can do; the runtime, CLI and docs read this, never a backend's
    name. `dtypes` by torch name ("float32"...), `devices` by torch device type ("cpu", "cuda");
    `ANY` in either: all of them."""

    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    computes_in: str | None = None  # the precision a call computes in when not the inputs' (None: theirs)
    training: bool = True
    noise: bool = True
    scans: bool = False  # layer scans (`load_scan`)
    compile: bool = True  # runs under torch.compile (its time loop one custom-op pair)
    delays: bool = False  # delays in kernels (`delay_product(hist, d, a, c, D)`, `delay_spread(hist, taps)`, `delay_gauss(hist, w, d, coef, D, past)`)
    eprop: bool = False  # e-prop's per-synapse traces in a kernel (`eprop_walk(eps, J, b, x, s, one, A, Lg, zero)`)
    plastic: bool = False  # an online plastic layer's call in one kernel (`plastic_program(ir, key, rule_ir, ...)`)
    sparse: bool = False  # products from sparse inputs' nonzero entries (`sparse_ops()`: compact, product, program)

    def lacks(self, need: Need) -> str | None:
        """What of `need` this backend has not declared, as the words after "backend `x`" (the
        first such thing), or None: it can."""
        if need.scans and not self.scans:
            return "does not run layer scans"
        if need.device is not None and ANY not in self.devices and need.device not in self.devices:
            return f"does not run on {need.device} tensors (it runs {_words(self.devices, str.upper)} tensors)"
        if need.dtype is not None and ANY not in self.dtypes and need.dtype not in self.dtypes:
            return f"does not run {need.dtype} tensors (it runs {_words(self.dtypes)} tensors)"
        if need.noise and not self.noise:
            return "does not draw random numbers (the model's noise)"
        if need.training and not self.training:
            return "has no backward (gradients)"
        if need.compile and not self.compile:
            return "does not run under torch.compile"
        return None


def _words(items: Sequence[str], form=str) -> str:
    """"a", "a or b", "a, b or c"."""
    w = [form(i) for i in items]
    return w[0] if len(w) == 1 else ", ".join(w[:-1]) + " or " + w[-1]


# a backend that declares nothing: any device and dtype, no layer scans
UNDECLARED = Capabilities(devices=(ANY,), dtypes=(ANY,))


@dataclass(frozen=True)
class Need:
    """What a call asks of a backend (`Capabilities.lacks`, `backends.able`): its tensors'
    device type and dtype (None: any), and whether it is a layer scan, draws random numbers,
    needs gradients, runs under torch.compile."""

    device: str | None = None
    dtype: str | None = None
    scans: bool = False
    noise: bool = False
    training: bool = False
    compile: bool = False

    @staticmethod
    def of(x: torch.Tensor, **flags: bool) -> Need:
        """The need of a call on tensors like `x` (its device type and dtype), with `flags`."""
        return Need(x.device.type, str(x.dtype).removeprefix("torch."), **flags)


@dataclass
class RunResult:
    outputs: list[torch.Tensor]  # [T, *shape] each, in `output` order
    states: list[torch.Tensor]  # final states, [*shape] each
    seqs: list[torch.Tensor] | None = None  # [T, *shape] per state, with store_seqs


class Program(Protocol):
    # the precision a call computes in when it is not the inputs' dtype (the Triton kernels: float32);
    # the module checks the params in it (a denominator that rounds to 0, a param beyond its range)
    computes_in: torch.dtype | None
    # optional (default False): a tensor initial state may come in any floating dtype, the program
    # converts it (else the module gives it the inputs' dtype, as a float state is rounded to it)
    # reads_any_float: bool

    def run(self, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any], *,
            store_seqs: bool, noise: NoiseKey | None = None) -> RunResult:
        """`noise`: the key of the call's random draws (a model with draws only)."""
        ...


class RecurrentProgram(Protocol):
    binary: bool  # the source is a spike (0/1)
    ops: tuple  # its custom ops (`register_ops`), set when loaded: the layer under torch.compile

    def forward(self, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
                states: Sequence[Any], params: Sequence[Any], save: bool, noise: NoiseKey | None = None,
                s0_exact: bool | None = None) -> tuple[list, list, torch.Tensor, Any]:
        """(outputs [T, B, H] each, final states [B, H], S [T + 1, B, H]: s0 then the source
        of every step (the source output is S[1:]), what the backward needs (or None)); `noise`:
        the key of a noisy model's draws (the backward replays them); `s0_exact`: whether s0 is
        exact in bfloat16, where the caller knows (None: the program checks if it needs to)."""
        ...

    # optional (the layer's custom op then keeps the forward's values for its backward, else it
    # runs the forward again): `saved_shapes(T, shape)`, the shapes of the tensors `saved_tensors(saved)`
    # lists, in the dtype of `ix`; `layercall.restore(tensors, inputs, params, like, noise)`, `saved` again (`like`:
    # a [B, H] tensor of the call's dtype and device)

    def backward(self, saved: Any, w: torch.Tensor, g_outs: Sequence[torch.Tensor | None],
                 g_fins: Sequence[torch.Tensor | None], need: dict[str, Any]) -> tuple:
        """(gI [T, B, H], grads of the other inputs, of the initial states, of the params, extras:
        "parts" (gI as three bfloat16 parts [3, T, B, H]) and "sb" (S in bfloat16) where the
        program has them and `need["parts"]` asks)."""
        ...


class Backend(Protocol):
    name: str
    capabilities: Capabilities  # what it declares (absent: `UNDECLARED`)

    def available(self) -> bool:
        """Whether it can run in this process (its libraries import)."""
        ...

    def accepts(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Whether `backend="auto"` should use it for these inputs."""
        ...

    def version(self) -> str:
        """The versions of the tools its artefacts depend on (part of the cache key)."""
        ...

    # optional: `refusal(x) -> (message, hint) | None`, why a layer's scan asked for by name cannot
    # run on inputs like `x` here beyond what its capabilities say (a located error before anything
    # is computed); none: it can.
    # optional (with `capabilities.scans`): `load_scan(spec: ScanSpec, key: str) -> RecurrentProgram`,
    # the layer scan of `spec` (`backends/recurrent.py` `RecurrentProgram`), `key` its cache key

    def emit(self, ir: IR) -> Artefact: ...

    def load(self, artefact: Artefact, key: str) -> Program: ...


def key_tensor(noise: NoiseKey | torch.Tensor | None) -> torch.Tensor | None:
    """A call's noise key as a custom op's argument: None (no noise) or an int64 tensor (seed, t0)
    (under torch.compile the key is a tensor of the graph already)."""
    import torch

    if noise is None or isinstance(noise, torch.Tensor):
        return noise
    return torch.tensor([noise.seed, noise.t0], dtype=torch.int64)


def key_ints(key: torch.Tensor | None) -> list[int]:
    """The (seed, t0) of a key tensor (inside a custom op: the tensor is read, never traced)."""
    return [int(v) for v in key.tolist()] if key is not None else []


def transformed(t: Any) -> bool:
    """Whether `t` is a tensor of a torch.func transform (grad, vmap, jvp...): it has no memory of
    its own, so a backend that runs kernels on data pointers does not accept it. (On every call's
    path: torch's test is looked up once.)"""
    if not _WRAPPED:
        import torch

        _WRAPPED.append((torch.Tensor, getattr(getattr(torch._C, "_functorch", None),
                                               "is_functorch_wrapped_tensor", None)))
    tensor, is_wrapped = _WRAPPED[0]
    return is_wrapped is not None and isinstance(t, tensor) and bool(is_wrapped(t))


def any_transformed(ts: Sequence[Any]) -> bool:
    """Whether any of `ts` is a tensor of a torch.func transform (`transformed`), in one call."""
    if not _WRAPPED:
        transformed(None)
    tensor, is_wrapped = _WRAPPED[0]
    if is_wrapped is not None:
        for t in ts:  # (a loop, not a generator: no Python call per tensor)
            if isinstance(t, tensor) and is_wrapped(t):
                return True
    return False


_WRAPPED: list = []  # [(torch.Tensor, torch's is_functorch_wrapped_tensor or None)]


__all__ = ["ANY", "Artefact", "Backend", "Capabilities", "IR", "Need", "NoiseKey", "ScanSpec", "UNDECLARED", "Program", "RecurrentProgram", "RunResult", "key_ints", "key_tensor", "transformed", "any_transformed"]
