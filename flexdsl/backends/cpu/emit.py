"""The CPU backend's emitter: C++ kernels printed from the equations (forward and the derived
backward), with sympy's C++ printer.

One neuron per lane. The lanes go in blocks (`LANES` of them, sized so that a block's states,
params and invariants stay in the L1/L2 cache), the blocks over the threads (OpenMP), and each
block runs the whole time loop: per step, one vectorizable loop over the block's lanes (`omp
simd`), states kept in the block's arrays between steps. Two function templates per model,
instantiated for float and double:

- `fwd`: outputs every step, the final states, optionally the state sequences and, for
  training, the per-step values the backward needs (the schedule's save plan: `saved`);
- `bwd`: the derived vector-Jacobian product in reverse time, reading the saved values (and the
  inputs the plan re-reads), recomputing the rest; gradients of the inputs per step, of the
  initial states, and per-lane sums (in double) of the learnable params' gradients.

Types follow the torch backend: lane values in the I/O type `R`; params, and the values that
depend on params only (the schedule's loop invariants, and such subexpressions of a lane
expression), in double, converted to `R` where they meet a lane value. Numbers are `R(...)` in
lane expressions, so no operation is silently widened.

Every model or SSA name prints as itself with a trailing `_` (`v_`, `tau_`, `v_1_`): no C++
keyword, library name or macro ends that way, and every internal name of the template starts
with `_` and does not end with `_`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import sympy as sp
from sympy.printing.cxx import CXX17CodePrinter

from ...frontend.catalog import ALL_FUNCTIONS
from ...frontend.numeric import EXPREL_D_SERIES, EXPREL_SERIES_BOUND
from ...frontend.parse import source_lines
from ...ir.functions import Randn, draws_in
from ...ir.schedule import Assignments
from ..base import IR
from ..printer import comment_text, load_notes
from .abi import CpuABI

TEMPLATES = Path(__file__).resolve().parent / "templates"


def cname(name: str) -> str:
    """The C++ identifier of a model or SSA name (see the module docstring)."""
    return f"{name}_"


class CppPrinter(CXX17CodePrinter):
    """sympy's C++17 printer for the kernels' expressions.

    `scalars` are the symbols of type double (params, loop invariants); every other symbol is a
    lane value of type `R`. In a lane expression (`lane=True`), a subexpression that depends on
    scalars only is a *lane constant*: it prints as a name of type `R` (the param's own name, or
    `_c<k>`) whose value, computed in double once per block and converted, the kernel keeps in
    an array (`constants`: name -> the subexpression). So the lane loops hold no double and no
    loop-invariant arithmetic, and every operation keeps the order of the torch backend's."""

    # the spelling of every built-in function (catalog name -> format string over the printed
    # arguments); the helpers `fx_*` are defined in the generated file's prologue
    SPELL: dict[str, str] = {
        "exp": "fx_exp({0})", "log": "std::log({0})", "sqrt": "std::sqrt({0})", "abs": "std::abs({0})",
        "sin": "std::sin({0})", "cos": "std::cos({0})", "tanh": "std::tanh({0})", "sigmoid": "fx_sigmoid({0})",
        "relu": "fx_relu({0})", "min": "fx_min({0}, {1})", "max": "fx_max({0}, {1})",
        "clip": "fx_clip({0}, {1}, {2})", "where": "(({0}) ? {1} : {2})", "heaviside": "fx_step_ge({0})",
        "spike_ge": "fx_step_ge({0})", "spike_gt": "fx_step_gt({0})", "detach": "{0}", "sign": "fx_sign({0})",
        "exprel": "fx_exprel({0})", "exprel_d": "fx_exprel_d({0})",
    }

    def __init__(self, scalars: set[sp.Symbol] | None = None, lane: bool = True) -> None:
        super().__init__({"strict": False})
        self.scalars = set(scalars or ())
        self.lane = lane
        self.constants: dict[str, sp.Expr] = {}  # lane constants, in order of first use
        self._names: dict[sp.Expr, str] = {}

    # ---------------------------------------------------------------- types
    def _is_lane(self, e: sp.Basic) -> bool:
        return bool(e.free_symbols - self.scalars)

    def _constant(self, e: sp.Expr) -> str:
        name = self._names.get(e)
        if name is None:
            name = cname(e.name) if isinstance(e, sp.Symbol) else f"_c{len(self._names)}"
            self._names[e] = name
            self.constants[name] = e
        return name

    def _print(self, expr, **kwargs) -> str:
        if self.lane and isinstance(expr, sp.Expr) and not self._is_lane(expr):
            if not expr.is_number:
                return self._constant(expr)
            self.lane = False  # a number: a double literal, converted
            try:
                inner = self._print(expr, **kwargs)
            finally:
                self.lane = True
            return f"R({inner})"
        if isinstance(expr, sp.Expr) and expr.is_number and not expr.is_Atom:
            try:  # a constant subexpression (sqrt(pi), exp(2)...) folds to its value
                return _double(float(expr))
            except TypeError:
                pass
        return super()._print(expr, **kwargs)

    # ---------------------------------------------------------------- names and numbers (double here:
    # in a lane expression a number is a scalar subexpression, hence R(...) by `_print`)
    def _print_Symbol(self, expr: sp.Symbol) -> str:
        return cname(expr.name)

    def _print_Float(self, expr: sp.Float) -> str:
        return _double(float(expr))

    def _print_Integer(self, expr: sp.Integer) -> str:
        return _double(float(expr))

    def _print_Rational(self, expr: sp.Rational) -> str:
        return _double(float(expr))

    def _print_Half(self, expr) -> str:
        return "0.5"

    def _print_NegativeOne(self, expr) -> str:
        return "-1.0"

    def _print_One(self, expr) -> str:
        return "1.0"

    def _print_Zero(self, expr) -> str:
        return "0.0"

    def _print_Pi(self, expr) -> str:
        return _double(float(sp.pi))

    def _print_Exp1(self, expr) -> str:
        return _double(float(sp.E))

    def _print_NumberSymbol(self, expr) -> str:
        return _double(float(expr))

    def _print_BooleanTrue(self, expr) -> str:
        return "true"

    def _print_BooleanFalse(self, expr) -> str:
        return "false"

    # ---------------------------------------------------------------- operators
    def _print_Pow(self, e, rational=False) -> str:
        base, ex = e.args
        b = self.parenthesize(base, 60)  # (above any binary operator: a product, a sum...)
        one = "R(1)" if self.lane else "1.0"
        if ex.is_number:
            fe = float(ex)
            if fe == 0.5:
                return f"std::sqrt({self._print(base)})"
            if fe == -0.5:
                return f"({one}/std::sqrt({self._print(base)}))"
            if fe.is_integer() and 0 < abs(fe) <= 16:
                prod = "*".join([b] * int(abs(fe)))
                return f"({prod})" if fe > 0 else f"({one}/({prod}))"
        if base == sp.E:
            return f"fx_exp({self._print(ex)})"
        return f"std::pow({self._print(base)}, {self._print(ex)})"

    def _print_Relational(self, e) -> str:
        return f"({self._print(e.lhs)} {e.rel_op} {self._print(e.rhs)})"

    def _print_And(self, e) -> str:
        return " && ".join(f"({self._print(a)})" for a in e.args)

    def _print_Or(self, e) -> str:
        return " || ".join(f"({self._print(a)})" for a in e.args)

    def _print_Not(self, e) -> str:
        return f"!({self._print(e.args[0])})"

    # the draws of a noisy model: filled for the block's lanes before each step's lane loop
    def _print_Randn(self, e) -> str:
        return f"_d{int(e.args[0])}[_i]"

    _print_Rand = _print_Randn

    def _print_Where(self, e) -> str:
        c, a, b = e.args
        return self.SPELL["where"].format(self._print(c), self._print(a), self._print(b))


