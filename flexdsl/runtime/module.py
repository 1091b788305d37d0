"""The runtime's module: `NeuronModule`, the torch.nn.Module a model is loaded as.

It owns the params (Parameters, buffers or plain floats) and the states between calls, and
talks to the backends only through their interface (`backends.base`): it chooses a backend
from the registry, and passes inputs, states and params explicitly to its program.

What it guarantees to a caller: inputs are floating-point tensors on one device that agree
on T and broadcast to one step shape; a state kept from an earlier call must fit the new
input (else a clear error asks for `reset()`); every `where` constraint holds after any
assignment and after `load_state_dict`; non-learnable params travel in checkpoints (extra
state); the module pickles, deep-copies and `torch.compile`s like any torch module.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import backends
from ..errors import FlexDSLError, did_you_mean
from ..frontend import ast as A
from ..frontend.convert import param_value
from ..frontend.evaluate import evaluate, holds, reason
from ..frontend.parse import read_number
from ..store.pipeline import unit_definition
from . import display
from .compiler import Compiled, compile_text

STEP_MODES = ("s", "m")
_EXTRA_STATE_FORMAT = 1


def _base_class() -> type[nn.Module]:
    """SpikingJelly's `MemoryModule` where SpikingJelly is installed (so that its
    `functional.reset_net`, `set_step_mode` and `detach_net` treat flexdsl neurons as their own,
    without warnings), else `nn.Module`. The states are the MemoryModule's memories."""
    import importlib.util

    if importlib.util.find_spec("spikingjelly") is None:
        return nn.Module
    try:
        from spikingjelly.activation_based.base import MemoryModule
    except Exception:  # a broken installation: flexdsl works without it
        return nn.Module
    return MemoryModule


_Base = _base_class()


def triton_available() -> bool:
    """Whether the Triton backend can run here (a GPU, or TRITON_INTERPRET=1 on the CPU)."""
    return backends.get("triton").available()


