"""Where a loaded model's params live and how they change: floats (`_fixed`, mirrored in the
float64 tensor `_fixed_t` that a torch.compile trace reads), buffers (per-channel values),
Parameters (learnable params). Every assignment is converted to what would be stored and
validated with every other param (finite, `where` constraints, a defined step) before anything
changes. A mixin of `NeuronModule`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import did_you_mean
from ..frontend import ast as A
from ..frontend.convert import param_value
from ..store.pipeline import unit_definition
from .params import broadcasts_to, check_invariants, constraint_holds, param_number, show


class ParamSlots:
    """NeuronModule's params: where each lives, assignments, validation."""

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
                if not broadcasts_to(t.shape, param.shape):
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
                what = ", ".join(f"`{k} = {show(v)}`" for k, v in changed.items())
                raise self._error(f"{what} violates the constraint of `{p.name}`", p.where.pos,
                                  f"`{p.name}` must satisfy: {A.constraint_text(self._compiled.text, p.where)}")

    def _param_list(self) -> list[Any]:
        """Every param's current value, in declaration order."""
        fixed = self._fixed
        if len(fixed) == len(self._param_decls):
            return [fixed[n] for n in self._param_decls]
        ps, bs = self._parameters, self._buffers
        return [fixed[n] if n in fixed else ps[n] if n in ps else bs[n] for n in self._param_decls]

    def _sync_fixed(self) -> None:
        """Copy the float params into `_fixed_t` (after any change of `_fixed`)."""
        t = self.__dict__["_fixed_t"]
        fixed = self._fixed
        vals = [fixed.get(n, 0.0) for n in self._param_decls]
        # where each param lives ("f": a float, "p": a Parameter, "b": a buffer), read by a trace
        # instead of the dict of floats (whose values it would guard)
        self.__dict__["_param_kinds"] = tuple("f" if n in fixed else "p" if n in self._parameters else "b"
                                              for n in self._param_decls)
        if t.numel() != len(vals):  # (a module pickled before the tensor existed)
            t = self.__dict__["_fixed_t"] = torch.zeros(len(vals), dtype=torch.float64)
        with torch.no_grad():
            t.copy_(torch.tensor(vals, dtype=torch.float64))

    def _traced_param_list(self) -> list[Any]:
        """Every param's value as a tensor, for a torch.compile trace: the float params are
        entries of `_fixed_t`, so that the graph takes them as inputs (a new value of a
        non-learnable param recompiles nothing) and no float is read (and guarded)."""
        ps, bs, t = self._parameters, self._buffers, self._fixed_t
        return [t[i] if k == "f" else ps[n] if k == "p" else bs[n]
                for i, (n, k) in enumerate(zip(self._param_decls, self._param_kinds))]

    def param_values(self) -> dict[str, Any]:
        """Current value of every param (floats, buffers or Parameters)."""
        return {name: getattr(self, name) for name in self._param_decls}

    def _check_invariants(self, values: Sequence[Any] | None = None, dtype: torch.dtype | None = None) -> None:
        """The params define the step (`params.check_invariants`): `values` every param's value
        (default: the module's), `dtype` the precision of a call (default float64)."""
        if values is None:
            values = [getattr(self, name) for name in self._param_decls]
        check_invariants(self._compiled, self._param_decls, values, dtype)

    def _params_changed(self) -> None:
        """Forget what was derived from the params' values."""
        self._init_cache.clear()
        self._dtypes_checked.clear()
        self._sync_fixed()


__all__ = ["ParamSlots"]
