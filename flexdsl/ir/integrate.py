"""ODE discretization over one step `dt` (inputs held constant), as SSA assignments.

Each method takes the states' symbols, a function evaluating the right-hand sides at given
state values, the step, and an `emit(base, expr) -> Symbol` callback that records an SSA
assignment; it returns the new value of each state. To add an integrator: its record in
`frontend.catalog.METHODS` (name, doc, aliases) and a function with that signature in
INTEGRATORS here.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy as sp

from ..frontend.catalog import METHODS
from .functions import Where

Values = dict[sp.Symbol, sp.Expr]
RHS = Callable[[Values], Values]
Emit = Callable[[str, sp.Expr], sp.Expr]


class NotApplicable(Exception):
    """The method does not apply; `state` names the offending equation."""

    def __init__(self, state: sp.Symbol, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


def euler(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, emit: Emit) -> Values:
    k = f({x: x for x in xs})
    return {x: x + dt * k[x] for x in xs}


def rk2(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, emit: Emit) -> Values:
    """Midpoint: x + dt*f(x + dt/2*f(x)) (Brian2's rk2)."""
    k1 = {x: emit(f"k1_{x}", e) for x, e in f({x: x for x in xs}).items()}
    mid = {x: emit(f"{x}_mid", x + dt / 2 * k1[x]) for x in xs}
    k2 = f(mid)
    return {x: x + dt * k2[x] for x in xs}


def heun(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, emit: Emit) -> Values:
    """Heun: x + dt/2*(f(x) + f(x + dt*f(x)))."""
    k1 = {x: emit(f"k1_{x}", e) for x, e in f({x: x for x in xs}).items()}
    sup = {x: emit(f"{x}_support", x + dt * k1[x]) for x in xs}
    k2 = {x: emit(f"k2_{x}", e) for x, e in f(sup).items()}
    return {x: x + dt / 2 * (k1[x] + k2[x]) for x in xs}


def rk4(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, emit: Emit) -> Values:
    """Classical Runge-Kutta (Brian2's rk4 stages)."""
    k1 = {x: emit(f"k1_{x}", e) for x, e in f({x: x for x in xs}).items()}
    s2 = {x: emit(f"{x}_k2", x + dt / 2 * k1[x]) for x in xs}
    k2 = {x: emit(f"k2_{x}", e) for x, e in f(s2).items()}
    s3 = {x: emit(f"{x}_k3", x + dt / 2 * k2[x]) for x in xs}
    k3 = {x: emit(f"k3_{x}", e) for x, e in f(s3).items()}
    s4 = {x: emit(f"{x}_k4", x + dt * k3[x]) for x in xs}
    k4 = {x: emit(f"k4_{x}", e) for x, e in f(s4).items()}
    return {x: x + dt / 6 * (k1[x] + 2 * k2[x] + 2 * k3[x] + k4[x]) for x in xs}


def exponential_euler(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, emit: Emit) -> Values:
    """Each equation dx/dt = A*x + B with A, B free of x: x_new = -B/A + (x + B/A)*exp(A*dt)."""
    rhs = f({x: x for x in xs})
    out: Values = {}
    for x in xs:
        fx = sp.expand(rhs[x])
        a = sp.simplify(fx.diff(x))
        if a.has(x):
            raise NotApplicable(x, f"`d{x}/dt` is not linear in `{x}`")
        b = sp.simplify(fx - a * x)
        if b.has(x):
            raise NotApplicable(x, f"`d{x}/dt` is not linear in `{x}`")
        if a == 0:
            out[x] = x + dt * b
            continue
        ba = emit(f"{x}_inf", -b / a)
        out[x] = ba + (x - ba) * sp.exp(a * dt)
    return out


def linear_system(xs: list[sp.Symbol], rhs: Values) -> tuple[sp.Matrix, sp.Matrix]:
    """dx/dt = A x + b with A, b free of states, or NotApplicable naming the first bad equation."""
    n = len(xs)
    a = sp.zeros(n, n)
    b = sp.zeros(n, 1)
    for i, x in enumerate(xs):
        fx = sp.expand(rhs[x])
        for j, y in enumerate(xs):
            a[i, j] = fx.diff(y)
            if a[i, j].has(*xs):
                raise NotApplicable(x, f"`d{x}/dt` is not linear in the states (term in `{y}`)")
        rest = sp.expand(fx - sum(a[i, j] * y for j, y in enumerate(xs)))
        if rest.has(*xs):
            raise NotApplicable(x, f"`d{x}/dt` is not linear in the states")
        b[i] = rest
    return a, b


def exact(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, emit: Emit) -> Values:
    """Linear systems with state-free coefficients: the matrix exponential of [[A, b], [0, 0]]*dt."""
    rhs = f({x: x for x in xs})
    a, b = linear_system(xs, rhs)
    n = len(xs)
    if n == 1:
        x = xs[0]
        a0, b0 = sp.simplify(a[0, 0]), sp.simplify(b[0])
        if a0 == 0:
            return {x: x + dt * b0}
        decay = emit(f"{x}_decay", sp.exp(a0 * dt))
        return {x: x * decay + (-b0 / a0) * (1 - decay)}
    e = (a * dt).exp().applyfunc(lambda z: sp.simplify(sp.expand_complex(z)))
    if n == 2:
        e = _with_repeated_eigenvalue_case(a, e, dt)
    det = sp.simplify(a.det())
    if det == 0 or e.has(sp.I):
        return _exact_augmented(xs, a, b, dt)
    # x_new = E x + A^-1 (E - I) b, with the entries of E = exp(A dt) shared as SSA symbols
    es = sp.Matrix(n, n, lambda i, j: e[i, j] if e[i, j].is_Atom else emit(f"{xs[i]}_E{j}", e[i, j]))
    const = (a.adjugate() / det) * (es - sp.eye(n)) * b if any(bi != 0 for bi in b) else sp.zeros(n, 1)
    return {x: sum(es[i, j] * xs[j] for j in range(n)) + const[i] for i, x in enumerate(xs)}


def _with_repeated_eigenvalue_case(a: sp.Matrix, e: sp.Matrix, dt: sp.Expr) -> sp.Matrix:
    """exp(A dt) of a 2x2 system in closed form divides by the eigenvalues' difference; where
    the discriminant is 0 (e.g. equal time constants) use exp(s dt) (I + (A - s I) dt), s = tr/2."""
    disc = sp.simplify((a[0, 0] - a[1, 1]) ** 2 + 4 * a[0, 1] * a[1, 0])
    if disc == 0 or disc.is_positive or disc.is_negative:
        return e
    s = a.trace() / 2
    degenerate = (sp.exp(s * dt) * (sp.eye(2) + (a - s * sp.eye(2)) * dt)).applyfunc(sp.simplify)
    cond = sp.Eq(disc, 0)
    return sp.Matrix(2, 2, lambda i, j: e[i, j] if sp.simplify(e[i, j] - degenerate[i, j]) == 0
                     else Where(cond, degenerate[i, j], e[i, j]))


def _exact_augmented(xs: list[sp.Symbol], a: sp.Matrix, b: sp.Matrix, dt: sp.Expr) -> Values:
    """Singular A: the matrix exponential of [[A, b], [0, 0]]*dt also gives the integral of exp(A s) b."""
    n = len(xs)
    aug = sp.zeros(n + 1, n + 1)
    aug[:n, :n] = a * dt
    aug[:n, n] = b * dt
    e = aug.exp()
    out: Values = {}
    vec = sp.Matrix([*xs, 1])
    for i, x in enumerate(xs):
        row = sp.simplify(sp.expand_complex(sp.expand((e[i, :] * vec)[0])))
        out[x] = sp.collect(sp.expand(row), xs)
    return out


INTEGRATORS: dict[str, Callable[..., Values]] = {
    "exact": exact,
    "exponential_euler": exponential_euler,
    "euler": euler,
    "rk2": rk2,
    "rk4": rk4,
    "heun": heun,
}
assert set(INTEGRATORS) == set(METHODS), "catalog.METHODS and integrate.INTEGRATORS disagree"
