"""Test tolerances derived from the computation, never from what one machine's rounding gave.

A result computed by `n` floating-point operations in sequence, each rounding with a relative
error of at most `u` (the unit roundoff: 2^-24 in float32, 2^-53 in float64, 2^-11 in float16,
2^-8 in bfloat16), is within gamma_n = n*u / (1 - n*u) of the exact value, relative to the
magnitude of the terms it combines (Higham, *Accuracy and Stability of Numerical Algorithms*,
2nd ed., Lemma 3.1; sums and dot products: eq. 3.4 and section 4.2). Two implementations of one
computation -- flexdsl and a reference, two backends, eager and compiled, another instruction
set (scalar, AVX2, AVX-512, NEON), another BLAS blocking, with or without fused multiply-adds --
may each round differently, but each is within its own gamma_n of the exact value, so they differ
by at most the sum of the two. A recurrence carries an earlier step's error into later steps,
multiplied by the step's Jacobian: a test whose dynamics are not contracting says so with `cond`
(the largest amplification of a relative error, e.g. a product of step gains).

So every bound here is `cond * (ops * u(actual) + ops * u(expected)) * scale`, compared normwise
(the largest elementwise difference against the magnitude `scale` of the quantities combined,
by default the largest magnitude of `expected`): elementwise relative checks would demand
accuracy that no algorithm gives for a value that is a small difference of large terms.

A test states `ops` from its computation, e.g. "T = 20 steps of ~8 operations each" is
`ops=20 * 8`; a sum of `N` terms adds `N` to the count (its order is free to differ).
"""

from __future__ import annotations

import math

import numpy as np
import torch

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    np.dtype("float64"): 2.0**-53,
    np.dtype("float32"): 2.0**-24,
    np.dtype("float16"): 2.0**-11,
}


def unit_roundoff(dtype) -> float:
    """u of a torch or NumPy dtype (a Python float is float64)."""
    if dtype is float:
        return UNIT_ROUNDOFF[torch.float64]
    if not isinstance(dtype, torch.dtype):
        dtype = np.dtype(dtype)
    return UNIT_ROUNDOFF[dtype]


def gamma(n: float, u: float) -> float:
    """Higham's gamma_n = n*u / (1 - n*u): the relative error bound of n roundings."""
    assert n * u < 0.5, f"{n} operations at u = {u:.3g}: no useful bound (the test is too long for this dtype)"
    return n * u / (1 - n * u)


def tol(dtype, ops: float, cond: float = 1.0, ref_dtype=None) -> float:
    """The relative bound of one result of `ops` operations in `dtype` against the same computation
    in `ref_dtype` (default: the same dtype), amplified by `cond`."""
    ref = dtype if ref_dtype is None else ref_dtype
    return cond * (gamma(ops, unit_roundoff(dtype)) + gamma(ops, unit_roundoff(ref)))


def _dtype(x):
    if isinstance(x, torch.Tensor):
        return x.dtype
    if isinstance(x, np.ndarray | np.generic):
        return x.dtype
    return float


