"""A plasticity rule's constants at run time (`runtime/rule.py`'s `Rule`): which ones train, the ones
computed from them, their checks, and the weight's bounds.

- `chosen(ir, learnable)`: the constants to train (the file's `learnable` flags, or `learnable=`:
  a name, a list, True: every constant a derivative reaches, False: none).
- `refuse_unreached(ir, train, meta)`: a learnable constant no derivative reaches (used only in a
  comparison, a `where`'s condition, a state's initial value, or nowhere) is a located error at load.
- `derived_of(ir, train, given)`: the constants whose default is computed from a learnable one (and
  not given at load): recomputed from it at every call (`values`), so a trained `dApre` moves the
  `dApost = -dApre * ...` it defines as `load_rule(dApre=...)` would, and the gradient reaches it.
- `check_trained(rule)`: a learnable (or derived) constant made non-finite or moved out of its
  `where` constraint by training is a located error at the next call.
- `weight_bounds(rule)`: `(lo, hi)` of `weight w where LO <= w <= HI`; bounds that cannot hold are a
  located error (at load, and after a change of the params they read). `clamp_bounds(rule, like)`:
  the same as tensors of the call where a bound reads a learnable param (the clamp's gradient reaches
  it: a weight held at `w_max` moves with it), `clamp(w, lo, hi)` applies either.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import FlexDSLError, did_you_mean
from ..frontend import ast as A
from ..frontend.evaluate import evaluate
from .params import constraint_holds, show, written_scale


def _names(e: A.Expr | None) -> set[str]:
    return set() if e is None else {n.id for n in A.nodes(e) if isinstance(n, A.Name)}


def chosen(ir: Any, learnable: Any, reached: set[str] | None = None) -> set[str]:
    """The params to train (`reached`: those a derivative reaches, what True selects)."""
    names = [p.name for p in ir.checked.params]
    if learnable is None:
        return {p.name for p in ir.checked.params if p.learnable}
    if learnable is True or learnable is False:
        return (set(names) if reached is None else reached) if learnable else set()
    if not isinstance(learnable, str) and not (isinstance(learnable, (list, tuple, set, frozenset)) and
                                               all(isinstance(n, str) for n in learnable)):
        raise ir.rule.error(f"learnable= takes a param's name, a list of names, True or False, not {learnable!r}",
                            None, f"e.g. learnable={names[:2]!r}" if names else None)
    picked = [learnable] if isinstance(learnable, str) else list(learnable)
    for n in picked:
        if n not in names:
            raise ir.rule.error(f"learnable= names `{n}`, which is not a param of rule `{ir.rule.name}`", None,
                                did_you_mean(str(n), names) or f"its params: {', '.join(names) or 'none'}")
    return set(picked)


def one_number_each(ir: Any, values: dict[str, Any]) -> None:
    """A rule's params are one number each (the same for every synapse): a tensor of several values
    is a located error at load, not a broadcast against the call's batch."""
    for p in ir.checked.params:
        v = values.get(p.name)
        if isinstance(v, torch.Tensor) and v.numel() != 1:
            raise ir.rule.error(f"`{p.name}` is given {list(v.shape)} values; a rule's params are one number each, "
                                "the same for every synapse", p.pos, f"e.g. {p.name}={float(v.flatten()[0]) if v.numel() else 1.0:g}")


def derived_of(ir: Any, train: set[str], given: set[str]) -> tuple[str, ...]:
    """The params (in declaration order) whose default reads a learnable param, or one of these,
    and that were not given at load and do not train themselves."""
    out: list[str] = []
    for p in ir.checked.params:
        if p.name not in train and p.name not in given and _names(p.default) & (train | set(out)):
            out.append(p.name)
    return tuple(out)


def reached(ir: Any, meta: dict[str, Any]) -> set[str]:
    """The params a derivative of the rule's step reaches (directly, through the weight's bounds, or
    through the default of a param computed from them)."""
    used = (set(meta.get("used", ())) - set(meta["gradientless"])) | _names(ir.rule.bounds)
    out: set[str] = set()
    for p in reversed(ir.checked.params):  # (a default reads earlier params only)
        readers = [q for q in ir.checked.params if p.name in _names(q.default)]
        if p.name in used or any(q.name in out for q in readers):
            out.add(p.name)
    return out


def refuse_unreached(ir: Any, train: set[str], meta: dict[str, Any]) -> None:
    """A learnable param no derivative reaches: a located error."""
    ok = reached(ir, meta)
    for p in ir.checked.params:
        if p.name not in train or p.name in ok:
            continue
        where = "a comparison, a `where`'s condition or a step function" if p.name in meta["gradientless"] else \
            "a state's initial value" if any(p.name in _names(s.init) for s in ir.checked.states) else \
            "nothing the rule's step computes"
        raise ir.rule.error(f"`{p.name}` is learnable, but no derivative reaches it: it is used only in {where}", p.pos,
                            "train a param the weights depend on smoothly, or keep this one fixed")


