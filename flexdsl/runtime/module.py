"""The runtime's module: `NeuronModule`, the torch.nn.Module a model is loaded as.

It owns the params (Parameters, buffers or plain floats) and the states between calls, and
talks to the backends only through their interface (`backends.base`): it chooses a backend
from the registry, and passes inputs, states and params explicitly to its program.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import backends
from ..errors import FlexDSLError, did_you_mean
from ..frontend import ast as A
from ..frontend.evaluate import evaluate, holds
from ..frontend.units import param_value
from .compiler import Compiled, compile_model

STEP_MODES = ("s", "m")


def triton_available() -> bool:
    """Whether the Triton backend can run here (a GPU, or TRITON_INTERPRET=1 on the CPU)."""
    return backends.get("triton").available()


class NeuronModule(nn.Module):
    """A neuron layer generated from a `.neuron` model.

    `m(*inputs)`: inputs are `[T, *shape]` (step_mode "m") or `[*shape]` ("s"); returns the
    single output or a tuple in `output` order. States are readable by name after a call.
    """

    def __init__(
        self,
        compiled: Compiled,
        params: Mapping[str, Any] | None = None,
        step_mode: str = "m",
        backend: str = "auto",
        store_state_seqs: bool = False,
        param_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        super().__init__()
        c = compiled
        ck = c.checked
        d = self.__dict__
        d["_compiled"] = c
        d["_param_decls"] = {p.name: p for p in ck.params}
        d["_state_names"] = [s.name for s in ck.states]
        d["_fixed"] = {}
        d["_states"] = dict.fromkeys(d["_state_names"])
        d["state_seqs"] = {}
        d["_init_cache"] = {}
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
        shapes = dict(param_shapes or {})
        for name in shapes:
            if name not in d["_param_decls"]:
                raise self._error(f"param_shapes names unknown param `{name}`", ck.ast.pos,
                                  did_you_mean(name, d["_param_decls"]))
        values = resolve_params(c, dict(params or {}))
        for p in ck.params:
            v = values[p.name]
            shape = tuple(shapes.get(p.name, ()))
            t = torch.full(shape, float(v)) if shape else None
            if p.learnable:
                self.register_parameter(p.name, nn.Parameter(t if t is not None else torch.tensor(float(v))))
            elif t is not None:
                self.register_buffer(p.name, t.to(torch.float64))
            else:
                d["_fixed"][p.name] = float(v)
        self._check_invariants()

    # ------------------------------------------------------------------ errors
    def _error(self, msg: str, pos: A.Pos, hint: str | None = None) -> FlexDSLError:
        c = self._compiled
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
            value = param_value(self._compiled.checked, name, value)  # "20 ms": to the declared unit
            self._check_constraint(name, value)
            self._set_param(name, value)
            self._check_invariants()
            return
        if name in d.get("_states", {}):
            d["_states"][name] = value
            return
        super().__setattr__(name, value)

    def _set_param(self, name: str, value: Any) -> None:
        d = self.__dict__
        if name in d["_fixed"]:
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                del d["_fixed"][name]
                self.register_buffer(name, value.detach().to(torch.float64))
            else:
                d["_fixed"][name] = float(value)
        elif name in self._parameters:
            if isinstance(value, nn.Parameter):
                super().__setattr__(name, value)
            else:
                with torch.no_grad():
                    self._parameters[name].copy_(torch.as_tensor(value))
        else:
            self._buffers[name] = torch.as_tensor(value, dtype=torch.float64).expand_as(self._buffers[name]).clone()

    def param_values(self) -> dict[str, Any]:
        """Current value of every param (floats, buffers or Parameters)."""
        out: dict[str, Any] = {}
        for name in self._param_decls:
            out[name] = getattr(self, name)
        return out

    def _check_invariants(self) -> None:
        """The step's param-only values must be finite (e.g. an `exact` solution is singular
        for equal time constants): a located error names the first that is not."""
        c = self._compiled
        with torch.no_grad():
            vals = c.torch_module.invariants(*(v.detach() if isinstance(v, torch.Tensor) else v
                                               for v in self._core_params()))
        for name, v in vals.items():
            t = torch.as_tensor(v)
            if not bool(torch.isfinite(t).all()):
                eqs = c.checked.equations
                pos = c.step.origins.get(name) or (eqs.pos if eqs is not None else c.checked.ast.pos)
                how = f" (method `{c.method}`)" if c.method else ""
                raise self._error(
                    f"with these params the step is not defined: `{name}`{how} is not finite", pos,
                    "a division by zero or an overflow among the params; with `exact`, equal time constants "
                    "make the closed form singular: change one slightly or use another method")

    def _check_constraint(self, name: str, value: Any) -> None:
        p = self._param_decls[name]
        if p.where is None:
            return
        env = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self.param_values().items()}
        env[name] = value.detach() if isinstance(value, torch.Tensor) else float(value)
        if not holds(p.where, env):
            raise self._error(f"`{name} = {_show(value)}` violates the constraint of `{name}`", p.where.pos,
                              f"`{name}` must satisfy: {_source_of(self._compiled.text, p.where)}")

    # ------------------------------------------------------------------ states
    def _initial_value(self, name: str) -> Any:
        st = next(s for s in self._compiled.checked.states if s.name == name)
        try:
            return evaluate(st.init, self.param_values())
        except (ArithmeticError, ValueError) as e:
            raise self._error(f"the initial value of `{name}` cannot be evaluated with these params: {e}",
                              st.init.pos) from None

    def reset(self) -> None:
        """Restore the initial states (SpikingJelly's `functional.reset_net` calls this)."""
        for k in self._states:
            self._states[k] = None
        self.state_seqs = {}

    # ------------------------------------------------------------------ compute
    @property
    def compiled(self) -> Compiled:
        return self._compiled

    @property
    def detach_reset(self) -> bool:
        """Whether the reset sees the spike detached from the graph (set at load; assigning it
        switches to the other compiled variant)."""
        return self._compiled.detach_reset

    @detach_reset.setter
    def detach_reset(self, value: bool) -> None:
        c = self._compiled
        if bool(value) != c.detach_reset:
            self.__dict__["_compiled"] = compile_model(c.text if c.filename == "<string>" else c.filename,
                                                       bool(value))

    def _core_params(self) -> list[Any]:
        out = []
        for name in self._param_decls:
            v = getattr(self, name)
            out.append(torch.tensor(v, dtype=torch.float64) if isinstance(v, float) else v)
        return out

    @property
    def core(self):
        """The generated single-step function with params bound: core(*inputs, *states) -> (*outputs, *new_states)."""
        params = self._core_params()
        fn = self._compiled.torch_module.core

        def core(*args):
            return fn(*args, *params)

        return core

    def _initial_states(self, like: torch.Tensor) -> list[Any]:
        """Each state's current value, or its initial value (a float, or a tensor for
        per-channel params) where it has none."""
        out: list[Any] = []
        inits = None
        for name in self._state_names:
            v = self._states[name]
            if v is None:
                if inits is None:
                    inits = self._initial_values()
                v = inits[name]
                if isinstance(v, torch.Tensor):
                    v = v.to(device=like.device, dtype=like.dtype)
            out.append(v)
        return out

    def _initial_values(self) -> dict[str, Any]:
        """Initial values from the current params (cached while every param is a float)."""
        key = tuple(self._fixed.values()) if not self._parameters and not self._buffers else None
        hit = self._init_cache.get(key) if key is not None else None
        if hit is None:
            hit = {s: self._initial_value(s) for s in self._state_names}
            if key is not None:
                if len(self._init_cache) > 64:
                    self._init_cache.clear()
                self._init_cache[key] = hit
        return hit

    def forward(self, *inputs: torch.Tensor):
        c = self._compiled
        n_in = len(c.checked.inputs)
        if len(inputs) != n_in:
            names = ", ".join(i.name for i in c.checked.inputs)
            raise TypeError(f"{c.name} takes {n_in} input{'s' if n_in != 1 else ''} ({names}), got {len(inputs)}")
        single = self.step_mode == "s"
        xs = [x.unsqueeze(0) for x in inputs] if single else list(inputs)
        if xs[0].dim() < 1:
            raise FlexDSLError(f"{c.name}: inputs must be [T, *shape] in step_mode 'm'", c.filename)
        backend = backends.choose(self.backend, xs)
        program = c.program(backend)
        params = [getattr(self, name) for name in self._param_decls]
        res = program.run(xs, self._initial_states(xs[0]), params, store_seqs=bool(self.store_state_seqs))
        for name, s in zip(self._state_names, res.states):
            self._states[name] = s
        if self.store_state_seqs and res.seqs is not None:
            self.state_seqs = dict(zip(self._state_names, res.seqs))
        outs = [o[0] for o in res.outputs] if single else res.outputs
        return outs[0] if len(outs) == 1 else tuple(outs)

    def extra_repr(self) -> str:
        c = self._compiled
        fixed = ", ".join(f"{k}={v:g}" for k, v in self._fixed.items())
        return (f"{c.name} from {c.filename}: step_mode={self.step_mode!r}, backend={self.backend!r}, "
                f"detach_reset={self.detach_reset}" + (f", {fixed}" if fixed else ""))


def resolve_params(c: Compiled, overrides: dict[str, Any]) -> dict[str, Any]:
    """Param values in declaration order: overrides, else defaults (which may use earlier
    params); every `where` constraint checked."""
    ck = c.checked
    names = [p.name for p in ck.params]
    for k in overrides:
        if k not in names:
            raise FlexDSLError(f"`{ck.name}` has no param `{k}`", c.filename, ck.ast.pos.line, ck.ast.pos.column,
                               c.text, did_you_mean(k, names) or ("params: " + ", ".join(names) if names else None))
    env: dict[str, Any] = {}
    for p in ck.params:
        v = param_value(ck, p.name, overrides[p.name]) if p.name in overrides else evaluate(p.default, env)
        if isinstance(v, torch.Tensor):
            v = v.detach().item() if v.numel() == 1 else v
        env[p.name] = v
        if p.where is not None and not holds(p.where, env):
            what = "the override" if p.name in overrides else "the default"
            raise FlexDSLError(f"{what} `{p.name} = {_show(v)}` violates the constraint of `{p.name}`", c.filename,
                               p.where.pos.line, p.where.pos.column, c.text,
                               f"`{p.name}` must satisfy: {_source_of(c.text, p.where)}")
    return env


def _show(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor{tuple(v.shape)}" if v.numel() > 1 else f"{v.item():g}"
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return repr(v)


def _source_of(text: str, e: A.Compare) -> str:
    line = text.splitlines()[e.pos.line - 1]
    frag = line[e.pos.column - 1:]
    for stop in (' "', " learnable"):
        i = frag.find(stop)
        if i >= 0:
            frag = frag[:i]
    return frag.strip()
