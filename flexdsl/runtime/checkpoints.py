"""Checkpoints of a loaded model (`state_dict`/`load_state_dict`): the float params travel as
extra state, a checkpoint restores the exact model (per-channel or not), and the whole checkpoint
is validated (of this model, every param present under strict=True, finite numbers or real
tensors, every constraint, a defined step) before anything changes. A mixin of `NeuronModule`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import did_you_mean
from ..frontend.bounds import RAW_PREFIX
from . import bounds as bound_values
from .params import names_of, param_number

EXTRA_STATE_FORMAT = 1


class Checkpoints:
    """NeuronModule's `get_extra_state`, `set_extra_state` and `_load_from_state_dict`."""

    def get_extra_state(self) -> dict[str, Any]:
        """The params that are neither Parameters nor buffers (plain floats), so that a
        checkpoint restores the exact model."""
        return {"flexdsl": EXTRA_STATE_FORMAT, "model": self._compiled.name, "params": dict(self._fixed)}

    def set_extra_state(self, state: Any) -> None:
        floats = self._extra_params(state)
        kept: dict[str, torch.Tensor] = {}
        raws: dict[str, torch.Tensor] = {}
        if not self.__dict__.get("_loading"):  # called directly: validated here (a load validated it all,
            # and put the raw values of bounded params into the state dict)
            kept = self._validate({k: self._stored_form(k, v) for k, v in floats.items()}, floats)
            raws = self._raws_of_floats(floats)
        # every check passed and everything to store is computed: store (nothing below raises)
        for k, v in floats.items():
            if k in self._bounds:  # (saved where `k` was not learnable: its raw value gives it)
                if k in raws:
                    with torch.no_grad():
                        self._raw_tensor(k).copy_(raws[k])
            elif k in self._parameters:
                with torch.no_grad():
                    self._parameters[k].fill_(v)
            elif k in self._buffers:  # (only when called directly: loading a state dict adopts the float)
                self._buffers[k] = torch.full_like(self._buffers[k], v)
            else:
                self._fixed[k] = v
        self._keep_bounded(kept)
        self._params_changed()

    def _raws_of_floats(self, floats: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """The raw values that give the bounded params among a checkpoint's floats their values
        (saved where they were not learnable), checked: inside their bounds, held by the raw's shape."""
        env = self._param_env() | dict(floats)
        out = {}
        for k, v in floats.items():
            if k in self._bounds:
                if not bound_values.inside(self._bounds[k], v, env):
                    raise self._on_bound(k, v)
                out[k] = self._raw_for(k, v, env, self._raw_tensor(k))
        return out

    def _extra_params(self, state: Any) -> dict[str, float]:
        """The float params of a checkpoint's extra state, checked: of this model, names it
        declares, finite numbers."""
        name = self._compiled.name
        if not isinstance(state, Mapping) or not isinstance(state.get("params"), Mapping) or \
                state.get("flexdsl") != EXTRA_STATE_FORMAT:
            raise self._error("the checkpoint's extra state is not one of a flexdsl model")
        if state.get("model") != name:
            raise self._error(f"the checkpoint is of the model `{state.get('model')}`, not `{name}`",
                              self._compiled.checked.ast.pos,
                              "a checkpoint loads into a module of the model that saved it")
        out = {}
        for k, v in state["params"].items():
            if k not in self._param_decls:
                raise self._error(f"the checkpoint has a param `{k}` that `{name}` does not declare",
                                  hint=did_you_mean(str(k), self._param_decls))
            if isinstance(v, torch.Tensor) or isinstance(v, bool | str):
                raise self._error(f"the checkpoint's param `{k}` is not a number: {v!r}", self._param_decls[k].pos)
            out[k] = param_number(self._compiled, self._param_decls[k], v, "the checkpoint's value of")
        return out

    def _stored_form(self, name: str, v: Any) -> Any:
        """A checkpoint's value of a param as this module would hold it after loading: a
        learnable param in its Parameter's dtype (a float fills it), a per-channel value as a
        buffer, a float as a float (a bounded param: its value, as computed from its raw value)."""
        if name in self._bounds:
            return v.detach().to(torch.float64) if isinstance(v, torch.Tensor) else float(v)
        if name in self._parameters:
            cur = self._parameters[name]
            if isinstance(v, torch.Tensor):
                return v.detach().to(dtype=cur.dtype, device=cur.device)
            return torch.full_like(cur.detach(), v)
        if isinstance(v, torch.Tensor):
            buf = self._buffers.get(name)
            if buf is not None and buf.shape == v.shape:
                return v.detach().to(dtype=buf.dtype, device=buf.device)
            return v.detach().to(torch.float64)
        return float(v)

    def _adopt_checkpoint_shapes(self, state_dict: Mapping[str, Any], prefix: str, floats: Mapping[str, float]
                                 ) -> None:
        """A checkpoint restores the exact model, per-channel or not: a param stored as a tensor
        of another shape than here (or as a float where here is a tensor, and the reverse) takes
        the checkpoint's form before the values are copied (`floats`: the checkpoint's float
        params). (A learnable param that changes shape is a new Parameter: build the optimizer
        after loading.)"""
        d = self.__dict__
        for name, p in self._param_decls.items():
            b = self._bounds.get(name)
            if b is not None:
                t = state_dict.get(prefix + b.raw)
                cur = self._parameters.get(b.raw)
                if isinstance(t, torch.Tensor) and cur is not None and cur.shape != t.shape:
                    super().__setattr__(b.raw, nn.Parameter(torch.zeros(t.shape, dtype=cur.dtype, device=cur.device)))
                continue
            t = state_dict.get(prefix + name)
            if isinstance(t, torch.Tensor):
                if p.learnable:
                    cur = self._parameters.get(name)
                    if cur is not None and cur.shape != t.shape:
                        super().__setattr__(name, nn.Parameter(torch.zeros(t.shape, dtype=cur.dtype,
                                                                           device=cur.device)))
                elif name in d["_fixed"]:
                    del d["_fixed"][name]
                    self.register_buffer(name, torch.zeros(t.shape, dtype=torch.float64))
                elif name in self._buffers and self._buffers[name].shape != t.shape:
                    self._buffers[name] = torch.zeros(t.shape, dtype=torch.float64,
                                                      device=self._buffers[name].device)
            elif name in floats and not p.learnable and name in self._buffers:
                del self._buffers[name]
                d["_fixed"][name] = floats[name]

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        # the whole checkpoint is validated before anything changes: of this model, every param
        # present (strict), finite numbers or real tensors, every constraint and a defined step
        extra = state_dict.get(prefix + "_extra_state")
        floats = self._extra_params(extra) if extra is not None else {}
        given: dict[str, Any] = dict(floats)
        raws: dict[str, torch.Tensor] = {}
        for k, p in self._param_decls.items():
            b = self._bounds.get(k)
            key = prefix + (b.raw if b is not None and prefix + b.raw in state_dict else k)
            if key in state_dict:
                t = state_dict[key]
                if not isinstance(t, torch.Tensor):
                    raise self._error(f"the checkpoint's `{key}` is a {type(t).__name__}, not a tensor", p.pos)
                t = param_number(self._compiled, p, t.detach(), "the checkpoint's value of")
                if key == prefix + k:
                    given[k] = t
                else:
                    raws[k] = t
        if strict and _loading_strictly():
            self._check_complete(state_dict, prefix, given, raws)
        given |= self._bounded_values(raws, given)
        kept = self._validate({k: self._stored_form(k, v) for k, v in given.items()}, given)
        values = self._raws_of_values(state_dict, prefix, given, raws, floats)
        # every check passed and everything to store is computed: store (nothing below raises)
        for k, r in values.items():
            state_dict.pop(prefix + k, None)
            state_dict[prefix + self._bounds[k].raw] = r
        self._adopt_checkpoint_shapes(state_dict, prefix, floats)
        self.__dict__["_loading"] = True
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
        finally:
            self.__dict__["_loading"] = False
        if prefix + "_extra_state" in missing_keys:  # a checkpoint from before extra state: keep the floats
            missing_keys.remove(prefix + "_extra_state")
        for k in floats:  # (saved where `k` was not learnable: its float fills the Parameter)
            key = prefix + (self._bounds[k].raw if k in self._bounds else k)
            if key in missing_keys:
                missing_keys.remove(key)
        self._keep_bounded(kept)
        self._params_changed()

    def _check_complete(self, state_dict: Mapping[str, Any], prefix: str, given: Mapping[str, Any],
                        raws: Mapping[str, Any]) -> None:
        """strict=True: a value for every param, and nothing this model does not have."""
        name = self._compiled.name
        ours = {*self._param_decls, "_extra_state", *(b.raw for b in self._bounds.values())}
        unknown = [k[len(prefix):] for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):]
                   and k[len(prefix):] not in ours]
        for u in unknown:
            if u.startswith(RAW_PREFIX) and u[len(RAW_PREFIX):] in self._param_decls:
                raise self._error(f"the checkpoint has `{u}`, the Parameter of a bounded learnable "
                                  f"`{u[len(RAW_PREFIX):]}`, which is not learnable here",
                                  self._param_decls[u[len(RAW_PREFIX):]].pos,
                                  "load the model with the learnable params it was saved with (learnable=...)")
        missing = [k for k in self._param_decls if k not in given and k not in raws]
        if missing:
            raise self._error(f"the checkpoint has no value for {names_of(missing)} of `{name}` (strict=True)",
                              self._param_decls[missing[0]].pos,
                              "load_state_dict(..., strict=False) keeps this module's values of the params a "
                              "checkpoint lacks")
        unknown = [u for u in unknown if u not in given]
        if unknown:
            raise self._error(f"the checkpoint has `{unknown[0]}`, which `{name}` does not have (strict=True)",
                              hint=did_you_mean(unknown[0], self._param_decls) or
                              f"params of {name}: {', '.join(self._param_decls)}")

    def _bounded_values(self, raws: Mapping[str, torch.Tensor], given: Mapping[str, Any]) -> dict[str, Any]:
        """The values a checkpoint's raw Parameters give its bounded params (with the
        checkpoint's other params, else this module's)."""
        if not raws:
            return {}
        env = self._param_env() | dict(given)
        out = {}
        for k in self._param_decls:
            if k in raws:
                env[k] = out[k] = bound_values.value(self._bounds[k], raws[k], env).detach()
        return out

    def _raws_of_values(self, state_dict: Mapping[str, Any], prefix: str, given: Mapping[str, Any],
                        raws: Mapping[str, Any], floats: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """A checkpoint that holds a bounded param's value (saved before it was bounded, or where it
        was an unbounded Parameter, a buffer or a float) loads it as the raw value that gives it:
        name -> raw value (a tensor value's shape, as a checkpoint's forms are taken over; a float
        fills the raw Parameter), each checked (inside its bounds, held by that shape)."""
        env = self._param_env() | dict(given)
        out = {}
        for k, b in self._bounds.items():
            if k in raws or (prefix + k not in state_dict and k not in floats):
                continue
            v = given[k]
            if not bound_values.inside(b, v, env):
                raise self._on_bound(k, v)
            cur = self._raw_tensor(k)
            like = torch.empty(v.shape, dtype=cur.dtype, device=cur.device) if isinstance(v, torch.Tensor) else cur
            out[k] = self._raw_for(k, v.detach() if isinstance(v, torch.Tensor) else v, env, like)
        return out


def _loading_strictly() -> bool:
    """Whether the `load_state_dict` call loading a module is strict: torch passes strict=True to
    every `_load_from_state_dict` and applies `strict` only after everything was copied, so a
    checkpoint it refuses would already have changed the module. (Read from that call's frame;
    True where there is none, e.g. a direct call.)"""
    code = nn.Module.load_state_dict.__code__
    f = sys._getframe(1)
    while f is not None:
        if f.f_code is code:
            return bool(f.f_locals.get("strict", True))
        f = f.f_back
    return True


__all__ = ["Checkpoints", "EXTRA_STATE_FORMAT"]
