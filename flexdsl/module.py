"""Stage 6: the runtime. `NeuronModule` is the torch.nn.Module of LANGUAGE.md §7."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import ast as A
from .compiler import Compiled
from .errors import FlexDSLError, did_you_mean
from .evaluate import evaluate, holds

BACKENDS = ("auto", "torch", "triton")


def triton_available() -> bool:
    """Whether the Triton backend can run here (a GPU, or TRITON_INTERPRET=1 on the CPU)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True
STEP_MODES = ("s", "m")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
        if step_mode not in STEP_MODES:
            raise FlexDSLError(f"step_mode must be 's' or 'm', not {step_mode!r}", c.filename)
        if backend not in BACKENDS:
            raise FlexDSLError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}", c.filename,
                               hint=did_you_mean(str(backend), BACKENDS))
        if backend == "triton" and not triton_available():
            raise FlexDSLError("backend='triton' needs the `triton` package, which cannot be imported here",
                               c.filename, hint="install triton, or use backend='auto' or 'torch'")
        self.step_mode = step_mode
        self.backend = backend
        self.store_state_seqs = store_state_seqs
        self.detach_reset = c.detach_reset
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

    def _use_triton(self, x0: torch.Tensor) -> bool:
        if self.backend == "torch":
            return False
        if self.backend == "triton":
            if x0.dtype not in TRITON_DTYPES:
                raise FlexDSLError(f"the Triton kernels take float32, float16 or bfloat16 inputs, not {x0.dtype}",
                                   self._compiled.filename, hint="use backend='torch' for float64")
            return True
        return x0.is_cuda and x0.dtype in TRITON_DTYPES and triton_available()

    def _init_states(self, x0: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for name in self._state_names:
            v = self._states[name]
            if v is None or not isinstance(v, torch.Tensor):
                init = self._initial_value(name) if v is None else v
                v = torch.zeros_like(x0) + (init.to(x0.dtype) if isinstance(init, torch.Tensor) else init)
                v = v.to(x0.device)
            out.append(v)
        return out

    def forward(self, *inputs: torch.Tensor):
        c = self._compiled
        n_in = len(c.checked.inputs)
        if len(inputs) != n_in:
            names = ", ".join(i.name for i in c.checked.inputs)
            raise TypeError(f"{c.name} takes {n_in} input{'s' if n_in != 1 else ''} ({names}), got {len(inputs)}")
        x0 = inputs[0]
        if self._use_triton(x0):
            from .triton_backend import forward_triton

            return forward_triton(self, inputs)
        if self.step_mode == "s":
            seq = [tuple(inputs)]
        else:
            seq = [tuple(x[t] for x in inputs) for t in range(x0.shape[0])]
            if x0.shape[0] == 0:
                return self._empty(inputs)
        dtype = x0.dtype
        states = self._init_states(seq[0][0])
        params = self._core_params()
        fn = c.torch_module.core
        n_out = len(c.checked.outputs)
        outs: list[list[torch.Tensor]] = [[] for _ in range(n_out)]
        seqs: list[list[torch.Tensor]] = [[] for _ in states]
        for xs in seq:
            res = fn(*xs, *states, *params)
            res = [r.to(dtype) if isinstance(r, torch.Tensor) and r.dtype != dtype else r for r in res]
            res = [r if isinstance(r, torch.Tensor) else torch.full_like(xs[0], r) for r in res]
            for i in range(n_out):
                outs[i].append(res[i])
            states = list(res[n_out:])
            if self.store_state_seqs:
                for i, s in enumerate(states):
                    seqs[i].append(s)
        for name, s in zip(self._state_names, states):
            self._states[name] = s
        if self.step_mode == "s":
            result = [o[0] for o in outs]
            if self.store_state_seqs:
                self.state_seqs = {n: s[0].unsqueeze(0) for n, s in zip(self._state_names, seqs)}
        else:
            result = [torch.stack(o) for o in outs]
            if self.store_state_seqs:
                self.state_seqs = {n: torch.stack(s) for n, s in zip(self._state_names, seqs)}
        return result[0] if n_out == 1 else tuple(result)

    def _empty(self, inputs):
        x = inputs[0]
        n_out = len(self._compiled.checked.outputs)
        res = [x.new_zeros(x.shape) for _ in range(n_out)]
        if self.store_state_seqs:
            self.state_seqs = {n: x.new_zeros(x.shape) for n in self._state_names}
        return res[0] if n_out == 1 else tuple(res)

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
        v = overrides[p.name] if p.name in overrides else evaluate(p.default, env)
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