def _double(v: float) -> str:
    """A double literal (repr keeps every digit; inf and nan by name)."""
    if v != v:
        return "std::numeric_limits<double>::quiet_NaN()"
    if v in (float("inf"), float("-inf")):
        return ("-" if v < 0 else "") + "std::numeric_limits<double>::infinity()"
    return repr(v)


def _install_spellings() -> None:
    """`_print_<SympyName>` for every built-in function, from `CppPrinter.SPELL`."""
    missing = []
    for f in ALL_FUNCTIONS.values():
        if f.sympy == "sqrt" or f"_print_{f.sympy}" in CppPrinter.__dict__:
            continue  # (sqrt is a Pow; `where` prints its condition itself)
        spelling = CppPrinter.SPELL.get(f.name)
        if spelling is None:
            missing.append(f.name)
            continue

        def _print(self: CppPrinter, e: sp.Expr, spelling: str = spelling) -> str:
            return spelling.format(*(self._print(a) for a in e.args))

        setattr(CppPrinter, f"_print_{f.sympy}", _print)
    if missing:
        raise TypeError(f"CppPrinter cannot print the built-in functions {', '.join(missing)}: give each a "
                        "spelling in CppPrinter.SPELL")


_install_spellings()


def _lanes(n_arrays: int) -> int:
    """Lanes per block: a block's arrays (states, lane constants, gradients: up to 8 bytes a
    lane) within about 48 KiB, 64 to 256 lanes."""
    lanes = 256
    while lanes > 64 and n_arrays * 8 * lanes > 48 * 1024:
        lanes //= 2
    return lanes