def values(rule: Any) -> dict[str, Any]:
    """The params by name: fixed values, the Parameters, and derived ones computed from them."""
    out: dict[str, Any] = {}
    derived = rule.__dict__.get("_derived", ())
    for p in rule.ir.checked.params:
        if p.name in derived:
            out[p.name] = evaluate(p.default, out)
        else:
            out[p.name] = rule._fixed[p.name] if p.name in rule._fixed else getattr(rule, p.name)
    return out


def _floats(rule: Any) -> dict[str, Any]:
    return {k: (float(v.detach()) if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
            for k, v in rule.param_values().items()}


def check_trained(rule: Any) -> None:
    """A learnable constant that training made non-finite, or moved out of its `where` constraint
    (a time constant below 0), and a constant computed from one, is a located error at the next
    call, never a rule that silently computes something else. Checked again only after a Parameter
    changed (its version: once per optimizer step; on a GPU that read waits for the device)."""
    params = rule._parameters
    ps = [p for p in rule.ir.checked.params if p.name in params] if params else []
    if not ps:  # (no learnable constant: nothing to check, on every call's path)
        return
    key = tuple((id(params[p.name]), params[p.name]._version) for p in ps)
    if key == rule.__dict__.get("_checked_versions"):
        return
    env = _floats(rule)
    derived = rule.__dict__.get("_derived", ())
    ir = rule.ir
    for p in [*ps, *(q for q in ir.checked.params if q.name in derived)]:
        v = env[p.name]
        what = "learnable constant" if p.name in params else "constant (computed from learnable ones)"
        if not bool(torch.isfinite(torch.as_tensor(v)).all()):
            raise FlexDSLError(f"the {what} `{p.name}` is {show(v)} after training", ir.filename, p.pos.line,
                               p.pos.column, ir.text, "a gradient step made it non-finite: lower the learning rate, "
                               "or clip the gradients (torch.nn.utils.clip_grad_norm_)")
        if p.where is not None and not constraint_holds(ir, p, env):
            raise FlexDSLError(f"the {what} `{p.name}` is {show(v)} after training, outside its constraint: the "
                               "rule's step is not defined there", ir.filename, p.where.pos.line, p.where.pos.column,
                               ir.text, f"`{p.name}` must satisfy: {A.constraint_text(ir.text, p.where)}; lower the "
                               f"learning rate, or clamp it after each step (with torch.no_grad(): "
                               f"rule.{p.name}.clamp_(...))")
    rule.__dict__["_checked_versions"] = key


def _sides(rule: Any) -> list[tuple[str, Any]]:
    """The weight's bounds as `(op, expression)` with the weight on the left (`LO <= w` is `w >= LO`)."""
    cmp = rule.ir.rule.bounds
    w = rule.weight_name
    flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
    out = []
    for left, op, right in zip(cmp.operands, cmp.ops, cmp.operands[1:]):
        if isinstance(right, A.Name) and right.id == w:
            left, op, right = right, flip[op], left
        if isinstance(left, A.Name) and left.id == w:
            out.append((op, right))
    return out


def weight_bounds(rule: Any) -> tuple[float | None, float | None]:
    """The weight's bounds (`weight w where LO <= w <= HI`), None where a side is open; bounds no
    weight satisfies (LO above HI, or a strict bound at LO = HI) a located error."""
    cmp = rule.ir.rule.bounds
    if cmp is None:
        return None, None
    env = _floats(rule)
    lo = hi = None
    lo_strict = hi_strict = False
    for op, right in _sides(rule):
        val = float(evaluate(right, env))
        if op in ("<", "<="):
            if hi is None or val < hi or (val == hi and op == "<"):
                hi, hi_strict = val, op == "<"
        elif lo is None or val > lo or (val == lo and op == ">"):
            lo, lo_strict = val, op == ">"
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_strict or hi_strict))):
        w = rule.weight_name
        raise rule.ir.rule.error(f"the weight's bounds cannot hold: {w} {'>' if lo_strict else '>='} {lo:g} and {w} "
                                 f"{'<' if hi_strict else '<='} {hi:g} with these params", cmp.pos,
                                 "give params with the lower bound below the upper one")
    return lo, hi


