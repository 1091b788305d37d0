"""What a call of a loaded model gets, checked: the inputs as `[T, *shape]` floating-point
tensors on one device that agree on T and broadcast to one step shape; each state's value
(given, kept from the last call and fitting the new input, or initial); per-channel params that
broadcast to one step of the input. Every violation is a located error. A mixin of
`NeuronModule`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .params import step_param


class CallArgs:
    """NeuronModule's checks of a call's inputs, states and params."""

    def _state_value(self, name: str, value: Any, how: str) -> Any:
        """A state's value from outside (assigned, or given to the functional form), checked:
        None (the initial value), a finite real number, or a floating-point tensor."""
        if value is None:
            return None
        decl = next(s for s in self._compiled.checked.states if s.name == name)
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                raise self._error(f"state `{name}` ({how}) has dtype {value.dtype}; states are floating point",
                                  decl.pos, "pass value.float() (or the input's dtype)")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._error(f"state `{name}` ({how}) takes a tensor or a number, not {type(value).__name__}",
                              decl.pos, "e.g. a tensor of the input's step shape, or a float")
        try:
            f = float(value)
        except OverflowError:
            raise self._error(f"state `{name}` ({how}) is too large for a float", decl.pos) from None
        if not math.isfinite(f):
            raise self._error(f"state `{name}` ({how}) is {f}", decl.pos, "a state starts from a finite number")
        return f

    def _check_inputs(self, inputs: Sequence[Any]) -> tuple[list[torch.Tensor], torch.Size]:
        """The inputs as [T, *shape] tensors (step_mode "s" adds T=1) and the step shape they
        broadcast to; a located error for anything else."""
        c = self._compiled
        decls = self._input_decls
        if len(inputs) != len(decls):
            names = ", ".join(i.name for i in decls)
            raise TypeError(f"{c.name} takes {len(decls)} input{'s' if len(decls) != 1 else ''} ({names}), "
                            f"got {len(inputs)}")
        single = self.step_mode == "s"
        if len(inputs) == 1 and not single:  # the common case, quickly
            x = inputs[0]
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 1:
                return [x], x.shape[1:]
        xs: list[torch.Tensor] = []
        for x, decl in zip(inputs, decls):
            if not isinstance(x, torch.Tensor):
                raise self._error(f"input `{decl.name}` must be a torch.Tensor, not {type(x).__name__}", decl.pos,
                                  "e.g. torch.as_tensor(values, dtype=torch.float32)")
            if not x.is_floating_point():
                raise self._error(f"input `{decl.name}` has dtype {x.dtype}; neurons compute in floating point",
                                  decl.pos, "pass x.float() (float32), x.double() (float64), x.half() or "
                                            "x.bfloat16()")
            if single:
                x = x.unsqueeze(0)
            elif x.dim() < 1:
                raise self._error(f"input `{decl.name}` must be [T, *shape] in step_mode 'm', got a 0-d tensor",
                                  decl.pos, "use step_mode='s' for one step at a time")
            xs.append(x)
        x0 = xs[0]
        for x, decl in zip(xs[1:], decls[1:]):
            if x.shape[0] != x0.shape[0]:
                raise self._error(f"input `{decl.name}` has {x.shape[0]} steps but `{decls[0].name}` has "
                                  f"{x0.shape[0]}", decl.pos, "every input is [T, *shape] with the same T")
            if x.device != x0.device:
                raise self._error(f"input `{decl.name}` is on {x.device} but `{decls[0].name}` is on {x0.device}",
                                  decl.pos)
        if len(xs) == 1:
            return xs, x0.shape[1:]
        try:
            shape = torch.broadcast_shapes(*(x.shape[1:] for x in xs))
        except RuntimeError:
            shapes = ", ".join(f"`{d.name}` {tuple(x.shape[1:])}" for x, d in zip(xs, decls))
            raise self._error(f"the inputs' step shapes do not broadcast: {shapes}", decls[0].pos,
                              "inputs broadcast like torch tensors (e.g. [T, B, N] with [T, 1, N])") from None
        return xs, shape

    def _states_for(self, x0: torch.Tensor, shape: torch.Size, given: Mapping[str, Any] | None,
                    any_float: bool = False) -> list[Any]:
        """Each state's value for a call: given, kept from the last call, or initial. An initial
        value that is a tensor (computed from tensor params; under torch.compile from every
        param) is made the input's dtype, unless the program reads any floating dtype
        (`any_float`: the Triton kernels, which load it in float32, as they take a float)."""
        out: list[Any] = []
        inits = None
        for name in self._state_names:
            v = self._states[name] if given is None else given.get(name)
            if v is None:
                if given is not None and name not in given and given:
                    raise self._error(f"the state dict has no `{name}`",
                                      hint=f"states of {self._compiled.name}: {', '.join(self._state_names)}")
                if inits is None:
                    inits = self._initial_values()
                v = inits[name]
                if isinstance(v, torch.Tensor):
                    v = self._initial_shaped(name, v, shape)
                    v = v.to(device=x0.device) if any_float else v.to(device=x0.device, dtype=x0.dtype)
                elif x0.dtype != torch.float64 and abs(float(v)) > torch.finfo(x0.dtype).max:
                    decl = next(s for s in self._compiled.checked.states if s.name == name)
                    raise self._error(f"state `{name}` starts at {float(v):g}, beyond what {x0.dtype} holds "
                                      f"({torch.finfo(x0.dtype).max:.3g})", decl.pos,
                                      "run in float64 (m.double() and a float64 input), or rescale the model")
            elif isinstance(v, torch.Tensor):
                if v.device != x0.device:
                    raise self._error(f"state `{name}` is on {v.device} but the input is on {x0.device}",
                                      hint="call m.reset() before a new sequence, or move the module with "
                                           "m.to(device)")
                if v.shape != shape and v.dim() > 0:  # (a 0-d state is one value for every element)
                    raise self._error(f"state `{name}` has shape {tuple(v.shape)} "
                                      f"{'(from an earlier call) ' if given is None else '(as given) '}but the "
                                      f"input's step shape is {tuple(shape)}",
                                      hint="call m.reset() (or spikingjelly's functional.reset_net) before a batch "
                                           "of another size")
            out.append(v)
        return out

    def _flat_call_args(self, batch: Sequence[int], H: int, dtype: torch.dtype, device: torch.device
                        ) -> tuple[list[Any], list[Any]]:
        """The kept (or initial) states and the checked params, derived ones included, of a call on
        `[*batch, H]` steps as a kernel that flattens the batch takes them (`[B, H]` tensors or
        floats): the fused layer kernels' (online plasticity, sparse inputs)."""
        x0 = torch.empty((*batch, H), dtype=dtype, device=device)  # (its shape, dtype and device)
        B = math.prod(batch)
        states = [v.reshape(B, H) if isinstance(v, torch.Tensor) and v.dim() > 0 else v
                  for v in self._states_for(x0, x0.shape, None, False)]
        values = self._call_params(None, x0)  # type: ignore[attr-defined]
        params = self._compiled.with_derived(  # type: ignore[attr-defined]
            [v.expand(*batch, H).reshape(B, H) if isinstance(v, torch.Tensor) and v.dim() > 1 else v
             for v in values])
        return states, params

    def _check_param_shapes(self, params: Sequence[Any], x0: torch.Tensor, shape: Sequence[int],
                            what: str = "the input's step shape", hint: str | None = None) -> list[Any]:
        """The params as one step of `shape` takes them (`params.step_param`, the rule of every
        backend and recurrent layer): per-channel ones on the input's device, each broadcasting to
        the step's shape without changing it (leading sizes of 1 beyond its rank dropped)."""
        out = list(params)
        for i, (name, v) in enumerate(zip(self._param_decls, params)):
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                if v.numel() > 1 and v.device != x0.device:
                    raise self._error(f"param `{name}` is on {v.device} but the input is on {x0.device}",
                                      self._param_decls[name].pos, "move the module: m.to(device)")
                if v.shape != shape:
                    fitted = step_param(v, shape)
                    if fitted is None:
                        raise self._error(f"param `{name}` has shape {tuple(v.shape)}, which does not broadcast to "
                                          f"{what} {tuple(shape)}", self._param_decls[name].pos, (hint or
                                          "per-channel values broadcast against one step of the input to its shape "
                                          "(e.g. shape (C,) for [T, B, C], (C, 1, 1) for [T, B, C, H, W])"
                                          ).replace("<name>", name))
                    out[i] = fitted
        return out

    def _initial_shaped(self, name: str, v: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """An initial state computed from per-channel params, as one step of `shape` takes it."""
        fitted = step_param(v, shape)
        if fitted is None:
            decl = next(s for s in self._compiled.checked.states if s.name == name)
            raise self._error(f"the initial value of state `{name}` has shape {tuple(v.shape)}, which does not "
                              f"broadcast to the input's step shape {tuple(shape)}", decl.pos,
                              "it is computed from per-channel params: give them shapes that broadcast to one step")
        return fitted


_is_batched = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None)


def vmapped(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and _is_batched is not None and bool(_is_batched(v))


__all__ = ["CallArgs"]