def _lines(pr: CppPrinter, assignments: Assignments, decl: str, origins: dict | None = None,
           src: list[str] | None = None) -> list[str]:
    """`decl name_ = expr;` lines, each group preceded by the model line it comes from."""
    out, last = [], None
    for y, e in assignments:
        pos = origins.get(y.name) if origins else None
        if pos is not None and src and pos.line != last and 0 < pos.line <= len(src):
            out.append(f"// line {pos.line}: {comment_text(src[pos.line - 1])}")
            last = pos.line
        out.append(f"{decl} {cname(y.name)} = {pr._print(e)};")
    return out


def _kernel(pr: CppPrinter, hoisted: Assignments, params: list[sp.Symbol]) -> dict[str, Any]:
    """What a kernel's block preamble computes, once the lane code is printed by `pr`: the
    invariants (double) and, per lane constant, its array index, name and value."""
    hp = CppPrinter(set(params) | {y for y, _ in hoisted}, lane=False)
    return {"hoisted_lines": _lines(hp, hoisted, "const double"),
            "constants": [{"index": i, "name": name, "value": hp._print(e)}
                          for i, (name, e) in enumerate(pr.constants.items())]}


def _draws(assignments: Assignments) -> list[dict[str, Any]]:
    """The draws a kernel's step computes: (index, "randn" or "rand"), in index order."""
    found = {int(d.args[0]): ("randn" if isinstance(d, Randn) else "rand") for _, e in assignments
             for d in draws_in(e)}
    return [{"index": k, "kind": found[k]} for k in sorted(found)]


