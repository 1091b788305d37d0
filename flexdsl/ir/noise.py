"""Stochastic ODEs: white noise (`xi`, `xi_1`, ...) with Brian2's meaning, integrated over one step.

A right-hand side with noise is `f(x) + sum_j g_j(x) * xi_j`: each `xi_j` Gaussian white noise of
unit 1/sqrt(time), independent of the others, entering linearly (a coefficient `g_j` that depends
on noise is a located error). Over a step the noise is the Wiener increment `dW_j = sqrt(dt) * N_j`,
`N_j` a standard normal drawn per step and element (the lowering emits the draws; `dW` holds the
increments). Noise is *additive* where every `g_j` is free of the states (it may depend on inputs
and params, which are constant over a step), else *multiplicative*; multiplicative noise has
Brian2's (Stratonovich) meaning, so every method converges to the same process:

- `euler`: Euler–Maruyama, `x + dt*f(x) + g(x)*dW`; with multiplicative noise on the equivalent Itô
  equation, whose drift is `f + 1/2 * sum_i g_i * dg/dx_i` (derived symbolically; Brian2's `euler`
  takes additive noise only). Strong order 1/2 (1 for additive noise);
- `milstein`: the Milstein method for one noise source per equation and one equation per source
  (Brian2's condition), `x + dt*f + g*dW + 1/2*g*dg/dx*dW**2` (Stratonovich; the derivative
  symbolic, summed over the noisy states g depends on). Strong order 1 (where the noise commutes:
  a coefficient depending on its own state only). Brian2's `milstein` is derivative-free, with the
  support point `x + dt*f + sqrt(dt)*g` and `dW**2` in place of Itô's `dW**2 - dt`: a mean local
  error of order dt**1.5 wherever the equation has drift, which makes its strong order 1/2 (measured
  on geometric Brownian motion in tests/test_noise_stats.py);
- `heun`: the stochastic Heun method (the trapezoid of flexdsl's deterministic `heun` for the
  drift and the noise): `x_p = x + dt*f(x) + g(x)*dW`, `x + dt/2*(f(x) + f(x_p)) + 1/2*(g(x) + g(x_p))*dW`.
  Any noise (Brian2's `heun` has an Euler drift);
- `exact`: linear equations with state-free coefficients and additive noise, on states that are
  not coupled to others: `x*exp(a*dt) + b*dt*exprel(a*dt) + g*sqrt(dt*exprel(2*a*dt))*N`, the
  Ornstein–Uhlenbeck step with its exact variance `g**2*(exp(2*a*dt) - 1)/(2*a)` (`g**2*dt` at a = 0).

Other methods (`exponential_euler`, `rk2`, `rk4`) do not integrate noise: a located error names
the methods that do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sympy as sp

from .functions import Where, exprel
from .integrate import (
    Context,
    NotApplicable,
    Values,
    _blocks,
    _constant_factor,
    _split_linear,
    exact,
    linear_system,
)

RHS = Callable[[Values], Values]
ONE = sp.Integer(1)
NOISE_METHODS = ("exact", "euler", "heun", "milstein")  # the methods that integrate white noise


class NoiseError(NotApplicable):
    """White noise that no method integrates (it does not enter linearly)."""


@dataclass
class Stochastic:
    """The equations split into drift and noise: `drift(values)` (f, the noise set to 0) and
    `coeffs(values)` (per state, per noise source, g); `dW` the Wiener increment of each source."""

    states: list[sp.Symbol]
    sources: list[sp.Symbol]
    drift: RHS
    coeffs: Callable[[Values], dict[sp.Symbol, dict[sp.Symbol, sp.Expr]]]
    dW: dict[sp.Symbol, sp.Expr]

    def at_start(self) -> dict[sp.Symbol, dict[sp.Symbol, sp.Expr]]:
        return self.coeffs({x: x for x in self.states})

    @property
    def additive(self) -> bool:
        return all(not g.has(*self.states) for gs in self.at_start().values() for g in gs.values())

    def diagonal(self) -> tuple[sp.Symbol, sp.Symbol] | None:
        """None for diagonal noise, else (state, source) of the first violation."""
        seen: dict[sp.Symbol, sp.Symbol] = {}
        for x, gs in self.at_start().items():
            if len(gs) > 1:
                return x, sorted(gs, key=lambda s: s.name)[1]
            for j in gs:
                if j in seen:
                    return x, j
                seen[j] = x
        return None


def split(states: list[sp.Symbol], rhs_at: RHS, sources: list[sp.Symbol], dW: dict[sp.Symbol, sp.Expr]
          ) -> Stochastic:
    """The drift and noise coefficients of the right-hand sides, checked linear in the noise."""
    zero = {j: sp.Integer(0) for j in sources}
    for x, e in rhs_at({x: x for x in states}).items():
        bad = _nonlinear_noise(e, set(sources))
        if bad is not None:
            raise NoiseError(x, f"in `d{x}/dt` the noise enters through `{sp.sstr(bad)}`: white noise must "
                                "enter linearly, as `g*xi` with a coefficient `g` free of noise",
                             "write the right-hand side as f + g*xi (e.g. `... + sigma*sqrt(2/tau)*xi`); for a "
                             "noise that depends on noise, filter it through a state")

    def drift(values: Values) -> Values:
        return {x: e.xreplace(zero) for x, e in rhs_at(values).items()}

    def coeffs(values: Values) -> dict[sp.Symbol, dict[sp.Symbol, sp.Expr]]:
        out: dict[sp.Symbol, dict[sp.Symbol, sp.Expr]] = {}
        for x, e in rhs_at(values).items():
            out[x] = {j: e.diff(j) for j in sources if e.has(j)}
            out[x] = {j: g for j, g in out[x].items() if g != 0}
        return out

    return Stochastic(list(states), list(sources), drift, coeffs, dict(dW))


def _nonlinear_noise(e: sp.Expr, sources: set[sp.Symbol]) -> sp.Expr | None:
    """The first subexpression through which noise enters non-linearly (a power, a function, a
    product of two noisy factors), or None."""
    stack = [e]
    while stack:
        n = stack.pop()
        if n in sources or not n.has(*sources):
            continue
        if isinstance(n, sp.Add):
            stack.extend(n.args)
        elif isinstance(n, sp.Mul):
            noisy = [a for a in n.args if a.has(*sources)]
            if len(noisy) > 1:
                return n
            stack.extend(noisy)
        else:
            return n
    return None


def gated(sto: Stochastic, held: Mapping[sp.Symbol, sp.Expr]) -> Stochastic:
    """The equations of held states multiplied by `not_refractory` (Brian2's `unless refractory`)."""
    if not held:
        return sto

    def drift(values: Values) -> Values:
        return {x: (held[x] * f if x in held else f) for x, f in sto.drift(values).items()}

    def coeffs(values: Values) -> dict[sp.Symbol, dict[sp.Symbol, sp.Expr]]:
        return {x: ({j: held[x] * g for j, g in gs.items()} if x in held else gs)
                for x, gs in sto.coeffs(values).items()}

    return Stochastic(sto.states, sto.sources, drift, coeffs, sto.dW)


def _noise_sum(gs: Mapping[sp.Symbol, sp.Expr], dW: Mapping[sp.Symbol, sp.Expr]) -> sp.Expr:
    return sp.Add(*(g * dW[j] for j, g in gs.items()))


def _scaled_noise(x: sp.Symbol, gs: Mapping[sp.Symbol, sp.Expr], sto: Stochastic, ctx: Context,
                  scale: sp.Expr = ONE) -> sp.Expr:
    """sum_j g_j*scale*dW_j, each coefficient's factors that are constant over a call (params)
    computed once (`x_noise`: a loop invariant, the noise's standard deviation per step)."""
    out = sp.Integer(0)
    for j, g in gs.items():
        k, rest = _constant_factor(g * scale * sto.dW[j], ctx)
        if k != 1 and not k.is_number:
            k = ctx.emit(f"{x}_noise" if len(gs) == 1 else f"{x}_noise_{j}", k)
        out += k * rest
    return out


def euler_maruyama(sto: Stochastic, dt: sp.Expr, ctx: Context) -> Values:
    """x + dt*(f + 1/2*sum_i g_i*dg/dx_i) + g*dW (the Itô drift of the Stratonovich equation)."""
    xs = sto.states
    f = sto.drift({x: x for x in xs})
    g = sto.at_start()
    out: Values = {}
    for m in xs:
        corr = sp.Integer(0)
        for j, gmj in g[m].items():
            corr += sp.Add(*(g[i].get(j, 0) * gmj.diff(i) for i in xs if g[i].get(j, 0) != 0))
        drift = f[m] + corr / 2 if corr != 0 else f[m]
        out[m] = m + dt * drift + _scaled_noise(m, g[m], sto, ctx)
    return out


def milstein(sto: Stochastic, dt: sp.Expr, ctx: Context) -> Values:
    """The Milstein method for one noise source per equation (Stratonovich): x + dt*f + g*dW +
    1/2 * sum_i g_i * dg/dx_i * dW_i*dW (the derivative symbolic)."""
    xs = sto.states
    bad = sto.diagonal()
    if bad is not None:
        x, j = bad
        raise NotApplicable(x, f"`milstein` takes one noise source per equation and each source in one equation, "
                               f"and `{j}` breaks that in `d{x}/dt`", "use `method heun` or `method euler`")
    f = sto.drift({x: x for x in xs})
    g = {x: next(iter(gs.items()), None) for x, gs in sto.at_start().items()}  # state -> (source, coefficient)
    gsym = {x: (j, ctx.emit(f"g_{x}", gx)) for x, (j, gx) in ((x, v) for x, v in g.items() if v is not None)}
    out: Values = {}
    for m in xs:
        if m not in gsym:
            out[m] = m + dt * f[m]
            continue
        jm, gm = gsym[m]
        dgm = {i: g[m][1].diff(i) for i in gsym}
        corr = sp.Add(*(gsym[i][1] * d * sto.dW[gsym[i][0]] for i, d in dgm.items() if d != 0))
        out[m] = m + dt * f[m] + gm * sto.dW[jm] + corr * sto.dW[jm] / 2
    return out


def heun(sto: Stochastic, dt: sp.Expr, ctx: Context) -> Values:
    """The stochastic Heun method (trapezoid in drift and noise; Stratonovich)."""
    xs = sto.states
    f1 = {x: ctx.emit(f"k1_{x}", e) for x, e in sto.drift({x: x for x in xs}).items()}
    g1 = sto.at_start()
    g1 = {x: {j: ctx.emit(f"g_{x}_{j}" if len(gs) > 1 else f"g_{x}", g) for j, g in gs.items()} for x, gs in g1.items()}
    pred = {x: ctx.emit(f"{x}_support", x + dt * f1[x] + _noise_sum(g1[x], sto.dW)) for x in xs}
    f2 = {x: ctx.emit(f"k2_{x}", e) for x, e in sto.drift(pred).items()}
    g2 = sto.coeffs(pred)
    out: Values = {}
    for x in xs:
        noise = sp.Add(*((g1[x][j] + g2[x].get(j, 0)) * sto.dW[j] for j in g1[x]))
        out[x] = x + dt / 2 * (f1[x] + f2[x]) + noise / 2
    return out


def exact_noisy(sto: Stochastic, dt: sp.Expr, ctx: Context) -> Values:
    """The exact step of linear equations with additive noise (states with noise uncoupled)."""
    xs = sto.states
    g = sto.at_start()
    for x in xs:
        for j, gx in g[x].items():
            if gx.has(*xs):
                raise NotApplicable(x, f"`exact` takes additive noise, and the noise `{j}` in `d{x}/dt` is "
                                       "multiplied by a state", "use `method heun`, `milstein` or `euler`")
    a, _ = linear_system(xs, sto.drift({x: x for x in xs}))
    for block in _blocks(a):
        if len(block) > 1 and any(g[xs[i]] for i in block):
            x = next(xs[i] for i in block if g[xs[i]])
            raise NotApplicable(x, f"`exact` integrates white noise only on a state that is not coupled to "
                                   f"another, and `{x}` is coupled to "
                                   + ", ".join(f"`{xs[i]}`" for i in block if xs[i] != x),
                                "use `method euler` (Euler–Maruyama) or `heun`")
    new = exact(xs, sto.drift, dt, ctx)
    out: Values = {}
    for x in xs:
        if not g[x]:
            out[x] = new[x]
            continue
        ax = _split_linear(sto.drift({y: y for y in xs})[x], x)
        assert ax is not None
        scale = sp.sqrt(exprel(2 * ax[0] * dt)) if ax[0] != 0 else sp.Integer(1)
        out[x] = new[x] + _scaled_noise(x, g[x], sto, ctx, scale)
    return out


NOISY: dict[str, Callable[[Stochastic, sp.Expr, Context], Values]] = {
    "exact": exact_noisy, "euler": euler_maruyama, "milstein": milstein, "heun": heun,
}
assert set(NOISY) == set(NOISE_METHODS)


def applicable(sto: Stochastic) -> list[str]:
    """The methods that integrate these equations (for messages), checked without emitting."""
    out = []
    xs = sto.states
    if sto.additive:
        try:
            a, _ = linear_system(xs, sto.drift({x: x for x in xs}))
            g = sto.at_start()
            if not any(len(b) > 1 and any(g[xs[i]] for i in b) for b in _blocks(a)):
                out.append("exact")
        except NotApplicable:
            pass
    out.append("euler")
    out.append("heun")
    if sto.diagonal() is None:
        out.append("milstein")
    return out


def integrate_noisy(method: str, sto: Stochastic, dt: sp.Expr, ctx: Context, held: set[sp.Symbol] | None = None,
                    not_refractory: sp.Expr | None = None) -> Values:
    """The step of a system with white noise by `method` (NotApplicable where it does not apply,
    naming the methods that do). `held`: the states held while refractory (`unless refractory`,
    Brian2's meaning: their right-hand side, noise included, times `not_refractory`)."""
    if method not in NOISY:
        x = next((x for x, gs in sto.at_start().items() if gs), sto.states[0])
        raise NotApplicable(x, f"`{method}` does not integrate white noise (`{sorted(sto.sources, key=str)[0]}`)",
                            "methods that integrate these equations: " + ", ".join(f"`{m}`" for m in applicable(sto)))
    if not held or not_refractory is None:
        return NOISY[method](sto, dt, ctx)
    if method != "exact":
        return NOISY[method](gated(sto, dict.fromkeys(held, not_refractory)), dt, ctx)
    # exact: held states keep their value; a state driven by a held one (transitively) steps with the
    # held rows set to 0 while refractory
    active = sp.StrictGreaterThan(not_refractory, 0)
    free = exact_noisy(sto, dt, ctx)
    f = sto.drift({x: x for x in sto.states})
    driven = set(held)
    while True:
        more = {x for x in sto.states if x not in driven and f[x].free_symbols & driven}
        if not more:
            break
        driven |= more
    if driven == held:
        return {x: (Where(active, free[x], x) if x in held else free[x]) for x in sto.states}
    frozen = Stochastic(sto.states, sto.sources,
                        lambda v: {x: (sp.Integer(0) if x in held else e) for x, e in sto.drift(v).items()},
                        lambda v: {x: ({} if x in held else gs) for x, gs in sto.coeffs(v).items()}, sto.dW)
    stopped = exact_noisy(frozen, dt, ctx)
    return {x: (Where(active, free[x], stopped[x]) if x in driven else free[x]) for x in sto.states}


__all__ = ["NOISE_METHODS", "NoiseError", "Stochastic", "split", "integrate_noisy", "applicable"]
