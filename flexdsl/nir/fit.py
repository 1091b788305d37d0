"""The params of a NIR primitive fitted to a model (`match`): the linear map's coefficients give the
primitive's params for a discretisation, symbolically, evaluated by the host evaluator; the map
that `load` runs for those params (flexdsl's own lowering of the generated text) must equal the
model's, coefficient by coefficient."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy as sp
import torch

from ..errors import FlexDSLError, did_you_mean
from ..ir.host import evaluate_expr
from ..runtime.compiler import Compiled, compile_model
from ..runtime.module import NeuronModule
from .linear import LinearStep, _coefficients, analyse, classify
from .primitives import METHODS, PRIMITIVES, _check_dt, _surrogate, neuron_text

_DESCRIBE = {"a": "the decay of `{v}`", "b": "the weight of the input on `{v}`", "c": "the drift of `{v}`",
             "alpha": "the decay of `{i}`", "beta": "the weight of the input on `{i}`",
             "gamma": "the weight of `{i}` on `{v}`"}
_FIT = ("a", "b", "c", "alpha", "beta", "gamma")


# ============================================================================ numbers
def _values(exprs: Mapping[str, sp.Expr], symbols: Sequence[sp.Symbol], args: Sequence[Any]) -> dict[str, np.ndarray]:
    """The values of `exprs` for these values of `symbols`, in float64 (the host evaluator)."""
    env = {s.name: torch.as_tensor(a.detach().cpu() if isinstance(a, torch.Tensor) else a, dtype=torch.float64)
           for s, a in zip(symbols, args)}
    with torch.no_grad():
        return {name: np.asarray(evaluate_expr(e, env).numpy(), dtype=np.float64) for name, e in exprs.items()}


def _decay_to_tau(a: np.ndarray, dt: float, method: str) -> np.ndarray | None:
    """The time constant whose step has decay factor `a` (None where there is none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if method == "euler":
            ok = a < 1
            tau = dt / (1 - a)
        else:
            ok = (a > 0) & (a < 1)
            tau = -dt / np.log(a)
    return tau if bool(np.all(ok & np.isfinite(tau))) else None


def _kappa(a: np.ndarray, tau_syn: np.ndarray, tau_mem: np.ndarray, dt: float) -> np.ndarray:
    """Exact CubaLIF: the weight of the current on the membrane over one step, per unit r,
    a*(dt/tau_mem)*expm1(z)/z with z = dt*(tau_syn - tau_mem)/(tau_syn*tau_mem) (no cancellation)."""
    z = dt * (tau_syn - tau_mem) / (tau_syn * tau_mem)
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = np.where(np.abs(z) > 1e-12, np.expm1(z) / np.where(z == 0, 1.0, z), 1.0 + z / 2)
    return a * (dt / tau_mem) * phi


_DT = sp.Symbol("_dt", positive=True)  # the export's step, an argument of the evaluated fit


def _invalid(kind: str, co: Mapping[str, np.ndarray], method: str) -> str | None:
    """Why the model's coefficients have no NIR params under `method` (None if they have)."""
    def bad_decay(a: np.ndarray) -> bool:
        return not bool(np.all((a < 1) & ((a > 0) if method == "exact" else True)))

    for key, state in (("a", "{v}"), ("alpha", "{i}")):
        if key in co and kind not in ("IF", "I") and bad_decay(co[key]):
            need = "0 < factor < 1" if method == "exact" else "factor < 1"
            return (f"the decay factor of `{state}` per step is {_show(co[key])}; a time constant under {method} "
                    f"needs {need}")
    if "k" in co and not bool(np.all(co["k"] > 0)):
        return "the spike fires when the potential falls below a threshold"
    return None


def _fit_exprs(kind: str, e: Mapping[str, sp.Expr], method: str) -> dict[str, sp.Expr]:
    """NIR params as expressions of the model's params and the step `_DT` (r of the exact
    CubaLIF is numeric: see `_kappa`)."""
    def tau(a: sp.Expr) -> sp.Expr:
        # exact: a > 0 (checked), so log(a) may be expanded (log(exp(-dt/tau)) is -dt/tau)
        return _DT / (1 - a) if method == "euler" else -_DT / sp.expand_log(sp.log(a), force=True)

    out: dict[str, sp.Expr] = {}
    if kind in ("IF", "I"):
        out["r"] = e["b"] / _DT
    elif kind in ("LIF", "LI"):
        out.update(tau=tau(e["a"]), r=e["b"] / (1 - e["a"]), v_leak=e["c"] / (1 - e["a"]))
    elif kind in ("CubaLIF", "CubaLI"):
        out.update(tau_mem=tau(e["a"]), v_leak=e["c"] / (1 - e["a"]), tau_syn=tau(e["alpha"]),
                   w_in=e["beta"] / (1 - e["alpha"]))
        if method == "euler":  # v' = a v + (1 - a) r (alpha i + beta x) + c
            out["r"] = e["b"] / ((1 - e["a"]) * e["beta"])
    if "k" in e:
        out["threshold" if kind == "Threshold" else "v_threshold"] = -e["m"] / e["k"]
        if "reset" in e:
            out["v_reset"] = e["reset"]
    return {k: _simplify(v) for k, v in out.items()}


def _simplify(e: sp.Expr) -> sp.Expr:
    """A fit expression simplified where that is cheap (dt/(1 - (1 - 1/tau)) is dt*tau, and
    log(exp(-dt/tau)) is -dt/tau: the params come out as the model wrote them)."""
    if sp.count_ops(e) > 40:
        return e
    return sp.simplify(e)


def _fit(kind: str, e: Mapping[str, sp.Expr], co: Mapping[str, np.ndarray], method: str, c: Compiled,
         vals: Mapping[str, Any], dt: float) -> tuple[dict[str, np.ndarray], str | None]:
    reason = _invalid(kind, co, method)
    if reason is not None:
        return {}, reason
    exprs = _fit_exprs(kind, e, method)
    symbols = [p.symbol for p in c.step.params] + [_DT]
    out = _values(exprs, symbols, [vals[p.name] for p in c.step.params] + [dt])
    if kind in ("CubaLIF", "CubaLI") and method == "exact":
        out["r"] = co["gamma"] / _kappa(co["a"], out["tau_syn"], out["tau_mem"], dt)
    bad = [n for n, v in out.items() if not bool(np.all(np.isfinite(v)))]
    if bad:
        return out, f"with these param values NIR's `{bad[0]}` is not finite"
    return out, None


def _show(a: np.ndarray) -> str:
    a = np.asarray(a)
    return f"{float(a.flat[0]):.6g}" if a.size == 1 or bool(np.all(a == a.flat[0])) else f"{a.flatten()[:4]}"


_CANONICAL: dict[tuple[str, str], tuple[LinearStep, dict[str, sp.Expr]]] = {}


def _primitive_coefficients(kind: str, method: str) -> tuple[LinearStep, dict[str, sp.Expr]]:
    """The coefficients of the step that `load` runs for a primitive (flexdsl's own lowering of
    the generated text), as expressions of the NIR params and dt."""
    hit = _CANONICAL.get((kind, method))
    if hit is None:
        p = PRIMITIVES[kind]
        text = neuron_text(kind, dict.fromkeys(p.params, 1.0), 1.0, method)
        ls = analyse(compile_model(text))
        found, roles = classify(ls)
        assert found == kind, (found, kind)
        hit = (ls, _coefficients(ls, kind, roles))
        _CANONICAL[(kind, method)] = hit
    return hit


@dataclass
class Exported:
    """A neuron matched to a NIR primitive: its kind, params (arrays) and how."""

    kind: str
    params: dict[str, np.ndarray]
    method: str
    op: str | None
    surrogate: str | None


def match(module: NeuronModule | Compiled | str, dt: float, method: str = "auto",
          values: Mapping[str, Any] | None = None) -> Exported:
    """The NIR primitive a model is, with its params at step `dt` (from the module's current
    params, or `values`, or the model's defaults); a located FlexDSLError where there is none."""
    dt = _check_dt(dt)
    if method not in ("auto", *METHODS):
        raise FlexDSLError(f"method must be 'auto', 'euler' or 'exact', not {method!r}", "<flexdsl.nir>",
                           hint=did_you_mean(str(method), ["auto", *METHODS]))
    if isinstance(module, NeuronModule):
        c = module.compiled
        vals = dict(module.param_values())
    else:
        c = module if isinstance(module, Compiled) else compile_model(module)
        from ..runtime.params import resolve_params

        vals = resolve_params(c, dict(values or {}))
    if c.derived_names:  # (coupled linear states integrated `exact`: their matrix exponentials' entries)
        declared = [vals[p.name] for p in c.checked.params]
        vals.update(zip(c.derived_names, c.with_derived(declared)[len(declared):]))
    if c.checked.stochastic:
        pos = c.checked.noise_pos
        raise FlexDSLError(f"`{c.name}` draws random numbers (noise), which no NIR primitive has", c.filename,
                           pos.line, pos.column, c.text, "export the model without its noise terms (NIR neurons are "
                                                         "deterministic)")
    ls = analyse(c)
    kind, roles = classify(ls)
    model_co = _coefficients(ls, kind, roles)
    exprs = dict(model_co)
    sur = c.step.surrogate
    builtin = sur is not None and c.checked.surrogate is not None and c.checked.surrogate.user is None
    if builtin:
        exprs.update({f"sur:{kw}": e for kw, e in sur.kwargs.items()})
    co = _values(exprs, [p.symbol for p in c.step.params], [vals[p.name] for p in c.step.params])
    surrogate = None
    if builtin and all(co[f"sur:{kw}"].size == 1 for kw in sur.kwargs):
        surrogate = _surrogate(f"{sur.name}(" + ", ".join(f"{kw}={float(co[f'sur:{kw}'].flat[0])!r}"
                                                          for kw in sur.kwargs) + ")")
    preferred = _preferred(c, method)
    failures: list[tuple[str, str]] = []
    for meth in preferred:
        fitted, reason = _fit(kind, model_co, co, meth, c, vals, dt)
        if reason is None:
            reason = _verify(kind, meth, fitted, co, dt)
        if reason is None:
            if ls.op == ">=":
                key = "threshold" if kind == "Threshold" else "v_threshold"
                fitted[key] = _below_float32(fitted[key])
            return Exported(kind, fitted, meth, ls.op, surrogate)
        failures.append((meth, reason))
    meth, reason = failures[0]
    v = roles.get("v", ls.fire_on or ls.input)
    where = roles["i"] if "{i}" in reason else v
    raise ls.error(f"NIR {kind} discretised with {meth}: " + reason.format(v=v, i=roles.get("i", "")), where,
                   _method_hint(kind, preferred))


def _preferred(c: Compiled, method: str) -> list[str]:
    if method != "auto":
        return [method]
    m = c.step.method
    first = "exact" if m is not None and m != "euler" else "euler"
    return [first, "exact" if first == "euler" else "euler"]


def _method_hint(kind: str, tried: Sequence[str]) -> str:
    if kind in ("CubaLIF", "CubaLI"):
        return ("under euler the current is updated first and the membrane sees the new current (snnTorch's "
                "Synaptic, Norse, SpikingJelly's CUBALIFNode); under exact the step is the closed-form solution "
                "with the input held over the step" + ("" if len(tried) > 1 else "; try the other method"))
    return "try the other method" if len(tried) == 1 else "check the params"


def _verify(kind: str, method: str, fitted: Mapping[str, np.ndarray], co: Mapping[str, np.ndarray],
            dt: float) -> str | None:
    """None where the step that `load` runs for `fitted` equals the model's, else which
    coefficient differs."""
    ls, exprs = _primitive_coefficients(kind, method)
    need = {k: e for k, e in exprs.items() if k in _FIT}
    if not need:
        return None
    symbols = [p.symbol for p in ls.compiled.step.params]
    args = [dt if s.name == "dt" else fitted[s.name] for s in symbols]
    got = _values(need, symbols, args)
    for key in need:
        want = co[key]
        scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-300)
        if not np.allclose(got[key], want, rtol=1e-7, atol=1e-9 * scale):
            return f"{_DESCRIBE[key]} would be {_show(got[key])}, but the model's is {_show(want)}"
    return None


def _below_float32(thr: np.ndarray) -> np.ndarray:
    """The largest float32 below each threshold: in float32, `v > t'` is exactly `v >= t`."""
    t32 = np.asarray(thr, dtype=np.float64).astype(np.float32)
    return np.nextafter(t32, np.float32(-np.inf)).astype(np.float64)
