"""Where a loaded model's params live and how they change: floats (`_fixed`, mirrored in the
float64 tensor `_fixed_t` that a torch.compile trace reads), buffers (per-channel values),
Parameters (learnable params). Every assignment is converted to what would be stored and
validated with every other param (finite, `where` constraints, a defined step) before anything
changes. A mixin of `NeuronModule`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..backends.base import transformed
from ..errors import did_you_mean
from ..frontend import ast as A
from ..frontend.bounds import RAW_PREFIX
from ..frontend.convert import param_value
from ..store.pipeline import unit_definition
from . import bounds
from .params import broadcasts_to, check_invariants, common_shape, constraint_holds, param_number, show


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
        every other param (finite, `where` constraints, a defined step) before anything changes.
        A bounded learnable param stores the raw value that gives it (`runtime/bounds.py`); a
        learnable param that a torch tool has taken over (a parametrization, a weight_norm-style
        wrapper) takes the tool's value."""
        p = self._param_decls[name]
        c = self._compiled
        if name in self._bounds and _swapping():  # torch.func.functional_call(m, {name: t}) and its restore
            values = self.__dict__["_values"]
            if name in values:
                del values[name]
            else:
                values[name] = value
            return
        value = param_value(c.checked, name, value, unit_definition)  # "20 ms": to the declared unit
        if isinstance(value, torch.Tensor) and value.requires_grad and not p.learnable:
            raise self._error(f"`{name}` is not learnable, so a tensor that requires grad would lose its gradient",
                              p.pos, f"declare it `param {name} = ... learnable` to train it, or assign "
                                     "`value.detach()`")
        if name in self._bounds:
            self._assign_bounded(name, value)
            return
        if p.learnable and name not in self._parameters:
            self._assign_taken(name, value)
            return
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
                new = self._fitting(name, value, param)
        else:
            buf = self._buffers[name]
            t = torch.as_tensor(value, dtype=buf.dtype, device=buf.device)
            new = t.clone() if t.numel() > 1 else t.reshape(()).expand_as(buf).clone()
        kept = self._validate({name: new}, {name: value})
        # every check passed and everything to store is computed: store (nothing below raises)
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
        self._keep_bounded(kept)
        self._params_changed()

    def _fitting(self, name: str, value: Any, param: torch.Tensor) -> torch.Tensor:
        """A value for a learnable param's tensor, in its dtype and shape."""
        t = torch.as_tensor(value, dtype=param.dtype, device=param.device)
        if t.numel() == 1:  # (one value, whatever its shape)
            t = t.reshape(())
        if not broadcasts_to(t.shape, param.shape):
            raise self._error(f"learnable `{name}` has shape {tuple(param.shape)}; a value of shape "
                              f"{tuple(t.shape)} does not fit", self._param_decls[name].pos,
                              "per-channel learnable params get their shape at load: param_shapes=...")
        return t.expand_as(param)

    def _assign_bounded(self, name: str, value: Any) -> None:
        """A bounded learnable param takes a value: its raw Parameter is set to give it."""
        p = self._param_decls[name]
        b = self._bounds[name]
        if isinstance(value, nn.Parameter):
            raise self._error(f"`{name}` is bounded, so it trains as the Parameter `{b.raw}` ({b.formula()})", p.pos,
                              f"assign a value to m.{name} (its Parameter is set to give it), or a Parameter to "
                              f"m.{b.raw}")
        value = param_number(self._compiled, p, value, "the assigned value")
        raw = self._raw_tensor(name)
        shaped = self._fitting(name, value.detach() if isinstance(value, torch.Tensor) else value,
                               raw.to(torch.float64)).to(torch.float64)
        kept = self._validate({name: shaped}, {name: value})
        env = self._param_env() | {name: shaped}
        if not bounds.inside(b, shaped, env):
            raise self._on_bound(name, value)
        new = self._raw_for(name, shaped, env, raw)
        # every check passed and everything to store is computed: store (nothing below raises)
        with torch.no_grad():
            raw.copy_(new)
        self._keep_bounded(kept)
        self._params_changed()

    def _assign_taken(self, name: str, value: Any) -> None:
        """A learnable param whose Parameter a torch tool moved away: a parametrization's property
        takes the value (its right inverse), a wrapper's tensor (old-style `weight_norm`,
        `spectral_norm`: set before each forward) is used as the value, with its graph."""
        prop = getattr(type(self), name, None)
        if isinstance(prop, property):  # (validated as given: the parametrization's right inverse stores it)
            checked = param_number(self._compiled, self._param_decls[name], value, "the assigned value")
            self._validate({name: checked.detach() if isinstance(checked, torch.Tensor) else checked}, {name: value})
            object.__setattr__(self, name, value)
            self._params_changed()
            return
        if not isinstance(value, torch.Tensor):
            raise self._error(f"learnable `{name}` is no Parameter of this module any more (a torch tool took it "
                              "over), so it takes a tensor", self._param_decls[name].pos,
                              f"e.g. m.{name} = torch.tensor(...), or remove the tool first")
        value = param_number(self._compiled, self._param_decls[name], value, "the assigned value")
        if not transformed(value) and not torch.compiler.is_compiling():
            self.__dict__["_installing"] = True  # (the first assignment: the module holds no value yet)
            try:
                self._validate({name: value}, {name: value.detach()})
            finally:
                self.__dict__["_installing"] = False
        if isinstance(value, nn.Parameter):  # (the tool gives the Parameter back: remove_weight_norm)
            self.__dict__["_values"].pop(name, None)
            nn.Module.__setattr__(self, name, value)
        else:
            self.__dict__["_values"][name] = value
        self._params_changed()

    def _validate(self, changed: Mapping[str, Any], shown: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Raise unless the params, with `changed` (name -> the value as it would be stored),
        are finite, broadcast together, satisfy every `where` constraint and define the step;
        nothing is stored. A bounded param whose bounds follow a changed param keeps its value,
        which must stay inside them and be one its Parameter can give: the raw values that keep
        them are returned, computed (for `_keep_bounded`, which only copies them)."""
        c = self._compiled
        env = self._param_env()
        for k, v in changed.items():
            env[k] = param_number(c, self._param_decls[k], v.detach() if isinstance(v, torch.Tensor) else v,
                                  "the new value of")
        common_shape(c, {k: v for k, v in env.items() if k not in changed} | {k: env[k] for k in changed})
        self._check_constraints(env, shown)
        kept = {}
        for n, b in self._bounds.items():
            if n in changed or not b.names() & set(changed):
                continue
            if not bounds.inside(b, env[n], env):
                what = ", ".join(f"`{k} = {show(v)}`" for k, v in shown.items())
                raise self._error(f"{what} puts learnable `{n} = {show(env[n])}` on its bound ({b.formula()})",
                                  self._param_decls[n].pos, "a bounded learnable param stays strictly inside its "
                                                            "bounds: change its value first")
            kept[n] = self._raw_for(n, env[n], env, self._raw_tensor(n))
        self._check_invariants([env[n] for n in self._param_decls])
        return kept

    def _on_bound(self, name: str, v: Any) -> Exception:
        b = self._bounds[name]
        return self._error(f"learnable `{name} = {show(v)}` lies on the bound of `{name}`, which training never "
                           f"reaches (nor a value nearer to a strict bound than float64's smallest normal number, "
                           f"2.2e-308): `{name}` trains as {b.formula()}", self._param_decls[name].pos,
                           f"give `{name}` a value strictly inside its bounds (a little away from the bound), or "
                           "load it as not learnable (learnable=...)")

    def _keep_bounded(self, kept: Mapping[str, torch.Tensor]) -> None:
        """Bounded params whose bounds moved keep their values: their raw values, computed by
        `_validate`, are stored."""
        for n, r in kept.items():
            with torch.no_grad():
                self._raw_tensor(n).copy_(r)

    def _raw_tensor(self, name: str) -> torch.Tensor:
        """A bounded param's raw Parameter (or what a torch tool put in its place)."""
        b = self._bounds[name]
        raw = self._parameters.get(b.raw)
        return raw if raw is not None else getattr(self, b.raw)

    def _raw_for(self, name: str, v: Any, env: Mapping[str, Any], like: torch.Tensor) -> torch.Tensor:
        """The raw value that gives a bounded param the value `v`, shaped and typed like `like`
        (a located error where a raw value of that shape cannot: bounds per channel, one raw value)."""
        b = self._bounds[name]
        r = bounds.raw(b, v, env, like.dtype, like.device)
        fitted = _fit(r, like.shape)
        if fitted is None:
            raise self._error(f"learnable `{name}` trains as {b.formula()}: its Parameter `{b.raw}` has shape "
                              f"{tuple(like.shape)}, and `{name} = {show(v)}` with these bounds needs a raw value of "
                              f"shape {tuple(r.shape)}", self._param_decls[name].pos,
                              f"give `{name}` a value per channel at load: param_shapes={{'{name}': {tuple(r.shape)}}}")
        return fitted

    def _param_env(self) -> dict[str, Any]:
        return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self.param_values().items()}

    @property
    def _bounds(self) -> dict[str, Any]:
        """Bounded learnable params: name -> Bound (frontend/bounds.py)."""
        return self._compiled.checked.bounds

    def _check_constraints(self, env: Mapping[str, Any], changed: Mapping[str, Any]) -> None:
        """Every `where` constraint (cross-param ones included) on these param values."""
        for p in self._param_decls.values():
            if p.where is not None and not constraint_holds(self._compiled, p, env):
                what = ", ".join(f"`{k} = {show(v)}`" for k, v in changed.items())
                raise self._error(f"{what} violates the constraint of `{p.name}`", p.where.pos,
                                  f"`{p.name}` must satisfy: {A.constraint_text(self._compiled.text, p.where)}")

    def _param_list(self, call: tuple[torch.dtype | None, ...] = ()) -> list[Any]:
        """Every param's current value, in declaration order (`call`: the dtypes of a call, which
        a bounded param's value is inside its bounds in: `runtime/bounds.py`)."""
        fixed = self._fixed
        if len(fixed) == len(self._param_decls):
            return [fixed[n] for n in self._param_decls]
        return self._with_bounds([fixed[n] if n in fixed else self._slot(n) for n in self._param_decls], call)

    def _slot(self, n: str, kind: str | None = None) -> Any:
        """A param's tensor where it lives: a buffer, a Parameter (or its replacement under
        torch.func.functional_call), a bounded param's raw Parameter, or what a torch tool holds
        in their place (a parametrization's property, a wrapper's tensor)."""
        if kind is None:
            kind = "b" if n in self._buffers else "c" if n in self._bounds else "p"
        if kind == "b":
            return self._buffers[n]
        values = self.__dict__["_values"]
        if kind == "c":
            if n in values:  # (functional_call's value, used as given)
                return values[n]
            raw = self._parameters.get(RAW_PREFIX + n)
            return raw if raw is not None else getattr(self, RAW_PREFIX + n)
        p = self._parameters.get(n)
        if p is not None:
            return p
        if n in values:
            return values[n]
        v = getattr(self, n, None)  # (a parametrization's property; None while a wrapper installs itself)
        if v is None and not self.__dict__.get("_installing"):
            raise self._error(f"learnable `{n}` has no value: its Parameter was removed from the module",
                              self._param_decls[n].pos, f"assign one: m.{n} = torch.nn.Parameter(...)")
        return v

    def _with_bounds(self, vals: list[Any], call: tuple[torch.dtype | None, ...] = ()) -> list[Any]:
        """`vals` with each bounded param's raw value replaced by the param's value (in
        declaration order, so that a bound of an earlier bounded param sees its value)."""
        if not self._bounds:
            return vals
        names = list(self._param_decls)
        values = self.__dict__["_values"]
        for i, n in enumerate(names):
            b = self._bounds.get(n)
            if b is not None and n not in values:
                vals[i] = bounds.value(b, vals[i], dict(zip(names, vals)), call)
        return vals

    def _sync_fixed(self) -> None:
        """Copy the float params into `_fixed_t` (after any change of `_fixed`)."""
        t = self.__dict__["_fixed_t"]
        fixed = self._fixed
        vals = [fixed.get(n, 0.0) for n in self._param_decls]
        # where each param lives ("f": a float, "p": a Parameter, "b": a buffer, "c": a bounded
        # learnable param's raw Parameter), read by a trace instead of the dict of floats (whose
        # values it would guard)
        self.__dict__["_param_kinds"] = tuple(
            "f" if n in fixed else "c" if n in self._bounds else "p" if p.learnable else "b"
            for n, p in self._param_decls.items())
        if t.numel() != len(vals):  # (a module pickled before the tensor existed)
            t = self.__dict__["_fixed_t"] = torch.zeros(len(vals), dtype=torch.float64)
        with torch.no_grad():
            t.copy_(torch.tensor(vals, dtype=torch.float64))

    def _traced_param_list(self, fixed: torch.Tensor | None = None,
                           call: tuple[torch.dtype | None, ...] = ()) -> list[Any]:
        """Every param's value as a tensor, for a torch.compile trace: the float params are
        entries of `_fixed_t` (or of `fixed`, its checked copy: `runtime/callcheck.py`), so that
        the graph takes them as inputs (a new value of a non-learnable param recompiles nothing)
        and no float is read (and guarded)."""
        t = self._fixed_t if fixed is None else fixed
        return self._with_bounds([t[i] if k == "f" else self._slot(n, k)
                                  for i, (n, k) in enumerate(zip(self._param_decls, self._param_kinds))], call)

    def param_values(self) -> dict[str, Any]:
        """Current value of every param (floats, buffers, Parameters, or a bounded param's value
        computed from its Parameter)."""
        return dict(zip(self._param_decls, self._param_list()))

    def _check_invariants(self, values: Sequence[Any] | None = None, dtype: torch.dtype | None = None) -> None:
        """The params define the step (`params.check_invariants`): `values` every param's value
        (default: the module's), `dtype` the precision of a call (default float64)."""
        if values is None:
            values = self._param_list()
        check_invariants(self._compiled, self._param_decls, values, dtype)

    def _params_changed(self) -> None:
        """Forget what was derived from the params' values."""
        self._init_cache.clear()
        self._dtypes_checked.clear()
        self._sync_fixed()


def _fit(r: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """`r` in `shape`: broadcast to it, or reduced to it where `r` is the same along the sizes
    `shape` lacks (bounds per channel that are equal); None where it differs there."""
    if r.shape == shape:
        return r
    if broadcasts_to(r.shape, shape):
        return r.expand(shape).clone()
    lead = r.dim() - len(shape)
    if lead < 0 or not broadcasts_to(shape, r.shape):
        return None
    dims = [i for i in range(r.dim()) if i < lead or (shape[i - lead] == 1 and r.shape[i] != 1)]
    first = r.amin(dim=dims, keepdim=True)
    if not torch.equal(first.expand_as(r), r):
        return None
    return first.reshape(shape)


def _swapping() -> bool:
    """Whether the caller is torch's `swap_tensor` (`torch.func.functional_call` swapping a value
    in or back), read from the frames (as `checkpoints._loading_strictly` reads load_state_dict's)."""
    from torch.nn.utils import _named_member_accessor as accessor

    code = accessor.swap_tensor.__code__
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            return False
        if f.f_code is code:
            return True
        f = f.f_back
    return False


__all__ = ["ParamSlots"]