class NeuronModule(_Base):  # type: ignore[valid-type,misc]
    """A neuron layer generated from a `.neuron` model.

    `m(*inputs)`: inputs are `[T, *shape]` (step_mode "m") or `[*shape]` ("s"); returns the
    single output or a tuple in `output` order. States are readable by name after a call.
    `m(*inputs, state)` and `m.step(*inputs, state=...)` are the functional form: they take
    and return the states as a dict and leave the module's own states alone.
    """

    def __init__(
        self,
        compiled: Compiled,
        params: Mapping[str, Any] | None = None,
        step_mode: str = "m",
        backend: str = "auto",
        store_state_seqs: bool = False,
        param_shapes: Mapping[str, Sequence[int]] | None = None,
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        c = compiled
        ck = c.checked
        d = self.__dict__
        d["_compiled"] = c
        self._derive_fields()
        d["_fixed"] = {}
        d["_states"] = dict.fromkeys(self._state_names)
        if _Base is not nn.Module:  # SpikingJelly's MemoryModule: the states are its memories
            d["_memories"] = d["_states"]
            d["_memories_rv"] = dict.fromkeys(self._state_names)
        d["state_seqs"] = {}
        if step_mode not in STEP_MODES:
            raise FlexDSLError(f"step_mode must be 's' or 'm', not {step_mode!r}", c.filename)
        known = ["auto", *backends.names()]
        if backend not in known:
            raise FlexDSLError(f"backend must be one of {', '.join(known)}, not {backend!r}", c.filename,
                               hint=did_you_mean(str(backend), known))
        if backend != "auto" and not backends.get(backend).available():
            raise FlexDSLError(f"backend={backend!r} cannot run here (its libraries cannot be imported)",
                               c.filename, hint="install them, or use backend='auto' or 'torch'")
        self.step_mode = step_mode
        self.backend = backend
        self.store_state_seqs = store_state_seqs
        self.check_finite = check_finite  # raise at the first NaN/inf of a call (runtime/finite.py)
        shapes = self._param_shapes(param_shapes)
        if params is not None and not isinstance(params, Mapping):
            raise self._error(f"params must be a dict of param values, not {type(params).__name__}")
        values = resolve_params(c, dict(params or {}))
        for p in ck.params:
            v = values[p.name]
            t: torch.Tensor | None = None
            if p.name in shapes:
                t = torch.as_tensor(v, dtype=torch.float64)
                if not _broadcasts_to(t.shape, shapes[p.name]):
                    raise self._error(f"param_shapes gives `{p.name}` the shape {shapes[p.name]}, but its value has "
                                      f"shape {tuple(t.shape)}", p.pos, "a value broadcasts to the shape it is given")
                t = t.expand(shapes[p.name]).clone()
            elif isinstance(v, torch.Tensor):
                t = v.detach().to(torch.float64).clone()
            if p.learnable:
                init = t if t is not None else torch.tensor(float(v), dtype=torch.float64)
                self.register_parameter(p.name, nn.Parameter(init.to(torch.get_default_dtype())))
            elif t is not None:
                self.register_buffer(p.name, t)
            else:
                d["_fixed"][p.name] = float(v)
        self._check_invariants()
        self._prepare(None)

    def _param_shapes(self, param_shapes: Any) -> dict[str, tuple[int, ...]]:
        """`param_shapes`, checked: known params, each a shape of positive ints."""
        if param_shapes is None:
            return {}
        if not isinstance(param_shapes, Mapping):
            raise self._error(f"param_shapes must be a dict of param name -> shape, not {type(param_shapes).__name__}",
                              hint="e.g. param_shapes={'tau': (128,)}")
        out = {}
        for name, shape in param_shapes.items():
            if name not in self._param_decls:
                raise self._error(f"param_shapes names unknown param `{name}`", self._compiled.checked.ast.pos,
                                  did_you_mean(str(name), self._param_decls))
            pos = self._param_decls[name].pos
            if isinstance(shape, int) and not isinstance(shape, bool):
                shape = (shape,)
            if isinstance(shape, str | bytes) or not isinstance(shape, Sequence | torch.Size) or not all(
                    isinstance(n, int) and not isinstance(n, bool) for n in shape):
                raise self._error(f"param_shapes gives `{name}` {shape!r}, which is not a shape", pos,
                                  f"a tuple of sizes, e.g. param_shapes={{'{name}': (128,)}}")
            if any(n < 1 for n in shape) or len(shape) > 16:
                raise self._error(f"param_shapes gives `{name}` the shape {tuple(shape)}: every size must be at least "
                                  "1 (and at most 16 dimensions)", pos,
                                  f"a per-channel param has a value per channel, e.g. param_shapes={{'{name}': (128,)}}")
            out[name] = tuple(int(n) for n in shape)
        return out

    def _derive_fields(self) -> None:
        """Fields that follow from the compiled model (rebuilt after unpickling)."""
        d = self.__dict__
        ck = self._compiled.checked
        d["_param_decls"] = {p.name: p for p in ck.params}
        d["_state_names"] = [s.name for s in ck.states]
        d["_input_decls"] = list(ck.inputs)
        d["_init_cache"] = {}
        d["_dtypes_checked"] = set()  # (compute dtypes the params were checked in since they changed)

    # ------------------------------------------------------------------ errors
    def _error(self, msg: str, pos: A.Pos | None = None, hint: str | None = None) -> FlexDSLError:
        c = self._compiled
        if pos is None:
            return FlexDSLError(msg, c.filename, hint=hint)
        return FlexDSLError(msg, c.filename, pos.line, pos.column, c.text, hint)

    # ------------------------------------------------------------------ attributes
    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name in d.get("_fixed", {}):
            return d["_fixed"][name]
        if name in d.get("_states", {}):
            v = d["_states"][name]
            return self._initial_value(name) if v is None else v
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if name in d.get("_param_decls", {}):
            self._assign_param(name, value)
            return
        if name in d.get("_states", {}):
            d["_states"][name] = self._state_value(name, value, "assigned")
            return
        super().__setattr__(name, value)

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

    def _assign_param(self, name: str, value: Any) -> None:
        """Assign a param: the value is converted to what would be stored and validated with
        every other param (finite, `where` constraints, a defined step) before anything changes."""
        p = self._param_decls[name]
        c = self._compiled
        value = param_value(c.checked, name, value, unit_definition)  # "20 ms": to the declared unit
        if isinstance(value, torch.Tensor) and value.requires_grad and not p.learnable:
            raise self._error(f"`{name}` is not learnable, so a tensor that requires grad would lose its gradient",
                              p.pos, f"declare it `param {name} = ... learnable` to train it, or assign "
                                     "`value.detach()`")
        value = param_number(c, p, value, "the assigned value")
        d = self.__dict__
        if name in d["_fixed"]:
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                new: Any = value.detach().to(torch.float64).clone()
            else:
                new = float(value)
        elif name in self._parameters:
            param = self._parameters[name]
            if isinstance(value, nn.Parameter):
                new = value
            else:
                t = torch.as_tensor(value, dtype=param.dtype, device=param.device)
                if not _broadcasts_to(t.shape, param.shape):
                    raise self._error(f"learnable `{name}` has shape {tuple(param.shape)}; a value of shape "
                                      f"{tuple(t.shape)} does not fit", p.pos,
                                      "per-channel learnable params get their shape at load: param_shapes=...")
                new = t.expand_as(param)
        else:
            buf = self._buffers[name]
            t = torch.as_tensor(value, dtype=buf.dtype, device=buf.device)
            new = t.clone() if t.numel() > 1 else t.expand_as(buf).clone()
        self._validate({name: new}, {name: value})
        # every check passed: store
        if name in d["_fixed"]:
            if isinstance(new, torch.Tensor):
                del d["_fixed"][name]
                self.register_buffer(name, new)
            else:
                d["_fixed"][name] = new
        elif name in self._parameters:
            if isinstance(new, nn.Parameter):
                super().__setattr__(name, new)
            else:
                with torch.no_grad():
                    self._parameters[name].copy_(new)
        else:
            self._buffers[name] = new
        self._params_changed()

    def _validate(self, changed: Mapping[str, Any], shown: Mapping[str, Any]) -> None:
        """Raise unless the params, with `changed` (name -> the value as it would be stored),
        are finite, satisfy every `where` constraint and define the step; nothing is stored."""
        c = self._compiled
        env = self._param_env()
        for k, v in changed.items():
            env[k] = param_number(c, self._param_decls[k], v.detach() if isinstance(v, torch.Tensor) else v,
                                  "the new value of")
        self._check_constraints(env, shown)
        self._check_invariants([env[n] for n in self._param_decls])

    def _param_env(self) -> dict[str, Any]:
        return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self.param_values().items()}

    def _check_constraints(self, env: Mapping[str, Any], changed: Mapping[str, Any]) -> None:
        """Every `where` constraint (cross-param ones included) on these param values."""
        for p in self._param_decls.values():
            if p.where is not None and not constraint_holds(self._compiled, p, env):
                what = ", ".join(f"`{k} = {_show(v)}`" for k, v in changed.items())
                raise self._error(f"{what} violates the constraint of `{p.name}`", p.where.pos,
                                  f"`{p.name}` must satisfy: {A.constraint_text(self._compiled.text, p.where)}")

    def _param_list(self) -> list[Any]:
        """Every param's current value, in declaration order."""
        fixed = self._fixed
        if len(fixed) == len(self._param_decls):
            return [fixed[n] for n in self._param_decls]
        ps, bs = self._parameters, self._buffers
        return [fixed[n] if n in fixed else ps[n] if n in ps else bs[n] for n in self._param_decls]

    def param_values(self) -> dict[str, Any]:
        """Current value of every param (floats, buffers or Parameters)."""
        return {name: getattr(self, name) for name in self._param_decls}

    def _check_invariants(self, values: Sequence[Any] | None = None, dtype: torch.dtype | None = None) -> None:
        """The step's param-only values, derived params included, must be finite (e.g. a decay
        factor that overflows) and its param-only denominators nonzero: a located error names
        the first that is not. `values`: every param's value (default: the module's); `dtype`:
        check in the precision a call computes in (default float64), the params rounded to it."""
        c = self._compiled
        if values is None:
            values = [getattr(self, name) for name in self._param_decls]
        params = [v.detach() if isinstance(v, torch.Tensor) else v for v in values]
        where = ""
        if dtype is not None:  # (the checked values are computed from the rounded params, then rounded)
            dname = str(dtype).replace("torch.", "")
            where = f" in {dname} (the precision of this call)"
            params = [torch.as_tensor(p, dtype=torch.float64).to(dtype) for p in params]
            for (name, p), v, shown in zip(self._param_decls.items(), params, values):
                if not bool(torch.isfinite(v).all()):
                    if not bool(torch.isfinite(torch.as_tensor(shown, dtype=torch.float64)).all()):  # (trained)
                        raise self._error(f"param `{name}` is {_show(shown)}: params are finite numbers", p.pos)
                    raise self._error(f"`{name} = {_show(shown)}` is beyond what {dname} holds (the precision of "
                                      "this call)", p.pos,
                                      "run in float64 (m.double() and a float64 input), or rescale the model")
        with torch.no_grad():
            vals = c.check_values(params)
        for name, v in vals.items():
            t = torch.as_tensor(v) if dtype is None else torch.as_tensor(v).to(dtype)
            stmt, _, kind = name.partition("|")
            if kind.startswith("denominator") and bool((t == 0).any()):
                pos = c.step.origins.get(stmt) or c.checked.ast.pos
                raise self._error(f"with these params this statement divides by zero{where}: a denominator that "
                                  "depends on params only is 0", pos,
                                  "change the params (a `where` constraint on them catches this at load)" if not where
                                  else "run in float64 (m.double() and a float64 input), or change the params")
            if not bool(torch.isfinite(t).all()):
                eqs = c.checked.equations
                pos = c.step.origins.get(stmt) or (eqs.pos if eqs is not None else c.checked.ast.pos)
                how = f" (method `{c.method}`)" if c.method else ""
                what = f"`{stmt}`" if not kind else "a value of this statement computed from the params alone"
                raise self._error(
                    f"with these params the step is not defined{where}: {what}{how} is not finite", pos,
                    "a division by zero or an overflow among the params (e.g. a time constant of 0, or a step "
                    "`dt` so long that a decay factor overflows)" + ("; or run in float64" if where else ""))

    def _check_constant_results(self, dtype: torch.dtype) -> None:
        """A state or output the step sets to a constant must fit the dtype it is stored in
        (float32 cannot hold 1e300: one backend would store inf, another fail)."""
        c = self._compiled
        big = torch.finfo(dtype).max
        for name, v, origin in c.host.constant_results:
            if abs(v) > big:
                ck = c.checked
                decl = next((s for s in ck.states if s.name == name), None)
                sets = [a.pos for a in [*ck.update, *ck.on_spike] if a.target == name and not a.is_let]
                pos = c.step.origins.get(origin) or (sets[-1] if sets else decl.pos if decl else ck.ast.pos)
                what = "state" if decl is not None else "output"
                dname = str(dtype).replace("torch.", "")
                raise self._error(f"the step sets {what} `{name}` to {v:g}, beyond what {dname} holds "
                                  f"({big:.3g})", pos, "run in float64 (m.double() and a float64 input), or "
                                                       "rescale the model")

    # ------------------------------------------------------------------ checkpoints
    def get_extra_state(self) -> dict[str, Any]:
        """The params that are neither Parameters nor buffers (plain floats), so that a
        checkpoint restores the exact model."""
        return {"flexdsl": _EXTRA_STATE_FORMAT, "model": self._compiled.name, "params": dict(self._fixed)}

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
                state.get("flexdsl") != _EXTRA_STATE_FORMAT:
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
                raise self._error(f"the checkpoint has no value for {_names(missing)} of `{name}` (strict=True)",
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

    def _params_changed(self) -> None:
        """Forget what was derived from the params' values."""
        self._init_cache.clear()
        self._dtypes_checked.clear()

    def __getstate__(self) -> dict[str, Any]:
        # a copy keeps the states' values, not the autograd graph of the call that made them
        state = self.__dict__.copy()
        for k in ("_param_decls", "_state_names", "_input_decls", "_init_cache", "_dtypes_checked"):
            state.pop(k, None)
        state["_states"] = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self._states.items()}
        if "_memories" in state:
            state["_memories"] = state["_states"]
        state["state_seqs"] = {k: v.detach() for k, v in self.state_seqs.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        nn.Module.__setstate__(self, state)
        if _Base is not nn.Module:  # (also for a module pickled where SpikingJelly was not installed)
            self.__dict__["_memories"] = self._states
            self.__dict__["_memories_rv"] = dict.fromkeys(self._states)
            self.__dict__.setdefault("_step_mode", state.get("step_mode", "m"))
        self._derive_fields()

    # ------------------------------------------------------------------ states
    @property
    def state_names(self) -> list[str]:
        """The model's states, in declaration order."""
        return list(self._state_names)

    def _initial_value(self, name: str) -> Any:
        st = next(s for s in self._compiled.checked.states if s.name == name)
        try:
            return evaluate(st.init, self.param_values())
        except (ArithmeticError, ValueError) as e:
            raise self._error(f"the initial value of `{name}` cannot be evaluated with these params: {e}",
                              st.init.pos) from None

    def _initial_values(self) -> dict[str, Any]:
        """Initial values from the current params (cached while every param is a float)."""
        # (keyed by the floats' bits: 0.0 and -0.0 may start a state differently)
        key = _bits(self._fixed.values()) if not self._parameters and not self._buffers else None
        hit = self._init_cache.get(key) if key is not None else None
        if hit is None:
            hit = {s: self._initial_value(s) for s in self._state_names}
            if key is not None and not torch.compiler.is_compiling():  # no side effects in a trace
                if len(self._init_cache) > 64:
                    self._init_cache.clear()
                self._init_cache[key] = hit
        return hit

    def initial_state(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every state at its initial value, shaped for these inputs (one step's shape, in the
        inputs' dtype and device): the `state` of the functional form `m(x, state)`."""
        xs, shape = self._check_inputs(inputs)
        x0 = xs[0]
        out = {}
        for name, v in self._initial_values().items():
            if isinstance(v, torch.Tensor):
                v = v.to(device=x0.device, dtype=x0.dtype)
            out[name] = torch.zeros(shape, dtype=x0.dtype, device=x0.device) + v
        return out

    def reset(self) -> None:
        """Restore the initial states (SpikingJelly's `functional.reset_net` calls this)."""
        for k in self._states:
            self._states[k] = None
        self.state_seqs = {}

    def detach(self) -> None:
        """Cut the kept states from the graph of earlier calls (truncated BPTT; SpikingJelly's
        `functional.detach_net` calls this)."""
        for k, v in self._states.items():
            if isinstance(v, torch.Tensor):
                self._states[k] = v.detach()
        self.state_seqs = {k: v.detach() for k, v in self.state_seqs.items()}

    def _apply(self, fn, recurse: bool = True):
        """`.to()`, `.cuda()`, `.half()`... also move the kept states, and prepare the kernels of
        the device the module moves to (so that a first call under torch.compile finds them)."""
        out = nn.Module._apply(self, fn, recurse)  # (MemoryModule._apply would move the states once more)
        self._dtypes_checked.clear()  # (.half() rounds the buffers: checked again at the next call)
        for k, v in self._states.items():  # in place: the dict is also SpikingJelly's memories
            if isinstance(v, torch.Tensor):
                self._states[k] = fn(v)
        self.__dict__["state_seqs"] = {k: fn(v) for k, v in self.state_seqs.items()}
        try:
            self._prepare(fn(torch.empty(0)).device)
        except (RuntimeError, TypeError):
            pass
        return out

    def _prepare(self, device: torch.device | None) -> None:
        """Load the programs a call will use, outside any torch.compile trace: the chosen backend,
        or for "auto" the kernels when a CUDA device is in sight."""
        c = self._compiled
        if self.backend != "auto":
            c.program(self.backend)
            return
        c.program("torch")
        cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
        if cuda:
            for name in backends.auto_names():
                b = backends.get(name)
                if name != "torch" and b.available():
                    c.program(b)

    # ------------------------------------------------------------------ compute
    @property
    def compiled(self) -> Compiled:
        return self._compiled

    @property
    def neuron_text(self) -> str:
        """The `.neuron` text this module was compiled from (`flexdsl.compile(text)` gives it back)."""
        return self._compiled.text

    @property
    def detach_reset(self) -> bool:
        """Whether the reset sees the spike detached from the graph (set at load; assigning it
        switches to the other compiled variant)."""
        return self._compiled.detach_reset

    @detach_reset.setter
    def detach_reset(self, value: bool) -> None:
        c = self._compiled
        if bool(value) != c.detach_reset:
            self.__dict__["_compiled"] = compile_text(c.text, c.filename, bool(value))
            self._params_changed()
            self._prepare(None)

    def _core_params(self, values: Sequence[Any] | None = None) -> list[Any]:
        """The params `core` takes: the declared ones (`values`, default the module's), then
        those derived from them."""
        if values is None:
            values = [getattr(self, name) for name in self._param_decls]
        out = []
        for v in self._compiled.with_derived(values):
            out.append(torch.tensor(v, dtype=torch.float64) if isinstance(v, float) else v)
        return out

    @property
    def core(self):
        """The generated single-step function with the module's params (read at each call):
        core(*inputs, *states) -> (*outputs, *new_states)."""
        fn = self._compiled.torch_module.core

        def core(*args):
            return fn(*args, *self._core_params())

        return core

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

    def _states_for(self, x0: torch.Tensor, shape: torch.Size, given: Mapping[str, Any] | None) -> list[Any]:
        """Each state's value for a call: given, kept from the last call, or initial."""
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
                    v = v.to(device=x0.device, dtype=x0.dtype)
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

    def _run(self, inputs: Sequence[Any], given: Mapping[str, Any] | None, store_seqs: bool):
        xs, shape = self._check_inputs(inputs)
        x0 = xs[0]
        program = self._compiled.program(backends.choose(self.backend, xs))
        if not torch.compiler.is_compiling():  # the params in the precision this call computes in, once
            dt = getattr(program, "computes_in", None) or x0.dtype
            if (dt, x0.dtype) not in self._dtypes_checked:
                if dt != torch.float64:
                    self._check_invariants(None, dt)
                self._check_constant_results(x0.dtype)
                self._dtypes_checked.add((dt, x0.dtype))
        params = self._param_list()
        if self._parameters or self._buffers:
            for name, v in zip(self._param_decls, params):
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    if v.device != x0.device:
                        raise self._error(f"param `{name}` is on {v.device} but the input is on {x0.device}",
                                          self._param_decls[name].pos, "move the module: m.to(device)")
                    if v.shape != shape and (v.dim() > len(shape) or any(
                            p != 1 and p != s for p, s in zip(v.shape[::-1], shape[::-1]))):
                        raise self._error(f"param `{name}` has shape {tuple(v.shape)}, which does not broadcast to "
                                          f"the input's step shape {tuple(shape)}", self._param_decls[name].pos,
                                          "per-channel values broadcast like torch tensors against one step of "
                                          "the input (e.g. shape (C,) for [T, B, C], (C, 1, 1) for [T, B, C, H, W])")
        params = self._compiled.with_derived(params)
        init = self._states_for(x0, shape, given)
        try:
            res = program.run(xs, init, params, store_seqs=store_seqs or bool(self.check_finite))
        except RuntimeError:
            escaped = [n for n, v in zip(self._state_names, init) if given is None and _vmapped(v)]
            if escaped:  # (looked for only on failure: nothing on the path of a call)
                raise self._error(f"the kept state `{escaped[0]}` comes from a call inside torch.func.vmap, and "
                                  "cannot be used outside it", hint="call m.reset() after a vmapped call, or use "
                                  "the functional form out, state = m.step(x, state) inside vmap") from None
            raise
        if self.check_finite:
            from .finite import check

            check(self._compiled, xs, init, params, res)
            if not store_seqs:
                res.seqs = None
        outs = [o[0] for o in res.outputs] if self.step_mode == "s" else res.outputs
        return (outs[0] if len(outs) == 1 else tuple(outs)), res

    def forward(self, *inputs: Any):
        if len(inputs) == len(self._input_decls) + 1 and (inputs[-1] is None or isinstance(inputs[-1], Mapping)):
            return self.step(*inputs[:-1], state=inputs[-1])
        out, res = self._run(inputs, None, bool(self.store_state_seqs))
        for name, s in zip(self._state_names, res.states):
            self._states[name] = s
        if res.seqs is not None:
            self.state_seqs = dict(zip(self._state_names, res.seqs))
        return out

    def step(self, *inputs: Any, state: Mapping[str, Any] | None = None):
        """The functional form: `out, state = m.step(x, state)` runs the inputs from `state`
        (a dict of the model's states; None or empty: initial values) and returns the outputs
        and the new state, leaving the module's kept states untouched. Params are read live;
        on CUDA a multi-step input runs on the Triton kernels."""
        if len(inputs) == len(self._input_decls) + 1 and (inputs[-1] is None or isinstance(inputs[-1], Mapping)):
            inputs, state = inputs[:-1], inputs[-1]
        if state is not None and not isinstance(state, Mapping):
            raise self._error(f"`state` must be a dict of the model's states, not {type(state).__name__}",
                              hint=f"states: {', '.join(self._state_names)}; see m.initial_state(x)")
        if state:
            unknown = [k for k in state if k not in self._states]
            if unknown:
                raise self._error(f"`{unknown[0]}` is not a state of {self._compiled.name}",
                                  hint=did_you_mean(str(unknown[0]), self._state_names) or
                                  f"states: {', '.join(self._state_names)}")
            state = {k: self._state_value(k, v, "as given") for k, v in state.items()}
        out, res = self._run(inputs, dict(state) if state else {}, False)
        return out, dict(zip(self._state_names, res.states))

    def _repr_html_(self) -> str | None:
        """Notebooks: the model's documentation, with this module's param values."""
        return display.show("html", self)

    def _repr_latex_(self) -> str | None:
        return display.show("latex", self)

    def extra_repr(self) -> str:
        c = self._compiled
        fixed = ", ".join(f"{k}={v:g}" for k, v in self._fixed.items())
        return (f"{c.name} from {c.filename}: step_mode={self.step_mode!r}, backend={self.backend!r}, "
                f"detach_reset={self.detach_reset}" + (f", {fixed}" if fixed else ""))


def resolve_params(c: Compiled, overrides: dict[str, Any]) -> dict[str, Any]:
    """Param values in declaration order: overrides, else defaults (which may use earlier
    params); every `where` constraint checked. A one-element tensor becomes a float; a tensor
    of several elements is a per-channel value (its shape is the param's)."""
    ck = c.checked
    names = [p.name for p in ck.params]
    for k in overrides:
        if k not in names:
            raise FlexDSLError(f"`{ck.name}` has no param `{k}`", c.filename, ck.ast.pos.line, ck.ast.pos.column,
                               c.text, did_you_mean(k, names) or ("params: " + ", ".join(names) if names else None))
    env: dict[str, Any] = {}
    for p in ck.params:
        if p.name in overrides:
            v = param_value(ck, p.name, overrides[p.name], unit_definition)  # "20 ms": to the declared unit
            if isinstance(v, torch.Tensor) and v.requires_grad and not p.learnable:
                raise FlexDSLError(f"`{p.name}` is not learnable, so a tensor that requires grad would lose its "
                                   "gradient", c.filename, p.pos.line, p.pos.column, c.text,
                                   f"declare it `param {p.name} = ... learnable` to train it, or pass "
                                   "`value.detach()`")
            v = param_number(c, p, v, "the override")
            if isinstance(v, torch.Tensor):
                v = v.detach().item() if v.numel() == 1 else v.detach().to(torch.float64)
        else:
            try:
                v = evaluate(p.default, env)
            except (ArithmeticError, ValueError) as e:
                raise FlexDSLError(f"the default of `{p.name}` cannot be evaluated with these params: {reason(e)}",
                                   c.filename, p.default.pos.line, p.default.pos.column, c.text) from None
            finite = bool(torch.isfinite(v).all()) if isinstance(v, torch.Tensor) else math.isfinite(v)
            if not finite:
                raise FlexDSLError(f"the default of `{p.name}` is {_show(v)} with these params: params are finite "
                                   "numbers", c.filename, p.default.pos.line, p.default.pos.column, c.text,
                                   "an overflow (or a NaN) among the params it is computed from")
        env[p.name] = v
        if p.where is not None and not constraint_holds(c, p, env):
            what = "the override" if p.name in overrides else "the default"
            raise FlexDSLError(f"{what} `{p.name} = {_show(v)}` violates the constraint of `{p.name}`", c.filename,
                               p.where.pos.line, p.where.pos.column, c.text,
                               f"`{p.name}` must satisfy: {A.constraint_text(c.text, p.where)}")
    return env


def param_number(c: Compiled, p: A.Param, v: Any, what: str) -> Any:
    """A param's value from outside the model text (an override, an assignment, a checkpoint),
    checked: a real number (a float) or a real tensor with at least one element, finite.
    Anything else is a located error; nothing raw reaches torch."""
    if isinstance(v, torch.Tensor):
        if v.dtype == torch.bool or v.is_complex() or not (v.is_floating_point() or v.dtype in _INT_DTYPES):
            raise _override_error(c, p, f"a tensor of dtype {v.dtype}")
        if v.numel() == 0:
            raise FlexDSLError(f"{what} `{p.name}` is an empty tensor", c.filename, p.pos.line, p.pos.column, c.text,
                               "a per-channel value has one value per channel (at least one)")
        if v.is_floating_point() and not bool(torch.isfinite(v.detach()).all()):
            bad = v.detach().reshape(-1)[~torch.isfinite(v.detach().reshape(-1))][0].item()
            raise _nonfinite_error(c, p, what, f"{bad}" + (" (in a per-channel value)" if v.numel() > 1 else ""))
        return v
    if isinstance(v, bool) or v is None:
        raise _override_error(c, p, repr(v))
    try:
        f = read_number(v) if isinstance(v, str) else float(v)  # (text as the language reads numbers)
    except OverflowError:
        raise FlexDSLError(f"{what} `{p.name}` is too large for a float: {_clip(repr(v))}", c.filename, p.pos.line,
                           p.pos.column, c.text, "params are float64 numbers (at most about 1.8e308)") from None
    except (TypeError, ValueError):
        raise _override_error(c, p, _clip(repr(v))) from None
    if not math.isfinite(f):
        raise _nonfinite_error(c, p, what, repr(f))
    return f


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _nonfinite_error(c: Compiled, p: A.Param, what: str, shown: str) -> FlexDSLError:
    return FlexDSLError(f"{what} `{p.name}` is {shown}: params are finite numbers", c.filename, p.pos.line,
                        p.pos.column, c.text, "NaN or inf would make every value computed from it NaN or "
                                              "meaningless; a `where` constraint bounds a param further")


def constraint_holds(c: Compiled, p: A.Param, env: Mapping[str, Any]) -> bool:
    """Whether `p`'s `where` constraint holds for these values; a constraint that cannot be
    evaluated (a division by zero, the log of a negative number...) is a located error."""
    assert p.where is not None
    try:
        return holds(p.where, env)
    except (ArithmeticError, ValueError) as e:
        shown = ", ".join(f"{k} = {_show(env[k])}" for k in _names_in(p.where) if k in env)
        raise FlexDSLError(f"the constraint of `{p.name}` cannot be evaluated with {shown or 'these params'}: "
                           f"{reason(e)}", c.filename, p.where.pos.line, p.where.pos.column, c.text,
                           f"`{p.name}` must satisfy: {A.constraint_text(c.text, p.where)}") from None


def _names_in(e: A.Expr) -> list[str]:
    out: list[str] = []
    for n in A.nodes(e):
        if isinstance(n, A.Name) and n.id not in out:
            out.append(n.id)
    return out


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:6]) + (", ..." if len(names) > 6 else "")
    return ("the param " if len(names) == 1 else "the params ") + shown


def _override_error(c: Compiled, p: A.Param, what: str) -> FlexDSLError:
    return FlexDSLError(f"`{p.name}` takes a number or a float tensor, not {what}", c.filename, p.pos.line,
                        p.pos.column, c.text, f"e.g. {p.name}=2.0 or {p.name}=torch.tensor([2.0, 3.0])")


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


def _broadcasts_to(a: Sequence[int], b: Sequence[int]) -> bool:
    try:
        return tuple(torch.broadcast_shapes(tuple(a), tuple(b))) == tuple(b)
    except RuntimeError:
        return False


_is_batched = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None)


def _vmapped(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and _is_batched is not None and bool(_is_batched(v))


def _bits(vals) -> bytes:
    vals = list(vals)
    return struct.pack(f"{len(vals)}d", *vals)


def _show(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor{tuple(v.shape)}" if v.numel() > 1 else f"{v.item():g}"
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return repr(v)