def emit(ir: IR) -> tuple[str, CpuABI]:
    """The generated C++ source and its ABI."""
    step, bw, sch = ir.step, ir.backward, ir.schedule
    params = [p.symbol for p in step.params]
    src = source_lines(step.checked.source)
    abi = CpuABI(
        draws=step.draws, name=step.name, inputs=[x.name for x in step.inputs], states=[s.name for s in step.states],
        params=[p.name for p in step.params], learnable=[p.name for p in step.learnable],
        outputs=[n for n, _ in step.outputs], saved=[s.name for s in sch.saved], reread=[x.name for x in sch.reread],
        grad_inputs=list(sch.grad_inputs_nonzero), grad_states=list(sch.grad_states_nonzero),
        grad_params=list(sch.grad_params_nonzero))

    # ---------------- forward (lane code first: it decides the lane constants)
    lp = CppPrinter(set(params) | {y for y, _ in sch.fwd_hoisted}, lane=True)
    state_set = set(step.states)
    fwd: dict[str, Any] = {
        "body": _lines(lp, sch.fwd_body, "const R", step.origins, src),
        "outputs": [{"value": lp._print(v)} for _, v in step.outputs],
        "saved_before": [{"index": i, "name": cname(s.name)} for i, s in enumerate(sch.saved) if s in state_set],
        "saved_after": [{"index": i, "name": cname(s.name)} for i, s in enumerate(sch.saved) if s not in state_set],
        "next": [lp._print(v) for v in step.next_states],
        "draws": _draws(sch.fwd_body),
    }
    fwd.update(_kernel(lp, sch.fwd_hoisted, params))

    # ---------------- backward
    b_hoisted = [*sch.bwd_fwd_hoisted, *sch.bwd_hoisted]
    blp = CppPrinter(set(params) | {y for y, _ in b_hoisted}, lane=True)
    learn_idx = {p.name: i for i, p in enumerate(step.learnable)}
    bwd: dict[str, Any] = {
        "saved": [{"index": i, "name": cname(s.name)} for i, s in enumerate(sch.saved)],
        "reread": [{"index": step.inputs.index(x), "name": cname(x.name)} for x in sch.reread],
        "recompute": _lines(blp, sch.recompute, "const R"),
        "gouts": [{"index": i, "name": cname(g.name)}
                  for i, (g, used) in enumerate(zip(bw.grad_outputs, sch.grad_outputs_used)) if used],
        "gnext": [cname(g.name) for g in bw.grad_next_states],
        "body": _lines(blp, sch.bwd_body, "const R"),
        "grad_inputs": [{"index": i, "value": blp._print(g)}
                        for i, (g, nz) in enumerate(zip(bw.grad_inputs, sch.grad_inputs_nonzero)) if nz],
        "grad_states": [blp._print(g) for g in bw.grad_states],
        "grad_params": [{"index": learn_idx[p.name], "value": blp._print(g)}
                        for p, g, nz in zip(step.learnable, bw.grad_params, sch.grad_params_nonzero) if nz],
        "draws": _draws([*sch.recompute, *sch.bwd_body]),
    }
    bwd.update(_kernel(blp, b_hoisted, params))
    n_arrays = 2 * len(step.states) + 2 + max(len(fwd["constants"]), len(bwd["constants"]) + len(step.learnable))
    abi.lanes = _lanes(n_arrays)
    saved_note = ", ".join(s.name for s in sch.saved) or "nothing"
    if sch.reread:
        saved_note += "; inputs re-read: " + ", ".join(x.name for x in sch.reread)
    source = _env().get_template("kernels.cpp.j2").render(
        model=comment_text(step.name), filename=comment_text(step.checked.filename), notes=load_notes(step.checked), abi=abi,
        n_in=len(step.inputs), n_st=len(step.states), n_p=len(params), n_out=len(step.outputs),
        n_learn=len(step.learnable), saved_note=saved_note,
        inputs=[cname(x.name) for x in step.inputs], states=[cname(s.name) for s in step.states],
        params=[cname(p.name) for p in params], fwd=fwd, bwd=bwd,
        exprel={"bound": repr(EXPREL_SERIES_BOUND), "series": [repr(c) for c in EXPREL_D_SERIES]})
    return source, abi


@lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)  # noqa: S701 - C++ source, not HTML
    env.filters["block"] = lambda lines, n: "\n".join(" " * n + ln if ln else ln for ln in lines)
    return env


__all__ = ["CppPrinter", "CpuABI", "emit", "cname"]
