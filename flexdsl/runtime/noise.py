"""The random draws of a loaded model's calls: which key (`backends.base.NoiseKey`: a 64-bit seed
and the step the call starts at) a call draws from. A mixin of `NeuronModule`.

Draw k of step t of element i depends on (seed, t, i, k) only (the counter-based generator of
`backends/random.py`, the same on every backend). A module keeps a *stream*: a seed, drawn
from torch's default generator at the first call after loading or `reset()` (so `torch.manual_seed`
makes runs repeatable, and every episode after a reset gets new noise), and the steps taken since
then, so that a sequence given in pieces (truncated BPTT, `step_mode="s"`) draws exactly what it
draws in one call. `m(x, seed=s)` draws this call from the seed `s` (the steps still counted from
the reset: after `m.reset()`, the same call with the same seed draws the same noise);
`m(x, generator=g)` takes the call's seed from the `torch.Generator` `g`. The functional form
`m.step(x, state, seed=s)` counts steps from 0 and, without a seed, draws one per call.

The global generator's contract is the same on every path (eager, `torch.compile`, a neuron or a
recurrent layer): a module draws one seed from torch's default CPU generator at its first call
after loading or `reset()` (and the functional form one per call without `seed=`), nothing at
any other call, and nothing for a call given `seed=` or `generator=`. Under a trace the seed is
drawn by the opaque ops below at run time, as an eager call draws it (Inductor's own random ops
would draw another stream, and on every call).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..backends.base import NoiseKey
from ..backends.ops import Op, define

SEED_LIMIT = 2**62  # seeds are integers in [0, 2**62) (the kernels take them as two 31-bit halves)
STEP_LIMIT = 2**31  # steps of a stream (the kernels count them in 32 bits)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A 62-bit seed from `generator` (default: torch's default CPU generator)."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, SEED_LIMIT - 1, (), dtype=torch.int64, generator=generator, device=device))


def _stream_seed_impl(state: torch.Tensor) -> None:
    if int(state[0]) < 0:  # (no seed since the reset: draw it, as an eager call does)
        state[0] = draw_seed()


def _fresh_seed_impl(like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(draw_seed(), dtype=torch.int64)


_OPS: list = []


def seed_ops() -> tuple:
    """(stream_seed, fresh_seed): custom ops that a traced call runs at run time, drawing from the
    default generator exactly as an eager call (defined on first use: no torch.library work when
    flexdsl is imported)."""
    if _OPS:  # (the path a trace takes)
        return tuple(_OPS)
    # (`define` holds a lock: two threads defining them at once would destroy one Library under the other)
    ops = define("flexdsl", [Op("noise_stream_seed", _stream_seed_impl, "(Tensor(a!) state) -> ()",
                                mutates_args=("state",)),
                             Op("noise_fresh_seed", _fresh_seed_impl, "(Tensor like) -> Tensor",
                                fake=lambda like: torch.empty((), dtype=torch.int64))], once=True)
    _OPS[:] = ops
    return tuple(_OPS)


class NoiseSource:
    """NeuronModule's noise keys (see the module docstring)."""

    def _noise_stream(self) -> torch.Tensor:
        """The module's stream: (seed, -1 until drawn; steps since the reset), an int64 tensor."""
        st = self.__dict__.get("_noise_state")
        if st is None:
            st = self.__dict__["_noise_state"] = torch.tensor([-1, 0], dtype=torch.int64)
        return st

    def _noise_reset(self) -> None:
        st = self.__dict__.get("_noise_state")
        if st is not None:
            st[0], st[1] = -1, 0

    def _call_seed(self, seed: Any, generator: Any) -> int | None:
        """The seed a call asks for (`seed=` or `generator=`), checked; None for neither."""
        c = self._compiled
        if seed is None and generator is None:
            return None
        if not self._stochastic:
            what = "`seed=`" if seed is not None else "`generator=`"
            raise self._error(f"{what} given, but {c.name} draws no random numbers", c.checked.ast.pos,
                              "noise comes from white noise `xi` in the equations or `randn()`/`rand()` in `update` "
                              "and the spike rule")
        if seed is not None and generator is not None:
            raise self._error("give `seed=` or `generator=`, not both", hint="seed=: a fixed noise; generator=: "
                                                                              "a seed drawn from that generator")
        if generator is not None:
            if not isinstance(generator, torch.Generator):
                raise self._error(f"`generator` must be a torch.Generator, not {type(generator).__name__}",
                                  hint="e.g. generator=torch.Generator().manual_seed(0), or seed=0")
            return draw_seed(generator)
        if isinstance(seed, torch.Tensor) and seed.numel() == 1 and not seed.is_floating_point() \
                and seed.dtype != torch.bool:
            seed = int(seed)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < SEED_LIMIT:
            raise self._error(f"`seed` must be an integer in [0, 2**62), not {seed!r}", hint="e.g. seed=0")
        return int(seed)

    def _noise_key(self, T: int, seed: Any, generator: Any, functional: bool) -> NoiseKey | None:
        """The key of a call of T steps (None: the model draws nothing); the module's stream is
        advanced by `_noise_advance` once the call has run."""
        explicit = self._call_seed(seed, generator)
        if not self._stochastic:
            return None
        if torch.compiler.is_compiling():
            return self._traced_key(explicit, functional)  # type: ignore[return-value]
        if functional:
            return NoiseKey(explicit if explicit is not None else draw_seed(), 0)
        st = self._noise_stream()
        stream_seed, t0 = (int(v) for v in st.tolist())
        if t0 + T >= STEP_LIMIT:
            raise self._error(f"this module's noise has run {t0} steps since its last reset(): a stream holds at "
                              f"most 2**31 steps", hint="call m.reset() (a new seed), or pass seed= per call")
        if explicit is None:
            if stream_seed < 0:
                stream_seed = draw_seed()
                st[0] = stream_seed
            explicit = stream_seed
        return NoiseKey(explicit, t0)

    def _noisy_core(self, fn):
        """`m.core` of a noisy model: one step, its draws from a new seed per call."""
        from ..backends.random import NoiseStream

        def core(*args):
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            x0 = ts[0] if ts else torch.zeros(())
            shape = torch.broadcast_shapes(*(a.shape for a in ts))
            return fn(*args, *self._core_params(), NoiseStream(draw_seed(), 0, shape, x0.dtype, x0.device, 1).at(0))

        return core

    def _traced_key(self, explicit: int | None, functional: bool) -> torch.Tensor:
        """The key under torch.compile: an int64 tensor (seed, t0) of the graph (no value is read,
        so nothing is guarded: the stream's seed and step are inputs, updated in place). A seed
        not given is drawn at run time by an opaque op, from the default generator, when an eager
        call would draw it (module docstring)."""
        stream_seed, fresh_seed = seed_ops()
        if functional:
            seed = torch.tensor(explicit) if explicit is not None else fresh_seed(torch.zeros(()))
            return torch.stack([seed, torch.zeros((), dtype=torch.int64)])
        st = self._noise_stream()
        if explicit is not None:
            seed = torch.full((), explicit, dtype=torch.int64)
        else:
            stream_seed(st)
            seed = st[0]
        return torch.stack([seed, st[1]])

    def _noise_advance(self, key: NoiseKey | torch.Tensor | None, T: int) -> None:
        if isinstance(key, torch.Tensor):  # (a trace)
            self._noise_stream()[1].copy_(key[1] + T)
        elif key is not None:
            self._noise_stream()[1] = key.t0 + T


__all__ = ["NoiseSource", "draw_seed", "seed_ops", "SEED_LIMIT", "STEP_LIMIT"]