def clamp_bounds(rule: Any, like: torch.Tensor) -> tuple[Any, Any]:
    """The weight's bounds for a call's clamp: floats, or (a bound reading a learnable param) 0-d
    tensors of `like`'s dtype and device with their graph."""
    lo, hi = weight_bounds(rule)
    cmp = rule.ir.rule.bounds
    if cmp is None or not (_names(cmp) & set(rule._parameters)):
        return lo, hi
    env = rule._env(like)
    lo_t = hi_t = None
    for op, right in _sides(rule):
        v = torch.as_tensor(evaluate(right, env), dtype=like.dtype, device=like.device)
        if op in ("<", "<="):
            hi_t = v if hi_t is None else torch.minimum(hi_t, v)
        else:
            lo_t = v if lo_t is None else torch.maximum(lo_t, v)
    return lo_t, hi_t


def clamp(w: torch.Tensor, lo: Any, hi: Any) -> torch.Tensor:
    """`w` clamped into [lo, hi] (either None: open), bounds floats or tensors."""
    if lo is not None:
        w = torch.clamp(w, min=lo)
    if hi is not None:
        w = torch.clamp(w, max=hi)
    return w


def dt_unit(ck: Any) -> str | None:
    """The unit `dt` is written in ("" for a model without units), None where there is no `dt`."""
    if not any(p.name == "dt" for p in ck.params):
        return None
    written = ck.written.param("dt") if ck.written is not None else None
    return A.quantity_unit(written.default) if written is not None and isinstance(written.default, A.Quantity) else ""


def check_dt(layer: Any, s: Any, rule: Any, neuron: Any) -> None:
    """A rule and its neuron that both declare `dt` must step by the same time: in one unit (or two
    time units) by their values; a `dt` without a unit (the library rules' `dt = 1.0`: their times
    are numbers) counts in the unit the other one is written in (`lif_ode`'s `0.1 ms`: 0.1)."""
    ru, nu = dt_unit(rule.ir.checked), dt_unit(neuron.compiled.checked)
    if ru is None or nu is None:
        return
    a = _number(rule.param_values()["dt"])
    b = _number(neuron.param_values().get("dt"), a)
    if a is None or b is None:
        return
    # (params keep their written numbers: compared in base units where both have a unit, else as numbers)
    x, y = (a * written_scale(rule.ir.checked, "dt"), b * written_scale(neuron.compiled.checked, "dt")) \
        if ru and nu else (a, b)
    if abs(x - y) > 1e-6 * max(abs(x), abs(y)):  # (float32 tensors of one dt: 6e-8 apart)
        unit = ru or nu
        raise layer.error(f"rule `{rule.name}` steps by dt = {a:g}{' ' + ru if ru else ''} and neuron "
                          f"`{layer.neuron.name}` by dt = {b:g}{' ' + nu if nu else ''}"
                          + (f" (a number without a unit counts in {unit} here)" if ru != nu and not (ru and nu) else "")
                          + ": a rule steps with its neuron", s.rule_pos,
                          f"give the rule the neuron's dt: rule_params={{'dt': {b:g}}}" if not ru else
                          f"give the rule the neuron's dt: rule_params={{'dt': '{b:g} {nu}'}}" if nu else
                          f"give the neuron the rule's dt (dt={a:g} at load)")


def dt_checked(m: Any, layer: Any, s: Any, rule: Any) -> None:
    """`check_dt` again where the rule's or the neuron's `dt` changed since the last call (assigned
    after load: `m.rules["W"].dt = ...`, `m.neuron.dt = ...`); a tensor's by its storage and version."""
    def key(v: Any) -> Any:
        return (v.data_ptr(), v._version, tuple(v.shape)) if isinstance(v, torch.Tensor) else v

    now = (key(rule.param_values().get("dt")), key(m.neuron.param_values().get("dt")))
    seen = m.__dict__.setdefault("_dt_seen", {})
    if seen.get(s.name) != now:
        check_dt(layer, s, rule, m.neuron)
        seen[s.name] = now


def _number(v: Any, other: float | None = None) -> float | None:
    """One number of a `dt` (None for an empty one): a per-neuron tensor's value where all are equal,
    else its first value unequal to `other` (the value compared with: where one differs, it is reported)."""
    if isinstance(v, torch.Tensor):
        flat = v.detach().reshape(-1)
        if flat.numel() == 0:
            return None
        ref = flat[0] if other is None else torch.as_tensor(other, dtype=flat.dtype)
        differ = (~torch.isclose(flat, ref.to(flat.dtype), rtol=1e-6, atol=0.0)).nonzero()
        return float(flat[0]) if not len(differ) else float(flat[int(differ[0])])
    return None if v is None else float(v)


__all__ = ["check_dt", "check_trained", "chosen", "clamp", "clamp_bounds", "derived_of", "dt_checked", "dt_unit", "one_number_each", "reached", "refuse_unreached", "values", "weight_bounds"]
