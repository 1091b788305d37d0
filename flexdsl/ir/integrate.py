"""ODE discretization over one step `dt` (inputs held constant), as SSA assignments.

Each method takes the states' symbols, a function evaluating the right-hand sides at given
state values, the step, and a `Context`: `emit(base, expr) -> Symbol` records an SSA
assignment, `constant(expr)` says whether a value is the same for every step of a call (made
of params only), and `matrix_exp(...)` asks for entries of a matrix exponential computed
numerically once per call (the lowering records them as derived params). A method returns the
new value of each state. To add an integrator: its record in `frontend.catalog.METHODS` (name,
doc, aliases) and a function with that signature in INTEGRATORS here.

`exact` and `exponential_euler` never divide by a coefficient that may vanish: one equation
dx/dt = a*x + b steps to x*exp(a*dt) + b*dt*exprel(a*dt) (exprel(z) = (exp(z) - 1)/z, 1 at 0),
exact at a = 0 and free of cancellation near it. Coupled linear states (`exact`) step with the
propagator of their matrix, E = expm(A*dt), and its integral F = int_0^dt expm(A*s) ds, read off
one matrix exponential of [[A*dt, dt*I], [0, 0]]: no symbolic eigenvalues, so no compile time
that grows with the params, and no singular case (equal time constants, a zero eigenvalue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy as sp

from ..frontend import ast as A
from ..frontend.catalog import METHODS
from .functions import Where, exprel

Values = dict[sp.Symbol, sp.Expr]
RHS = Callable[[Values], Values]
Emit = Callable[[str, sp.Expr], sp.Expr]
# (states of the block, the matrix, {(row, column): base name}) -> {(row, column): symbol}
RequestMatrixExp = Callable[[list[sp.Symbol], sp.Matrix, dict[tuple[int, int], str]], dict[tuple[int, int], sp.Symbol]]


@dataclass
class MatrixExp:
    """Derived params: entries of expm(matrix), where the matrix is made of params only. They are
    computed once per call on the host (`ir/host.py`), before any backend's program runs, and
    passed to it like params (with autograd to the declared ones)."""

    states: list[str]  # the coupled states whose propagator this is
    matrix: sp.Matrix
    entries: list[tuple[sp.Symbol, int, int]]  # (symbol, row, column)
    pos: A.Pos  # the equations that need it

    def describe(self) -> str:
        names = ", ".join(s.name for s, _, _ in self.entries)
        rows = ", ".join("[" + ", ".join(sp.sstr(e) for e in self.matrix.row(i)) + "]"
                         for i in range(self.matrix.rows))
        return f"{names} = entries {[(i, j) for _, i, j in self.entries]} of expm([{rows}])"



@dataclass
class Context:
    """What an integrator may use besides the equations (see the module docstring)."""

    emit: Emit
    constant: Callable[[sp.Expr], bool]
    matrix_exp: RequestMatrixExp


class NotApplicable(Exception):
    """The method does not apply; `state` names the offending equation."""

    def __init__(self, state: sp.Symbol, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason
        self.hint = hint


def euler(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, ctx: Context) -> Values:
    k = f({x: x for x in xs})
    return {x: x + dt * k[x] for x in xs}


def rk2(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, ctx: Context) -> Values:
    """Midpoint: x + dt*f(x + dt/2*f(x)) (Brian2's rk2)."""
    k1 = {x: ctx.emit(f"k1_{x}", e) for x, e in f({x: x for x in xs}).items()}
    mid = {x: ctx.emit(f"{x}_mid", x + dt / 2 * k1[x]) for x in xs}
    k2 = f(mid)
    return {x: x + dt * k2[x] for x in xs}


def heun(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, ctx: Context) -> Values:
    """Heun: x + dt/2*(f(x) + f(x + dt*f(x)))."""
    k1 = {x: ctx.emit(f"k1_{x}", e) for x, e in f({x: x for x in xs}).items()}
    sup = {x: ctx.emit(f"{x}_support", x + dt * k1[x]) for x in xs}
    k2 = {x: ctx.emit(f"k2_{x}", e) for x, e in f(sup).items()}
    return {x: x + dt / 2 * (k1[x] + k2[x]) for x in xs}


def rk4(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, ctx: Context) -> Values:
    """Classical Runge-Kutta (Brian2's rk4 stages)."""
    k1 = {x: ctx.emit(f"k1_{x}", e) for x, e in f({x: x for x in xs}).items()}
    s2 = {x: ctx.emit(f"{x}_k2", x + dt / 2 * k1[x]) for x in xs}
    k2 = {x: ctx.emit(f"k2_{x}", e) for x, e in f(s2).items()}
    s3 = {x: ctx.emit(f"{x}_k3", x + dt / 2 * k2[x]) for x in xs}
    k3 = {x: ctx.emit(f"k3_{x}", e) for x, e in f(s3).items()}
    s4 = {x: ctx.emit(f"{x}_k4", x + dt * k3[x]) for x in xs}
    k4 = {x: ctx.emit(f"k4_{x}", e) for x, e in f(s4).items()}
    return {x: x + dt / 6 * (k1[x] + 2 * k2[x] + 2 * k3[x] + k4[x]) for x in xs}


def linear_step(x: sp.Symbol, a: sp.Expr, b: sp.Expr, dt: sp.Expr, ctx: Context) -> sp.Expr:
    """The exact step of dx/dt = a*x + b (a, b constant over the step), for every a."""
    if a == 0:
        return x + dt * b
    z = a * dt
    if ctx.constant(z):  # both factors are loop invariants: the step costs a multiply-add
        decay = ctx.emit(f"{x}_decay", sp.exp(z))
        if b == 0:
            return x * decay
        k, rest = _constant_factor(b, ctx)  # the gain absorbs b's constant factor (e.g. 1/tau)
        return x * decay + rest * ctx.emit(f"{x}_gain", k * dt * exprel(z))
    if b == 0:
        return x * ctx.emit(f"{x}_decay", sp.exp(z))
    # a changes every step: one transcendental function per step
    return x + (a * x + b) * dt * ctx.emit(f"{x}_exprel", exprel(z))


def _constant_factor(e: sp.Expr, ctx: Context) -> tuple[sp.Expr, sp.Expr]:
    """(k, r) with e = k*r, k the factors of e that are constant over a call."""
    e = sp.factor_terms(e)
    factors = e.args if e.is_Mul else (e,)
    k = [f for f in factors if ctx.constant(f)]
    return sp.Mul(*k), sp.Mul(*(f for f in factors if not ctx.constant(f)))


def _split_linear(fx: sp.Expr, x: sp.Symbol) -> tuple[sp.Expr, sp.Expr] | None:
    """(a, b) with fx = a*x + b and a, b free of x, or None. By differentiation, never by
    expansion (expanding `(a + b + c)**12 * x` would take seconds)."""
    a = fx.diff(x)
    if a.has(x):
        return None
    b = fx.xreplace({x: sp.Integer(0)})
    if b.has(x, sp.nan, sp.zoo):
        return None
    return sp.factor_terms(a), sp.factor_terms(b)


def exponential_euler(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, ctx: Context) -> Values:
    """Each equation dx/dt = a*x + b with a, b free of x (other states frozen over the step):
    x*exp(a*dt) + b*dt*exprel(a*dt), i.e. Brian2's x_inf + (x - x_inf)*exp(a*dt) with x_inf = -b/a,
    continued to a = 0."""
    rhs = f({x: x for x in xs})
    parts = {}
    for x in xs:
        ab = _split_linear(rhs[x], x)
        if ab is None:
            raise NotApplicable(x, f"`d{x}/dt` is not linear in `{x}`")
        parts[x] = ab
    return {x: linear_step(x, *parts[x], dt, ctx) for x in xs}


def linear_system(xs: list[sp.Symbol], rhs: Values) -> tuple[sp.Matrix, sp.Matrix]:
    """dx/dt = A x + b with A, b free of states, or NotApplicable naming the first bad equation.
    A by differentiation and b by setting the states to 0 (a function whose derivatives are all
    state-free is affine), never by expansion."""
    n = len(xs)
    a = sp.zeros(n, n)
    b = sp.zeros(n, 1)
    zero = {x: sp.Integer(0) for x in xs}
    for i, x in enumerate(xs):
        fx = rhs[x]
        for j, y in enumerate(xs):
            a[i, j] = fx.diff(y)
            if a[i, j].has(*xs):
                raise NotApplicable(x, f"`d{x}/dt` is not linear in the states (term in `{y}`)")
        b[i] = fx.xreplace(zero)
        if b[i].has(*xs, sp.nan, sp.zoo):
            raise NotApplicable(x, f"`d{x}/dt` is not linear in the states")
    return a, b


def _blocks(a: sp.Matrix) -> list[list[int]]:
    """The states in groups that evolve together: the connected components of the coupling
    graph (i ~ j where the coefficient of x_j in dx_i/dt or of x_i in dx_j/dt is nonzero)."""
    n = a.shape[0]
    group = list(range(n))

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i in range(n):
        for j in range(n):
            if i != j and a[i, j] != 0:
                group[root(i)] = root(j)
    out: dict[int, list[int]] = {}
    for i in range(n):
        out.setdefault(root(i), []).append(i)
    return sorted(out.values())


def _reaches(a: sp.Matrix) -> list[list[bool]]:
    """r[i][j]: x_j influences x_i within a step (expm(A*dt)[i, j] can be nonzero)."""
    n = a.shape[0]
    r = [[i == j or a[i, j] != 0 for j in range(n)] for i in range(n)]
    for k in range(n):
        for i in range(n):
            if r[i][k]:
                for j in range(n):
                    r[i][j] = r[i][j] or r[k][j]
    return r


def exact(xs: list[sp.Symbol], f: RHS, dt: sp.Expr, ctx: Context) -> Values:
    """Linear systems with state-free coefficients. An uncoupled state steps in closed form
    (`linear_step`: its coefficient may change every step, e.g. depend on an input); coupled
    states step with the propagator of their block, computed once per call from the params."""
    rhs = f({x: x for x in xs})
    a, b = linear_system(xs, rhs)
    blocks = _blocks(a)
    for block in blocks:  # check everything before emitting anything
        if len(block) == 1:
            continue
        for i in block:
            for j in block:
                if not ctx.constant(a[i, j]):
                    varying = sorted(s.name for s in a[i, j].free_symbols if not ctx.constant(s))
                    raise NotApplicable(
                        xs[i], f"the coefficient of `{xs[j]}` in `d{xs[i]}/dt` changes from step to step "
                        f"(it depends on {', '.join(f'`{v}`' for v in varying)}); `exact` integrates coupled "
                        "states only with coefficients made of params",
                        "use `method exponential_euler` or `rk4`")
    out: Values = {}
    for block in blocks:
        if len(block) == 1:
            i = block[0]
            out[xs[i]] = linear_step(xs[i], a[i, i], b[i], dt, ctx)
        else:
            bx = [xs[i] for i in block]
            out.update(_propagate(bx, a.extract(block, block), b.extract(block, [0]), dt, ctx))
    return out


def _propagate(xs: list[sp.Symbol], a: sp.Matrix, b: sp.Matrix, dt: sp.Expr, ctx: Context) -> Values:
    """x_new = E x + F b with E = expm(A*dt) and F = int_0^dt expm(A*s) ds: the top blocks of
    expm([[A*dt, dt*I_forced], [0, 0]]) (a column of F only for each state with a forcing term)."""
    n = len(xs)
    forced = [j for j in range(n) if b[j] != 0]
    m = sp.zeros(n + len(forced), n + len(forced))
    m[:n, :n] = (a * dt).applyfunc(sp.factor_terms)
    for k, j in enumerate(forced):
        m[j, n + k] = dt
    reach = _reaches(a)
    wanted: dict[tuple[int, int], str] = {}
    for i in range(n):
        for j in range(n):
            if reach[i][j]:
                wanted[(i, j)] = f"E_{xs[i]}_{xs[j]}"
        for k, j in enumerate(forced):
            if reach[i][j]:
                wanted[(i, n + k)] = f"F_{xs[i]}_{xs[j]}"
    e = ctx.matrix_exp(xs, m, wanted)
    out: Values = {}
    for i, x in enumerate(xs):
        new = sp.Add(*(e[(i, j)] * xs[j] for j in range(n) if (i, j) in e))
        new += sp.Add(*(e[(i, n + k)] * b[j] for k, j in enumerate(forced) if (i, n + k) in e))
        out[x] = new
    return out


INTEGRATORS: dict[str, Callable[..., Values]] = {
    "exact": exact,
    "exponential_euler": exponential_euler,
    "euler": euler,
    "rk2": rk2,
    "rk4": rk4,
    "heun": heun,
    "milstein": euler,  # (Brian2's milstein without noise is Euler's step; with noise: `ir/noise.py`)
}
assert set(INTEGRATORS) == set(METHODS), "catalog.METHODS and integrate.INTEGRATORS disagree"


def integrate_held(method: str, xs: list[sp.Symbol], rhs_at, dt: sp.Expr, ctx: Context, held: set[sp.Symbol],
                   not_refractory: sp.Expr, assignments: list, derived: list[MatrixExp]
                   ) -> dict[sp.Symbol, sp.Expr]:
    """The step of a system whose `held` states do not move while refractory, with Brian2's
    meaning (`dX/dt = int(not_refractory) * f` for each held X):

    - the explicit methods integrate exactly that right-hand side;
    - `exponential_euler` treats each equation on its own, from the step's starting values, so
      a held state keeps its value and the others are unaffected;
    - `exact` steps both systems (free, and with the held rows 0) and chooses per state (the
      free one where the state is neither held nor driven by a held one)."""
    active = sp.StrictGreaterThan(not_refractory, 0)
    if method not in ("exact", "exponential_euler"):
        def gated(values):
            rhs = rhs_at(values)
            return {x: (not_refractory * f if x in held else f) for x, f in rhs.items()}

        return INTEGRATORS[method](xs, gated, dt, ctx)
    free = INTEGRATORS[method](xs, rhs_at, dt, ctx)
    if method == "exponential_euler":
        return {x: (Where(active, free[x], x) if x in held else free[x]) for x in xs}
    # exact: the states driven by a held one (transitively) need the held system's solution
    rhs = rhs_at({x: x for x in xs})
    driven = set(held)
    changed = True
    while changed:
        changed = False
        for x in xs:
            if x not in driven and rhs[x].free_symbols & driven:
                driven.add(x)
                changed = True
    start, start_derived = len(assignments), len(derived)

    def frozen(values):
        r = rhs_at(values)
        return {x: (sp.Integer(0) if x in held else f) for x, f in r.items()}

    stopped = INTEGRATORS[method](xs, frozen, dt, ctx)
    out = {x: (Where(active, free[x], stopped[x]) if x in driven else free[x]) for x in xs}
    # drop what the held system computed for states that do not need it
    need: set[sp.Symbol] = set()
    for e in out.values():
        need |= e.free_symbols
    for y, e in reversed(assignments[start:]):
        if y in need:
            need |= e.free_symbols
    assignments[start:] = [(y, e) for y, e in assignments[start:] if y in need]
    derived[start_derived:] = [d for d in derived[start_derived:] if any(y in need for y, _, _ in d.entries)]
    return out

