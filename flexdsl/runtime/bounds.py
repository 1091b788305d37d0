"""Bounded learnable params at run time: a learnable param with a `where` bound trains as an
unconstrained Parameter `raw_<name>` and is computed from it once per call, on the host, with
autograd (the parametrization of `frontend/bounds.py`: `a + softplus(raw)`, `b - softplus(raw)`,
`a + (b - a)*sigmoid(raw)`).

`value(bound, raw, env)` computes it in float64 and rounds it to the Parameter's dtype, then keeps
it inside the bound as that dtype holds it (a strict bound: at least the next value past it; so
`tau > 1` holds for `m.tau` whatever the optimizer did to `raw_tau`, even where `1 + softplus(raw)`
rounds to 1). `raw(bound, v, env, dtype)` is its inverse (an assigned or loaded value), chosen so
that `value` gives back `v` as the dtype holds it where a neighbouring raw value does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..frontend.bounds import Bound
from ..frontend.evaluate import evaluate

F64 = torch.float64


def _limits(b: Bound, env: Mapping[str, Any], device: torch.device | None) -> tuple[Any, Any, list, list]:
    """(lo, hi, lower limits, upper limits) in float64: lo the max of the lower limits, hi the
    min of the upper ones (None where there are none); the limits as (value, strict)."""
    def val(lim) -> torch.Tensor:
        v = evaluate(lim.expr, env)
        return v.to(F64) if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=F64, device=device)

    lows = [(val(lim), lim.strict) for lim in b.lower]
    highs = [(val(lim), lim.strict) for lim in b.upper]
    lo = hi = None
    for v, _ in lows:
        lo = v if lo is None else torch.maximum(lo, v)
    for v, _ in highs:
        hi = v if hi is None else torch.minimum(hi, v)
    return lo, hi, lows, highs


def _edge(limit: torch.Tensor, strict: bool, dtype: torch.dtype, up: bool) -> torch.Tensor:
    """The first value of `dtype` inside a limit: at or past it (closed), past it (strict)."""
    e = limit.detach().to(dtype)
    back = e.to(F64)
    direction = torch.tensor(float("inf") if up else float("-inf"), dtype=dtype, device=e.device)
    outside = (back <= limit if strict else back < limit) if up else (back >= limit if strict else back > limit)
    return torch.where(outside, torch.nextafter(e, direction), e)


def _smooth(b: Bound, r: torch.Tensor, lo: Any, hi: Any) -> torch.Tensor:
    if b.kind == "lower":
        return lo + torch.nn.functional.softplus(r)
    if b.kind == "upper":
        return hi - torch.nn.functional.softplus(r)
    return lo + (hi - lo) * torch.sigmoid(r)


def value(b: Bound, raw: torch.Tensor, env: Mapping[str, Any]) -> torch.Tensor:
    """The param's value from its Parameter (autograd to `raw` and to the params in the bounds)."""
    dtype = raw.dtype if raw.is_floating_point() else torch.get_default_dtype()
    lo, hi, lows, highs = _limits(b, env, raw.device)
    v = _smooth(b, raw.to(F64), lo, hi).to(dtype)
    for lim, strict in lows:
        v = torch.maximum(v, _edge(lim, strict, dtype, True))
    for lim, strict in highs:
        v = torch.minimum(v, _edge(lim, strict, dtype, False))
    return v


def inside(b: Bound, v: Any, env: Mapping[str, Any]) -> bool:
    """Whether `v` lies strictly inside the bounds' span, where the parametrization reaches
    (a value on a closed bound satisfies the constraint but is no value of `a + softplus(raw)`)."""
    t = torch.as_tensor(v, dtype=F64).detach()
    lo, hi, _, _ = _limits(b, env, t.device)
    ok = torch.ones_like(t, dtype=torch.bool)
    if lo is not None:
        ok = ok & (t > lo)
    if hi is not None:
        ok = ok & (t < hi)
    return bool(ok.all())


def raw(b: Bound, v: Any, env: Mapping[str, Any], dtype: torch.dtype, device: torch.device | None = None
        ) -> torch.Tensor:
    """The Parameter's value for the param value `v` (strictly inside the bounds: `inside`)."""
    t = torch.as_tensor(v, dtype=F64, device=device).detach()
    with torch.no_grad():
        lo, hi, _, _ = _limits(b, env, t.device)
        if b.kind == "lower":
            x = t - lo
        elif b.kind == "upper":
            x = hi - t
        if b.kind == "interval":
            u = (t - lo) / (hi - lo)
            r = torch.log(u) - torch.log1p(-u)
        else:
            r = x + torch.log(-torch.expm1(-x))  # softplus's inverse, stable for small and large x
        r = r.to(dtype)
        return _exact(b, r, t, env)


def _exact(b: Bound, r: torch.Tensor, target: torch.Tensor, env: Mapping[str, Any], reach: int = 4
           ) -> torch.Tensor:
    """`r`, or the nearest of its neighbours (up to `reach` steps of the dtype) whose value is
    `target` as the dtype holds it: a value set at load or assigned reads back as set, where the
    dtype allows (in float64 always, in practice; a float32 raw value lands within rounding)."""
    want = target.to(r.dtype)
    best = r
    found = value(b, r, env) == want
    for k in range(reach):
        for direction in (float("inf"), float("-inf")):
            step = r
            for _ in range(k + 1):
                step = torch.nextafter(step, torch.full_like(step, direction))
            hit = (value(b, step, env) == want) & ~found
            best = torch.where(hit, step, best)
            found = found | hit
        if bool(found.all()):
            break
    return best


__all__ = ["value", "raw", "inside"]
