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
        if not self.__dict__.get("_loading"):  # called directly: validated here (a load validated it all)
            self._validate({k: self._stored_form(k, v) for k, v in floats.items()}, floats)
        for k, v in floats.items():
            if k in self._parameters:
                with torch.no_grad():
                    self._parameters[k].fill_(v)
            elif k in self._buffers:  # (only when called directly: loading a state dict adopts the float)
                self._buffers[k] = torch.full_like(self._buffers[k], v)
            else:
                self._fixed[k] = v
        self._params_changed()

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
        buffer, a float as a float."""
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
        name = self._compiled.name
        extra = state_dict.get(prefix + "_extra_state")
        floats = self._extra_params(extra) if extra is not None else {}
        given: dict[str, Any] = dict(floats)
        for k, p in self._param_decls.items():
            if prefix + k in state_dict:
                t = state_dict[prefix + k]
                if not isinstance(t, torch.Tensor):
                    raise self._error(f"the checkpoint's `{prefix + k}` is a {type(t).__name__}, not a tensor", p.pos)
                given[k] = param_number(self._compiled, p, t.detach(), "the checkpoint's value of")
        if strict and _loading_strictly():
            missing = [k for k in self._param_decls if k not in given]
            if missing:
                raise self._error(f"the checkpoint has no value for {names_of(missing)} of `{name}` (strict=True)",
                                  self._param_decls[missing[0]].pos,
                                  "load_state_dict(..., strict=False) keeps this module's values of the params a "
                                  "checkpoint lacks")
            ours = {*self._param_decls, "_extra_state"}
            unknown = [k[len(prefix):] for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):]
                       and k[len(prefix):] not in ours]
            if unknown:
                raise self._error(f"the checkpoint has `{unknown[0]}`, which `{name}` does not have (strict=True)",
                                  hint=did_you_mean(unknown[0], self._param_decls) or
                                  f"params of {name}: {', '.join(self._param_decls)}")
        self._validate({k: self._stored_form(k, v) for k, v in given.items()}, given)
        self._adopt_checkpoint_shapes(state_dict, prefix, floats)
        self.__dict__["_loading"] = True
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
        finally:
            self.__dict__["_loading"] = False
        if prefix + "_extra_state" in missing_keys:  # a checkpoint from before extra state: keep the floats
            missing_keys.remove(prefix + "_extra_state")
        self._params_changed()


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
