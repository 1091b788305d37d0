"""Bounded learnable params at run time: a learnable param with a `where` bound trains as an
unconstrained Parameter `raw_<name>` and is computed from it once per call, on the host, with
autograd (the parametrization of `frontend/bounds.py`: `a + softplus(raw)`, `b - softplus(raw)`,
`a + (b - a)*sigmoid(raw)`).

`value(bound, raw, env, precisions)` computes it in float64 and keeps it inside the bounds in
every precision it will be used in (the Parameter's dtype, and a call's): a strict bound is
passed by at least the next value of that dtype past the bound as the dtype holds it (evaluated
in the dtype from the params rounded to it), and by at least the dtype's smallest normal number
(so `1/(tau - 1)` is finite), a closed one is reached at least, and the value is finite there. So `tau > 1` holds for `m.tau` in float32 whatever the optimizer did to `raw_tau`,
even where `1 + softplus(raw)` rounds to 1, and a float32 call's `tau - 1` is never 0. A raw
value that is not finite gives NaN, never a finite value that hides it.

`raw(bound, v, env, dtype)` is its inverse (an assigned or loaded value): the raw value whose
float64 value is nearest to `v` (exactly `v` where the parametrization reaches it), found from
the closed-form inverse of the branch that `value` evaluates (softplus is the identity above
the switch at 40) and refined by Newton steps and a scan of the neighbouring raw values.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from ..frontend import ast as A
from ..frontend.bounds import Bound
from ..frontend.evaluate import evaluate

F64 = torch.float64


def _cached(fn):
    """`fn` with an LRU cache of its results, except in a torch.compile trace (which would
    ignore the cache, with a warning): there it is called."""
    hit = lru_cache(maxsize=256)(fn)

    def call(*args):
        return fn(*args) if torch.compiler.is_compiling() else hit(*args)

    call.__doc__ = fn.__doc__
    return call

_SWITCH = 40.0  # softplus: the identity above it, log1p(exp(r)) at or below (above 37 they agree in float64;
# torch's default switch, 20, is 2e-9 off there: 1e5 float64 ulps, and a jump)
_TINY = -700.0  # below it, sigmoid(r) is exp(r) in float64 (torch's 1/(1 + exp(-r)) underflows near -709)


def _val(expr: A.Expr, env: Mapping[str, Any]) -> Any:
    """A limit's value: a float, or a float64 tensor (per-channel or learnable params)."""
    v = evaluate(expr, env)
    return v.to(F64) if isinstance(v, torch.Tensor) else float(v)


def _join(a: Any, b: Any, up: bool) -> Any:
    if a is None:
        return b
    if isinstance(a, float) and isinstance(b, float):
        return max(a, b) if up else min(a, b)
    pair = torch.broadcast_tensors(*(torch.as_tensor(x, dtype=F64) for x in (a, b)))
    return torch.maximum(*pair) if up else torch.minimum(*pair)


def _limits(b: Bound, env: Mapping[str, Any]) -> tuple[Any, Any, list, list]:
    """(lo, hi, lower limits, upper limits) in float64: lo the max of the lower limits, hi the
    min of the upper ones (None where there are none); the limits as (value, strict, expr)."""
    lows = [(_val(lim.expr, env), lim.strict, lim.expr) for lim in b.lower]
    highs = [(_val(lim.expr, env), lim.strict, lim.expr) for lim in b.upper]
    lo = hi = None
    for v, _, _ in lows:
        lo = _join(lo, v, True)
    for v, _, _ in highs:
        hi = _join(hi, v, False)
    return lo, hi, lows, highs


@_cached
def _float_edge(limit: float, strict: bool, up: bool, dtype: torch.dtype) -> float:
    """`_edge` of a limit that is a float (a constant, a float param)."""
    t = torch.tensor(limit, dtype=F64)
    return float(_edge(t, t.to(dtype), strict, up))


def _in_dtype(limit: torch.Tensor, expr: A.Expr, env: Mapping[str, Any], dtype: torch.dtype) -> torch.Tensor:
    """A limit as a call in `dtype` holds it: the float64 limit rounded, or, for an expression
    of several terms, evaluated in `dtype` from the params rounded to it (whichever is further in)."""
    e = limit.detach()
    e = e if e.dtype == dtype else e.to(dtype)
    if isinstance(expr, A.Num | A.Name):
        return e
    low = {k: torch.as_tensor(v.detach() if isinstance(v, torch.Tensor) else v, dtype=F64, device=e.device)
           .to(dtype) for k, v in env.items()}
    try:
        d = evaluate(expr, low)
    except (ArithmeticError, ValueError):
        return e
    return torch.as_tensor(d, dtype=dtype, device=e.device)


