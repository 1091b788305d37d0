"""The params of a loaded model, without the module: their values from outside the model text
(overrides at load, assignments, checkpoints) checked and resolved in declaration order, `where`
constraints, and the check that the params define the step (finite param-only values, nonzero
param-only denominators), in float64 or in the precision a call computes in.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import FlexDSLError, did_you_mean
from ..frontend import ast as A
from ..frontend.convert import param_value
from ..frontend.evaluate import evaluate, holds, reason
from ..frontend.parse import read_number
from ..store.pipeline import unit_definition

if TYPE_CHECKING:
    from .compiler import Compiled

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
                raise FlexDSLError(f"the default of `{p.name}` is {show(v)} with these params: params are finite "
                                   "numbers", c.filename, p.default.pos.line, p.default.pos.column, c.text,
                                   "an overflow (or a NaN) among the params it is computed from")
        env[p.name] = v
        if isinstance(v, torch.Tensor):
            common_shape(c, env)
        if p.where is not None and not constraint_holds(c, p, env):
            what = "the override" if p.name in overrides else "the default"
            raise FlexDSLError(f"{what} `{p.name} = {show(v)}` violates the constraint of `{p.name}`", c.filename,
                               p.where.pos.line, p.where.pos.column, c.text,
                               f"`{p.name}` must satisfy: {A.constraint_text(c.text, p.where)}")
    return env


def written_scale(ck: Any, name: str) -> float:
    """What one of the unit param `name` is written in makes in the model's base units (`0.02 s`: 1000,
    time in ms; 1 for a param written without a unit): params keep their written numbers."""
    from ..frontend.dims import unit

    written = ck.written.param(name) if getattr(ck, "written", None) is not None else None
    if written is None or not isinstance(written.default, A.Quantity):
        return 1.0
    try:
        return float(unit(written.default.unit)[0]) ** written.default.power
    except Exception:  # noqa: BLE001 - (a compound unit: left as written)
        return 1.0


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
        shown = ", ".join(f"{k} = {show(env[k])}" for k in _names_in(p.where) if k in env)
        raise FlexDSLError(f"the constraint of `{p.name}` cannot be evaluated with {shown or 'these params'}: "
                           f"{reason(e)}", c.filename, p.where.pos.line, p.where.pos.column, c.text,
                           f"`{p.name}` must satisfy: {A.constraint_text(c.text, p.where)}") from None


def _names_in(e: A.Expr) -> list[str]:
    out: list[str] = []
    for n in A.nodes(e):
        if isinstance(n, A.Name) and n.id not in out:
            out.append(n.id)
    return out


def names_of(names: Sequence[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:6]) + (", ..." if len(names) > 6 else "")
    return ("the param " if len(names) == 1 else "the params ") + shown


def _override_error(c: Compiled, p: A.Param, what: str) -> FlexDSLError:
    return FlexDSLError(f"`{p.name}` takes a number or a float tensor, not {what}", c.filename, p.pos.line,
                        p.pos.column, c.text, f"e.g. {p.name}=2.0 or {p.name}=torch.tensor([2.0, 3.0])")


def broadcasts_to(a: Sequence[int], b: Sequence[int]) -> bool:
    try:
        return tuple(torch.broadcast_shapes(tuple(a), tuple(b))) == tuple(b)
    except RuntimeError:
        return False


def step_param(v: torch.Tensor, shape: Sequence[int]) -> torch.Tensor | None:
    """A param's tensor as one step of `shape` takes it -- the one rule of every backend and of
    the recurrent layers: it broadcasts to the step's shape without changing it (aligned from
    the right, each size 1 or the step's), its leading sizes of 1 beyond the step's rank
    dropped (a view: gradients reach the param). None where it does not broadcast so."""
    extra = v.dim() - len(shape)
    if extra > 0:
        if any(n != 1 for n in v.shape[:extra]):
            return None
        v = v.reshape(v.shape[extra:])
    if any(p != 1 and p != s for p, s in zip(v.shape[::-1], tuple(shape)[::-1])):
        return None
    return v


def common_shape(c: Compiled, values: Mapping[str, Any]) -> None:
    """The params' shapes must broadcast together (else no step shape takes them all): a located
    error at the first param that does not."""
    shapes: list[tuple[int, ...]] = []
    for name, v in values.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            try:
                torch.broadcast_shapes(*shapes, tuple(v.shape))
            except RuntimeError:
                p = c.checked.param(name)
                # (sizes broadcast together when they do pairwise: one param clashes with it)
                other = next(n for n, w in values.items() if isinstance(w, torch.Tensor) and _clash(w.shape, v.shape))
                raise FlexDSLError(f"`{name}` of shape {tuple(v.shape)} does not broadcast with `{other}` of shape "
                                   f"{tuple(values[other].shape)}", c.filename, p.pos.line,
                                   p.pos.column, c.text, "per-channel params broadcast together and against one "
                                   "step of the input (e.g. (C,) and (C,) or (1,) for [T, B, C])") from None
            shapes.append(tuple(v.shape))


def _clash(a: Sequence[int], b: Sequence[int]) -> bool:
    try:
        torch.broadcast_shapes(tuple(a), tuple(b))
        return False
    except RuntimeError:
        return True


def bits(vals) -> bytes:
    vals = list(vals)
    return struct.pack(f"{len(vals)}d", *vals)


def show(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor{tuple(v.shape)}" if v.numel() > 1 else f"{v.item():g}"
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return repr(v)


def check_invariants(c: Compiled, decls: Mapping[str, A.Param], values: Sequence[Any], dtype: torch.dtype | None = None
                 ) -> None:
    """The step's param-only values, derived params included, must be finite (e.g. a decay
    factor that overflows) and its param-only denominators nonzero: a located error names
    the first that is not. `values`: every param's value, in declaration order; `dtype`: check
    in the precision a call computes in (default float64), the params rounded to it."""

    def error(msg: str, pos: A.Pos, hint: str | None = None) -> FlexDSLError:
        return FlexDSLError(msg, c.filename, pos.line, pos.column, c.text, hint)

    params = [v.detach() if isinstance(v, torch.Tensor) else v for v in values]
    where = ""
    if dtype is not None:  # (the checked values are computed from the rounded params, then rounded)
        dname = str(dtype).replace("torch.", "")
        where = f" in {dname} (the precision of this call)"
        params = [torch.as_tensor(p, dtype=torch.float64).to(dtype) for p in params]
        for (name, p), v, shown in zip(decls.items(), params, values):
            exact = torch.as_tensor(shown, dtype=torch.float64).detach()
            if bool(((v == 0) & (exact != 0)).any()):
                raise error(f"`{name} = {show(shown)}` is 0 in {dname} (the precision of this call)", p.pos,
                            "run in float64 (m.double() and a float64 input), or rescale the model")
            if not bool(torch.isfinite(v).all()):
                if not bool(torch.isfinite(torch.as_tensor(shown, dtype=torch.float64)).all()):  # (trained)
                    raise error(f"param `{name}` is {show(shown)}: params are finite numbers", p.pos)
                raise error(f"`{name} = {show(shown)}` is beyond what {dname} holds (the precision of "
                                  "this call)", p.pos,
                                  "run in float64 (m.double() and a float64 input), or rescale the model")
    with torch.no_grad():
        vals = c.check_values(params)
    for name, v in vals.items():
        t = torch.as_tensor(v) if dtype is None else torch.as_tensor(v).to(dtype)
        stmt, _, kind = name.partition("|")
        if kind.startswith("denominator") and bool((t == 0).any()):
            pos = c.step.origins.get(stmt) or c.checked.ast.pos
            raise error(f"with these params this statement divides by zero{where}: a denominator that "
                              "depends on params only is 0", pos,
                              "change the params (a `where` constraint on them catches this at load)" if not where
                              else "run in float64 (m.double() and a float64 input), or change the params")
        if not bool(torch.isfinite(t).all()):
            eqs = c.checked.equations
            pos = c.step.origins.get(stmt) or (eqs.pos if eqs is not None else c.checked.ast.pos)
            how = f" (method `{c.method}`)" if c.method else ""
            what = f"`{stmt}`" if not kind else "a value of this statement computed from the params alone"
            raise error(
                f"with these params the step is not defined{where}: {what}{how} is not finite", pos,
                "a division by zero or an overflow among the params (e.g. a time constant of 0, or a step "
                "`dt` so long that a decay factor overflows)" + ("; or run in float64" if where else ""))


def check_constants(c: Compiled, compute: torch.dtype) -> None:
    """The step's constants must fit the precision a call computes in: 1e308 is inf in
    float32, so `v * 1e308` would give NaN for v = 0 where float64 gives 0."""
    big = torch.finfo(compute).max
    for label, largest, smallest in c.host.constants:
        bad = largest if largest > big else smallest if _rounds_to_zero(smallest, compute) else None
        if bad is not None:
            pos = _position(c, label, label)
            dname = str(compute).replace("torch.", "")
            why = f"beyond what {dname} holds ({big:.3g})" if bad == largest else f"which {dname} rounds to 0"
            raise FlexDSLError(f"this statement has the constant {bad:g}, {why}: {dname} is the precision of this "
                               "call", c.filename, pos.line, pos.column, c.text,
                               "run in float64 (m.double() and a float64 input), or rescale the model")


def _position(c: Compiled, name: str, origin: str) -> A.Pos:
    """Where a statement of the step comes from: its SSA name's origin, else the last statement
    that sets the state `name`, else its declaration, else the model."""
    ck = c.checked
    pos = c.step.origins.get(origin)
    if pos is not None:
        return pos
    sets = [a.pos for a in [*ck.update, *ck.on_spike] if a.target == name and not a.is_let]
    decl = next((s for s in ck.states if s.name == name), None)
    return sets[-1] if sets else decl.pos if decl is not None else ck.ast.pos


def _rounds_to_zero(v: float, dtype: torch.dtype) -> bool:
    return v != 0 and float(torch.tensor(v, dtype=torch.float64).to(dtype)) == 0.0


def check_constant_results(c: Compiled, dtype: torch.dtype) -> None:
    """A state or output the step sets to a constant must fit the dtype it is stored in
    (float32 cannot hold 1e300: one backend would store inf, another fail)."""
    big = torch.finfo(dtype).max
    for name, v, origin in c.host.constant_results:
        if abs(v) > big:
            pos = _position(c, name, origin)
            what = "state" if any(s.name == name for s in c.checked.states) else "output"
            dname = str(dtype).replace("torch.", "")
            raise FlexDSLError(f"the step sets {what} `{name}` to {v:g}, beyond what {dname} holds ({big:.3g})",
                               c.filename, pos.line, pos.column, c.text,
                               "run in float64 (m.double() and a float64 input), or rescale the model")


__all__ = ["resolve_params", "param_number", "constraint_holds", "check_invariants", "check_constants",
           "check_constant_results", "step_param", "common_shape"]
