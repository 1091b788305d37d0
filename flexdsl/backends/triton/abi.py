"""The kernel ABI: the one description of the Triton kernels' arguments and of what they
save, built once from the schedule and read by both the emitter (signatures, templates) and
the launcher (argument lists), so neither rebuilds the other's conventions by position.

Every argument is an `Arg`: its identifier in the kernel (from the naming scheme,
`naming.tagged(role, name)`), its role, the model or SSA name it belongs to, and whether it
is a `tl.constexpr`. The launcher fills a value per (role, of) and passes `args` in order.

Roles of `fwd` (inference and training forward):
  in, stride (per input) · init (per state: a float, a one-element tensor or a [N] tensor) ·
  param (per param) ·
  out (per output) · fin, seq (per state) · hoisted (per host-computed invariant) ·
  saved, N, T · seedlo, seedhi, tbase (a noisy model: the key of its draws) · constexpr: initmode (per
  state), mode (per param), host, store_seqs, save, block
Roles of `bwd` (the derived backward, reverse time):
  in, stride (per input; only re-read inputs are passed) · saved · param · gout (per output) ·
  gseq, gfin (per state) · gx (per input) · gs (per state) · gp (per learnable) · hoisted ·
  N, T · constexpr: mode, hasgout, hasgseq, hasgfin, needgx, needgs, needgp, host, block
Roles of `bwd_rc` (the recompute backward): as `bwd`, with `ckpt` for `saved`, `hoisted` from
`hoisted_rc`, `C` (the number of chunks) and `init`/`initmode` (the initial states, where the
first chunk starts); `fwd` also has `ckpt` ([C - 1, S, N]: the states at steps K, 2K, ...) and the
constexprs `checkpoint` (write checkpoints) and `round` (the spike decision reads saved values
as stored).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..naming import tagged


@dataclass(frozen=True)
class Arg:
    name: str  # identifier in the kernel signature
    role: str
    of: str = ""  # the model / SSA name it belongs to ("" for per-call values)
    constexpr: bool = False

    @property
    def decl(self) -> str:
        return f"{self.name}: tl.constexpr" if self.constexpr else self.name


# internal identifiers (no model name: a leading `_`, no `__`, never produced by `derived`)
_FIXED = {"saved": "_saved", "N": "_N", "T": "_T", "host": "_HOST", "store_seqs": "_STORE_SEQS",
          "save": "_SAVE", "block": "_BLOCK", "ckpt": "_ckpt", "C": "_C", "checkpoint": "_CKPT",
          "round": "_ROUND", "seedlo": "_seedlo", "seedhi": "_seedhi", "tbase": "_tbase"}
# a noisy model's kernels take the key of the call's draws: the seed's low and high 31 bits, and
# the key's step of the call's first step
NOISE_ROLES = ("seedlo", "seedhi", "tbase")


def arg(role: str, of: str = "", constexpr: bool = False) -> Arg:
    return Arg(tagged(role, of) if of else _FIXED[role], role, of, constexpr)


@dataclass
class KernelABI:
    name: str  # the model's name
    inputs: list[str]
    states: list[str]
    params: list[str]
    learnable: list[str]
    outputs: list[str]
    saved: list[str]  # per-step values the training forward writes, in this order ([K, T, N])
    reread: list[str]  # inputs the backward reads again
    hoisted_fwd: list[str]  # invariants passed from the host to the forward
    hoisted_bwd: list[str]  # ... and to the backward
    grad_inputs: list[bool]  # which gradients can be nonzero
    grad_states: list[bool]
    grad_params: list[bool]
    infer_passes: int
    train_passes: int
    # recompute: the forward writes a float32 checkpoint of the states every `chunk` steps
    # ([C, S, N]); the backward re-runs each chunk from it, re-reading `rc_inputs`
    rc_inputs: list[str] = field(default_factory=list)
    hoisted_rc: list[str] = field(default_factory=list)
    chunk: int = 8
    rc_passes: float = 0.0
    train_plan: str = "save"  # the default training plan with 32-bit I/O, "save" or "recompute"
    train_plan16: str = "save"  # ... with 16-bit I/O
    draws: int = 0  # random draws per step and element (0: no noise, no key arguments)
    fwd: list[Arg] = field(default_factory=list)
    bwd: list[Arg] = field(default_factory=list)
    bwd_rc: list[Arg] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.fwd:
            self.fwd = self._fwd_args()
        if not self.bwd:
            self.bwd = self._bwd_args()
        if not self.bwd_rc:
            self.bwd_rc = self._bwd_rc_args()

    def _fwd_args(self) -> list[Arg]:
        a: list[Arg] = []
        for x in self.inputs:
            a += [arg("in", x), arg("stride", x)]
        a += [arg("init", s) for s in self.states]
        a += [arg("param", p) for p in self.params]
        a += [arg("out", o) for o in self.outputs]
        a += [arg("fin", s) for s in self.states]
        a += [arg("seq", s) for s in self.states]
        a += [arg("hoisted", h) for h in self.hoisted_fwd]
        a += [arg("saved"), arg("ckpt"), arg("N"), arg("T")]
        a += [arg(r) for r in NOISE_ROLES[:3 * bool(self.draws)]]
        a += [arg("initmode", s, True) for s in self.states]
        a += [arg("mode", p, True) for p in self.params]
        a += [arg("host", constexpr=True), arg("store_seqs", constexpr=True), arg("save", constexpr=True),
              arg("checkpoint", constexpr=True), arg("round", constexpr=True), arg("block", constexpr=True)]
        return a

    def _bwd_rc_args(self) -> list[Arg]:
        return self._bwd_args(recompute=True)

    def _bwd_args(self, recompute: bool = False) -> list[Arg]:
        """The backward's arguments; recomputing, `ckpt` and the initial states replace `saved`,
        and the invariants are `hoisted_rc`."""
        a: list[Arg] = []
        for x in self.inputs:
            a += [arg("in", x), arg("stride", x)]
        a += [arg("ckpt"), *(arg("init", s) for s in self.states)] if recompute else [arg("saved")]
        a += [arg("param", p) for p in self.params]
        a += [arg("gout", o) for o in self.outputs]
        a += [arg("gseq", s) for s in self.states]
        a += [arg("gfin", s) for s in self.states]
        a += [arg("gx", x) for x in self.inputs]
        a += [arg("gs", s) for s in self.states]
        a += [arg("gp", p) for p in self.learnable]
        a += [arg("hoisted", h) for h in (self.hoisted_rc if recompute else self.hoisted_bwd)]
        a += [arg("N"), arg("T"), arg("C"), *(arg("initmode", s, True) for s in self.states)] if recompute else \
            [arg("N"), arg("T")]
        a += [arg(r) for r in NOISE_ROLES[:3 * bool(self.draws)]]
        a += [arg("mode", p, True) for p in self.params]
        a += [arg("hasgout", o, True) for o in self.outputs]
        a += [arg("hasgseq", s, True) for s in self.states]
        a += [arg("hasgfin", s, True) for s in self.states]
        a += [arg("needgx", x, True) for x in self.inputs]
        a += [arg("needgs", s, True) for s in self.states]
        a += [arg("needgp", p, True) for p in self.learnable]
        a += [arg("host", constexpr=True), arg("block", constexpr=True)]
        return a

    def name_of(self, role: str, of: str = "") -> str:
        """The kernel identifier of an argument (for the emitter's templates)."""
        return arg(role, of).name

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("fwd", "bwd", "bwd_rc"):
            d.pop(k)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelABI:
        return cls(**d)


__all__ = ["Arg", "KernelABI", "arg", "NOISE_ROLES"]