def _edge(limit: torch.Tensor, held: torch.Tensor, strict: bool, up: bool) -> torch.Tensor:
    """The first value of `held`'s dtype inside a limit (as float64): past the limit as the dtype
    holds it by at least its smallest normal number (strict: so that dividing by the distance
    to the bound, `1/(tau - 1)`, is finite in the dtype, and in float64 too), or at or past the
    float64 limit (closed)."""
    direction = _direction(up, held.dtype, held.device)
    if strict:
        tiny = torch.finfo(held.dtype).tiny
        step = torch.nextafter(held, direction)
        e = torch.maximum(step, held + tiny) if up else torch.minimum(step, held - tiny)
        return e if e.dtype == F64 else e.to(F64)
    back = held.to(F64)
    outside = back < limit if up else back > limit
    return torch.where(outside, torch.nextafter(held, direction), held).to(F64)


@_cached
def _direction(up: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(float("inf") if up else float("-inf"), dtype=dtype, device=device)


def _sigmoid(r: torch.Tensor) -> torch.Tensor:
    """sigmoid in float64, without torch's underflow to 0 below -709 (exp(r) there, to rounding)."""
    return torch.where(r < _TINY, torch.exp(torch.clamp(r, max=_TINY)), torch.sigmoid(r))


def _smooth(b: Bound, r: torch.Tensor, lo: Any, hi: Any) -> torch.Tensor:
    if b.kind == "lower":
        return lo + torch.nn.functional.softplus(r, threshold=_SWITCH)
    if b.kind == "upper":
        return hi - torch.nn.functional.softplus(r, threshold=_SWITCH)
    return lo + (hi - lo) * _sigmoid(r)


@_cached
def precisions(raw_dtype: torch.dtype, call: tuple[torch.dtype | None, ...] = ()) -> tuple[torch.dtype, ...]:
    """The dtypes a bounded value must be inside its bounds in: the Parameter's and a call's
    (float64 dropped where a narrower dtype is there: inside in it is inside in float64)."""
    out = tuple(dict.fromkeys(d for d in (raw_dtype, *call) if d is not None and d.is_floating_point))
    narrow = tuple(d for d in out if d != F64)
    return narrow or (F64,)


def value(b: Bound, raw: torch.Tensor, env: Mapping[str, Any], call: tuple[torch.dtype | None, ...] = ()
          ) -> torch.Tensor:
    """The param's value from its Parameter (autograd to `raw` and to the params in the bounds),
    in the Parameter's dtype, inside the bounds in it and in the dtypes of `call` (see the
    module docstring)."""
    dtype = raw.dtype if raw.is_floating_point() else torch.get_default_dtype()
    lo, hi, lows, highs = _limits(b, env)
    r = raw if raw.dtype == F64 else raw.to(F64)
    v = _smooth(b, r, lo, hi)
    for dt in precisions(dtype, call):
        v = _clamp(v, lows, highs, env, dt)
    v = v + r.detach() * 0  # (a raw value that is not finite: NaN, not the value of a clamp)
    return v if dtype == F64 else v.to(dtype)


def _clamp(v: torch.Tensor, lows: list, highs: list, env: Mapping[str, Any], dt: torch.dtype) -> torch.Tensor:
    """`v` (float64) kept inside the limits as `dt` holds them, and finite in `dt` (the limits
    that are floats in one clamp, with their edges cached)."""
    big = torch.finfo(dt).max
    least, most = -big, big
    tensors = []
    for (lim, strict, expr), up in [*((x, True) for x in lows), *((x, False) for x in highs)]:
        if isinstance(lim, float) and isinstance(expr, A.Num | A.Name):
            e = _float_edge(lim, strict, up, dt)
            least, most = (max(least, e), most) if up else (least, min(most, e))
        else:
            t = lim if isinstance(lim, torch.Tensor) else torch.tensor(lim, dtype=F64, device=v.device)
            tensors.append((_edge(t, _in_dtype(t, expr, env, dt), strict, up), up))
    v = torch.clamp(v, least, most)
    for e, up in tensors:
        v = torch.maximum(v, e) if up else torch.minimum(v, e)
    return v


def inside(b: Bound, v: Any, env: Mapping[str, Any]) -> bool:
    """Whether `v` lies strictly inside the bounds' span where the parametrization reaches: past
    a strict bound by float64's smallest normal number at least, past a closed one (a value on a
    closed bound satisfies the constraint but is no value of `a + softplus(raw)`)."""
    t = torch.as_tensor(v, dtype=F64).detach()
    lo, hi, lows, highs = _limits(b, env)
    ok = _clamp(t, lows, highs, env, F64) == t
    if lo is not None:
        ok = ok & (t > lo)
    if hi is not None:
        ok = ok & (t < hi)
    return bool(ok.all())


def _first_guess(b: Bound, t: torch.Tensor, lo: Any, hi: Any) -> torch.Tensor:
    """The closed-form inverse of the branch `_smooth` evaluates."""
    if b.kind == "interval":
        return torch.log(t - lo) - torch.log(hi - t)  # (log(u/(1-u)) without the rounding of 1 - u)
    x = t - lo if b.kind == "lower" else hi - t
    # softplus's inverse, stable for small x; above the switch softplus is the identity
    return torch.where(x > _SWITCH, x, x + torch.log(-torch.expm1(-torch.clamp(x, max=_SWITCH))))


def _slope(b: Bound, r: torch.Tensor, lo: Any, hi: Any) -> torch.Tensor:
    """d value / d raw at `r` (0 where it underflows)."""
    if b.kind == "interval":
        s = _sigmoid(r)
        return (hi - lo) * s * (1 - s)
    s = torch.where(r > _SWITCH, torch.ones_like(r), _sigmoid(r))
    return s if b.kind == "lower" else -s


def raw(b: Bound, v: Any, env: Mapping[str, Any], dtype: torch.dtype, device: torch.device | None = None
        ) -> torch.Tensor:
    """The Parameter's value for the param value `v` (strictly inside the bounds: `inside`):
    the raw value of `dtype` whose value (`value` in float64) is nearest to `v`, shaped as `v`
    broadcast with its bounds."""
    t = torch.as_tensor(v, dtype=F64, device=device).detach()
    with torch.no_grad():
        lo, hi, _, _ = _limits(b, env)
        shape = torch.broadcast_shapes(t.shape, *(x.shape for x in (lo, hi) if isinstance(x, torch.Tensor)))
        t = t.expand(shape)
        r = _first_guess(b, t, lo, hi).expand(shape)
        best, err = r, (value(b, r, env) - t).abs()
        for _ in range(4):  # Newton steps on the value as `value` computes it
            d = _slope(b, r, lo, hi)
            step = torch.where(d != 0, (t - value(b, r, env)) / torch.where(d != 0, d, 1.0), 0.0)
            r = torch.where(torch.isfinite(step), r + step, r)
            best, err = _better(b, r, t, env, best, err)
        return _scan(b, best.to(dtype), t, env)


def _better(b: Bound, r: torch.Tensor, t: torch.Tensor, env: Mapping[str, Any], best: torch.Tensor,
            err: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    e = (value(b, r, env) - t).abs()
    closer = e < err
    return torch.where(closer, r, best), torch.where(closer, e, err)


def _scan(b: Bound, r: torch.Tensor, t: torch.Tensor, env: Mapping[str, Any], reach: int = 3) -> torch.Tensor:
    """`r` or the neighbour (up to `reach` steps of its dtype each way) whose float64 value is
    nearest to `t`, preferring one that a float32 call sees as `t` (a value the raw value's
    steps cannot give exactly: `t` between two neighbours' values)."""
    want32 = t.to(torch.float32)

    def score(x: torch.Tensor) -> torch.Tensor:
        got = value(b, x, env).to(F64)
        return (got - t).abs() + torch.where(got.to(torch.float32) == want32, 0.0, float("inf"))

    best, err = r, score(r)
    for direction in (float("inf"), float("-inf")):
        step = r
        for _ in range(reach):
            step = torch.nextafter(step, torch.full_like(step, direction))
            e = score(step)
            closer = e < err
            best, err = torch.where(closer, step, best), torch.where(closer, e, err)
    if bool(torch.isinf(err).any()):  # (no neighbour a float32 call sees as `t`: the nearest in float64)
        plain = _scan_plain(b, r, t, env, reach)
        best = torch.where(torch.isinf(err), plain, best)
    return best


def _scan_plain(b: Bound, r: torch.Tensor, t: torch.Tensor, env: Mapping[str, Any], reach: int) -> torch.Tensor:
    best, err = r, (value(b, r, env).to(F64) - t).abs()
    for direction in (float("inf"), float("-inf")):
        step = r
        for _ in range(reach):
            step = torch.nextafter(step, torch.full_like(step, direction))
            best, err = _better(b, step, t, env, best, err)
    return best


__all__ = ["value", "raw", "inside", "precisions"]