def _as_f64(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def bound(actual, expected, *, ops: float, cond: float = 1.0, scale: float | None = None,
          floor: float = 0.0, precision=None) -> float:
    """The absolute bound of max|actual - expected| (see the module docstring)."""
    e = _as_f64(expected)
    if scale is None:
        scale = float(e.abs().max()) if e.numel() else 0.0
    scale = max(scale, floor)
    if precision is not None:
        return tol(precision, ops, cond) * scale
    return tol(_dtype(actual), ops, cond, _dtype(expected)) * scale


def assert_close(actual, expected, *, ops: float, cond: float = 1.0, scale: float | None = None,
                 floor: float = 0.0, precision=None, what: str = "") -> None:
    """max|actual - expected| <= cond * (gamma_ops(u_actual) + gamma_ops(u_expected)) * scale.

    `scale` is the magnitude of the quantities the result combines (default: max|expected|;
    at least `floor`, for results that may all be 0 while their terms are not). `precision`:
    the dtype both sides really computed in, where it is not their dtype (a reference that
    rounds to float32 inside a float64 computation). Shapes must be equal, NaNs must sit at
    the same places. `cond` may be a function, called only when the difference exceeds the
    bound of condition 1 (a condition estimate costs runs; most comparisons do not need it)."""
    a, e = _as_f64(actual), _as_f64(expected)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    assert torch.equal(nan_a, nan_e), f"{what}: NaNs at different places"
    inf = torch.isinf(e)
    assert torch.equal(a[inf], e[inf]), f"{what}: infinities differ"
    ok = ~(nan_e | inf)
    err = float((a[ok] - e[ok]).abs().max()) if ok.any() else 0.0
    if callable(cond):
        b1 = bound(actual, e[ok] if e.numel() else e, ops=ops, scale=scale, floor=floor, precision=precision)
        cond = 1.0 if err <= b1 else cond()
    b = bound(actual, e[ok] if e.numel() else e, ops=ops, cond=cond, scale=scale, floor=floor, precision=precision)
    assert err <= b, (f"{what}: max |difference| {err:.3g} > bound {b:.3g} ({ops:g} operations in "
                      f"{precision or _dtype(actual)} vs {precision or _dtype(expected)}, condition {cond:g})")


def ulps(x: float, dtype=torch.float32) -> float:
    """One unit in the last place of `x` in `dtype` (the spacing of the floats near x)."""
    if dtype in (torch.float64, float):
        return math.ulp(x)
    v = torch.tensor(abs(x), dtype=dtype)
    return float(torch.nextafter(v, torch.tensor(math.inf, dtype=dtype)) - v)


_OPS: dict = {}


def model_ops(model: str, **options) -> tuple[int, int]:
    """(forward, backward) operation counts of one step of a model, counted by sympy on the
    step and the derived backward the compiler generates (`flexdsl.compile`): the `n` of a step
    in the bounds above. A reference implementation of the same equations does the same
    operations in another arrangement, which the factor of two in `tol` covers."""
    key = (model, tuple(sorted(options.items())))
    if key not in _OPS:
        import sympy

        import flexdsl

        c = flexdsl.compile(model, **options)
        fwd = sum(int(sympy.count_ops(eq.rhs)) for eq in c.step_equations)
        bwd = sum(int(sympy.count_ops(eq.rhs)) for eq in c.backward_equations)
        _OPS[key] = (max(fwd, 1), max(bwd, 1))
    return _OPS[key]


def condition(fn, *inputs: torch.Tensor, delta: float = 2.0**-30, trials: int = 3, seed: int = 0) -> float:
    """The relative condition number of `fn` at `inputs`, estimated in float64 the way a
    numerical analyst checks a bound: perturb every input by a random relative `delta` and
    take the largest normwise relative change of the outputs over `delta` (at least 1).

    A recurrence that amplifies an early rounding (a recurrent weight gain, a backward through
    many steps) has a large condition; a rounding error of `ops * u` relative then shows up as
    `condition * ops * u` in the result. `fn` takes float64 tensors and returns a tensor or a
    sequence of tensors; it runs `1 + trials` times. A perturbation that flips a spike (a value
    within `delta` of a threshold) shows as a huge condition: the comparison is then meaningless
    at any precision, and the test's inputs must change."""
    gen = torch.Generator().manual_seed(seed)
    xs = [x.detach().to(torch.float64) for x in inputs]

    def flat(out) -> torch.Tensor:
        out = out if isinstance(out, list | tuple) else [out]
        return torch.cat([o.detach().to(torch.float64).reshape(-1) for o in out])

    base = flat(fn(*xs))
    scale = float(base.abs().max())
    worst = 1.0
    for _ in range(trials):
        pert = [x * (1 + delta * (2 * torch.rand(x.shape, generator=gen, dtype=torch.float64) - 1)) for x in xs]
        change = float((flat(fn(*pert)) - base).abs().max())
        worst = max(worst, change / (delta * scale) if scale > 0 else 1.0)
    return worst


def scan_ops(model: str, T: int, reduce: int = 0, backward: bool = True, **options) -> int:
    """The operations behind a value after T steps of a model: T forward steps (and T backward
    steps for a gradient), plus `reduce` for a sum over that many terms (a param's gradient
    summed over the batch, the features and the steps)."""
    fwd, bwd = model_ops(model, **options)
    return T * (fwd + (bwd if backward else 0)) + reduce


def module_condition(make, x: torch.Tensor, w, params: bool = True) -> float:
    """`condition` of a neuron module's outputs and input gradient at input `x` and at its
    params' values: `make(**values)` builds a fresh module (run here in float64 on its own), the
    loss is sum(output_k * w_k) over its outputs (`w` a tensor or one per output). The params
    are perturbed too (`params=True`: every float param given to `make` by name): a float32
    call rounds them, and a model in physical units (v near -65 mV, a threshold 15 mV above)
    turns that rounding into a larger relative change of v - threshold. A steep surrogate or an
    amplifying recurrence shows here as a condition above 1."""
    ws = w if isinstance(w, list | tuple) else [w]
    values = make().param_values() if params else {}
    names = [k for k, v in values.items() if isinstance(v, float) and v != 0.0]

    def run(xx, *ps):
        m = make(**{n: float(p) for n, p in zip(names, ps)}).double()
        xx = xx.clone().requires_grad_()
        out = m(xx)
        out = out if isinstance(out, tuple) else (out,)
        sum((o * wk.double()).sum() for o, wk in zip(out, ws)).backward()
        return [o.detach() for o in out] + [xx.grad]

    return condition(run, x, *(torch.tensor(values[n], dtype=torch.float64) for n in names))


def layer_ops(model, T: int, B: int, I: int | None, H: int, **options) -> int:
    """The operations behind one gradient of a T-step recurrent layer: per step the neuron's
    forward and derived backward (counted on the generated step), the input and recurrent dot
    products (I + H terms) forward and back; a weight's gradient then sums T * B such terms."""
    fwd, bwd = model_ops(model, **options)
    return T * (fwd + bwd + 2 * ((I or 1) + H)) + T * B
