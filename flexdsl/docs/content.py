"""What a model's documentation says, gathered once from the compiled stages and rendered by
`htmlpage.py`, `mdpage.py`, `latexdoc.py` and the notebook display.

`describe(c)` reads the checked AST (`c.checked`: declarations, the docstring, the equations as
written — before any conversion to base units, `c.checked.written` in a model with units —,
converted to sympy with the lowering's AST fold under `sympy.evaluate(False)`, so they keep
the form the user wrote, units included), the discretized step (`c.step`, with its method) and the
derived backward (`c.backward`). Every equation carries its MathML and its LaTeX; user text
(docstring, descriptions, file names) stays plain text here and is escaped by the renderers.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sympy as sp

from .._paths import NEURONS_DIR
from ..backends.printer import load_notes
from ..frontend import ast as A
from ..frontend.catalog import METHODS, SURROGATES
from ..frontend.evaluate import evaluate
from ..frontend.parse import source_lines
from ..ir.functions import CONSTANTS, Detach
from ..ir.lower import ToSympy
from .docstring import split_doc
from .mathdoc import Math, Statement, _math, without_temporaries
from .printing import (
    UnitSymbol,
    derivative_latex,
    derivative_mathml,
    latex,
    mathml_inner,
)
from .units import declared_unit, unit_label

if TYPE_CHECKING:
    from ..runtime.compiler import Compiled


@dataclass
class Row:
    """A row of the inputs, params or states table."""

    name: str
    symbol: Math
    description: str
    unit: str | None
    unit_declared: bool
    value: Math | None = None  # default / initial value as written
    number: float | None = None  # its value (None where it is the plain number written)
    constraint: Math | None = None
    constraint_text: str = ""
    learnable: bool = False
    line: int = 0
    current: str | None = None  # a loaded module's value where it differs from the default


@dataclass
class Block:
    """A titled group of statements (one block of the model, or a derived one)."""

    title: str
    statements: list[Statement]
    note: str = ""


@dataclass
class SurrogateDoc:
    name: str
    call: str  # as used: sigmoid(alpha=4.0)
    generic: Statement  # S'(x) with its keywords as symbols
    applied: Statement  # S'(u) of this model, keywords substituted
    u: Statement  # u = A - B
    source: str  # who defines it (SpikingJelly, snnTorch; user)
    user: bool


@dataclass
class ModelDoc:
    name: str
    stem: str
    filename: str
    library: bool  # a packaged model (loadable by its stem)
    summary: str
    blocks: list[tuple[str, str]]  # the docstring: ("p" | "pre", text)
    reference: str
    inputs: list[Row]
    params: list[Row]
    states: list[Row]
    written: list[Block]  # the equations as written
    outputs: list[str]
    spiking: bool
    method: str | None
    method_auto: bool
    method_doc: str
    step: Block
    next_states: list[Statement]
    step_outputs: list[Statement]
    surrogate: SurrogateDoc | None
    backward: Block
    backward_given: list[Math]
    backward_results: list[Statement]
    source: str
    sources: dict[str, str] = field(default_factory=dict)  # backend name -> its generated code (`_sources`)
    notes: list[str] = field(default_factory=list)  # what was chosen at load; the bounds' parametrizations
    options: Any = None  # the load-time options (frontend/options.py LoadOptions)
    stochastic: bool = False  # the step draws random numbers (white noise, randn(), rand())
    bookkeeping: list[str] = field(default_factory=list)  # the states flexdsl added (refractoriness, crossings)
    stop_gradient: bool = False  # the step holds a stop-gradient (sg: detach_reset, the bookkeeping)
    eprop: list[Statement] = field(default_factory=list)  # e-prop's factors (docs/eprop.py)
    eprop_note: str = ""


# ----------------------------------------------------------------------------- helpers
def _sym(name: str) -> sp.Symbol:
    return sp.Symbol(name, real=True)


def _name(name: str) -> Math:
    return _math(_sym(name))


class _WrittenSympy(ToSympy):
    """The lowering's AST -> sympy, also for what only a model as written holds: numbers with
    units (`10 ms`) and bare unit names (`0.1/mV/ms`), kept as upright unit symbols."""

    def visit_Quantity(self, e: A.Quantity) -> sp.Expr:
        num = self.visit_Num(A.Num(e.value, e.text, e.pos))
        u: sp.Expr = UnitSymbol(e.unit)
        if e.power != 1:
            u = sp.Pow(u, sp.Integer(int(e.power)) if float(e.power).is_integer() else sp.Float(e.power))
        return sp.Mul(num, u)

    def visit_Name(self, e: A.Name) -> sp.Expr:
        if e.id in self.env or e.id in CONSTANTS:
            return super().visit_Name(e)
        return UnitSymbol(e.id)


class _Written:
    """AST expressions to sympy as written (no evaluation) and to Math."""

    def __init__(self, c: Compiled) -> None:
        ck = c.checked
        names = [d.name for d in [*ck.inputs, *ck.params, *ck.states]] + list(ck.locals) + list(ck.subexprs)
        self.env = {n: _sym(n) for n in [*names, *ck.noise]}  # (white noise `xi` shows as ξ)

    def to_sympy(self, e: A.Expr, env: dict[str, sp.Expr]) -> sp.Expr:
        return _WrittenSympy(env).fold(e)

    def expr(self, e: A.Expr) -> sp.Expr:
        with sp.evaluate(False):
            return self.to_sympy(e, self.env)

    def math(self, e: A.Expr, inline: bool = False) -> Math:
        return _math(self.expr(e), order="none", inline=inline)

    def compare(self, e: A.Compare) -> Math:
        """A comparison or a chain (`0 <= a <= 1`) as written."""
        ops = {"<": ("<", "<"), "<=": ("\u2264", r"\leq"), ">": (">", ">"), ">=": ("\u2265", r"\geq"),
               "==": ("=", "="), "!=": ("\u2260", r"\neq")}
        parts = [self.math(o, inline=True) for o in e.operands]
        ml = parts[0].mathml
        tx = parts[0].latex
        text = parts[0].text
        for op, p in zip(e.ops, parts[1:]):
            ml += f"<mo>{html.escape(ops[op][0])}</mo>{p.mathml}"
            tx += f" {ops[op][1]} {p.latex}"
            text += f" {op} {p.text}"
        return Math(f"<mrow>{ml}</mrow>", tx, text)


def _source_line(c: Compiled, line: int) -> str:
    lines = source_lines(c.text)
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


_OPS = {"=": "\u2190"}


def _assign(c: Compiled, w: _Written, st: A.Assign) -> Statement:
    op = _OPS.get(st.op, st.op)
    return Statement(_name(st.target), op, _held(w.math(st.value), st.held), st.pos.line,
                     _source_line(c, st.pos.line), "let" if st.is_let else "")


def _held(m: Math, held: bool) -> Math:
    """`m`, followed by "unless refractory" for a statement that holds while refractory."""
    if not held:
        return m
    return Math(f'{m.mathml}<mspace width="1em"></mspace><mtext>unless refractory</mtext>',
                rf"{m.latex} \quad \text{{unless refractory}}", f"{m.text} unless refractory")


def _fmt(v: float) -> str:
    return f"{v:.6g}"


# ----------------------------------------------------------------------------- describe
def describe(c: Compiled, sources: bool = True, current: dict[str, Any] | None = None) -> ModelDoc:
    """Everything a model's page shows (without the plots); `current`: a loaded module's param
    values, shown where they differ from the defaults."""
    ck = c.checked
    w = _Written(c)
    stem, library = _identity(c)
    summary, blocks, reference = split_doc(ck.ast.doc)
    inputs, params, states = _tables(c, w, current)
    written, spike_doc = _written_blocks(c, w)
    step, next_states, outs, method_doc = _derived_step(c)
    bsts, given, results = _derived_backward(c)
    from .eprop import eprop_section  # (it imports this module)

    eprop, eprop_note = eprop_section(c)
    return ModelDoc(
        name=ck.name, stem=stem, filename=c.filename, library=library, summary=summary, blocks=blocks,
        reference=reference, inputs=inputs, params=params, states=states, written=written,
        outputs=[n for n, _ in ck.outputs], spiking=ck.spike is not None, method=c.step.method,
        method_auto=bool(c.step.method and c.step.method_auto), method_doc=method_doc,
        step=step, next_states=next_states, step_outputs=outs, surrogate=spike_doc,
        backward=Block("backward", bsts), backward_given=given, backward_results=results, source=c.text,
        sources=_sources(c) if sources else {}, notes=load_notes(ck, code=False), options=ck.options,
        stochastic=ck.stochastic, bookkeeping=[s.name.lstrip("_") for s in ck.states if s.meta.get("hidden")],
        stop_gradient=any(e.has(Detach) for _, e in c.step.assignments), eprop=eprop, eprop_note=eprop_note)


def _identity(c: Compiled) -> tuple[str, bool]:
    """(stem, library): the page's name, and whether the model is a packaged one."""
    from pathlib import Path

    path = Path(c.filename)
    stem = path.stem if c.filename != "<string>" else c.checked.name.lower()
    try:
        library = path.resolve().parent == NEURONS_DIR.resolve() and path.suffix == ".neuron"
    except OSError:
        library = False
    return stem, library


def _tables(c: Compiled, w: _Written, current: dict[str, Any] | None) -> tuple[list[Row], list[Row], list[Row]]:
    """The inputs, params and states tables: values computed from the converted model, shown as
    written (on one line: a table cell is no place for stacked fractions)."""
    ck = c.checked
    wk = ck.written or ck  # as written: in a model with units, before their conversion to base units
    w_params = {p.name: p for p in wk.params}
    w_states = {s.name: s for s in wk.states}
    env: dict[str, float] = {}
    params: list[Row] = []
    for p in ck.params:
        try:
            env[p.name] = float(evaluate(p.default, env))
        except (ArithmeticError, ValueError):  # pragma: no cover - the checker evaluated it already
            env[p.name] = float("nan")
        pw = w_params.get(p.name, p)
        plain = _plain_number(p.default)  # (a number with a unit, `10 ms`: the number; the unit has its column)
        params.append(Row(p.name, _name(p.name), p.doc, unit_label(p), declared_unit(p),
                          w.math(p.default if plain else pw.default, inline=True), None if plain else env[p.name],
                          w.compare(pw.where) if pw.where is not None else None, _where_text(c, p.where),
                          p.learnable, p.pos.line, _differs(current, p.name, env[p.name])))
    states = []
    for s in ck.states:
        if s.meta.get("hidden"):  # bookkeeping of refractoriness and crossing rules, not the model's own
            continue
        try:
            v0 = float(evaluate(s.init, env))
        except (ArithmeticError, ValueError):  # pragma: no cover - the checker evaluated it already
            v0 = float("nan")
        sw = w_states.get(s.name, s)
        states.append(Row(s.name, _name(s.name), s.doc, unit_label(s), declared_unit(s), w.math(sw.init, inline=True),
                          None if _plain_number(sw.init) else v0, line=s.pos.line))
    inputs = [Row(i.name, _name(i.name), i.doc, unit_label(i), declared_unit(i), line=i.pos.line) for i in ck.inputs]
    return inputs, params, states


def _written_blocks(c: Compiled, w: _Written) -> tuple[list[Block], SurrogateDoc | None]:
    """The equations as written, in the order of a step, and the surrogate."""
    ck = c.checked
    wk = ck.written or ck
    written: list[Block] = []
    if wk.equations is not None:
        sts = []
        for ln in wk.equations.lines:
            if isinstance(ln, A.ODE):
                lhs = Math(derivative_mathml(ln.state), derivative_latex(ln.state), f"d{ln.state}/dt")
                sts.append(Statement(lhs, "=", _held(w.math(ln.value), ln.held), ln.pos.line,
                                     _source_line(c, ln.pos.line)))
            else:
                sts.append(Statement(_name(ln.name), "=", w.math(ln.value), ln.pos.line,
                                     _source_line(c, ln.pos.line)))
        how = f"method {ck.method}" if ck.method else f"method {c.step.method}, chosen automatically"
        written.append(Block("equations", sts, f"integrated over one step dt ({how})"))
    if wk.update:
        written.append(Block("update", [_assign(c, w, st) for st in wk.update],
                             "in order; each statement sees the results of the previous ones"))
    spike_doc = None
    if wk.spike is not None:
        written.append(_spike_block(c, w, wk.spike))
        spike_doc = _surrogate_doc(c, w, w.math(wk.spike.left), w.math(wk.spike.right))
    if wk.refractory is not None:
        written.append(_refractory_block(c, w, wk.refractory))
    if wk.on_spike:
        written.append(Block("on spike", [_assign(c, w, st) for st in wk.on_spike],
                             "simultaneously, on the values after the update: X \u2190 e means "
                             "X \u2190 spike\u00b7e + (1 \u2212 spike)\u00b7X, X += e means X \u2190 X + spike\u00b7e"))
    return written, spike_doc


def _spike_block(c: Compiled, w: _Written, rule: Any) -> Block:
    a, b = w.math(rule.left), w.math(rule.right)
    op = rule.op
    if rule.written:  # `A < B` as written (stored as `B > A`)
        a, b, op = b, a, rule.written
    op_ml, op_tx = {">=": ("\u2265", r"\geq"), "crosses": ("\u2197", r"\nearrow"), "<": ("&lt;", r"\lt"),
                    "<=": ("\u2264", r"\leq")}.get(op, (">", ">"))
    rhs = Math(f'<mrow><mo stretchy="false">[</mo>{a.mathml}<mo>{op_ml}</mo>{b.mathml}<mo stretchy="false">]</mo></mrow>',
               rf"\left[{a.latex} {op_tx} {b.latex}\right]", f"[{a.text} {op} {b.text}]")
    st = Statement(_name("spike"), "=", rhs, rule.pos.line, _source_line(c, rule.pos.line))
    cond = ("is 1 at the step where the left side crosses the right side upwards (one spike per "
            "excursion), else 0" if rule.op == "crosses" else
            "is 1 where the condition holds, else 0")
    return Block("spike", [st], f"[\u2026] {cond}; backward uses the surrogate's S\u2032(u) as d spike / d u")


def _refractory_block(c: Compiled, w: _Written, rf: Any) -> Block:
    ref = _name("refractory")
    if rf.period is not None:
        st = Statement(Math(ref.mathml, ref.latex, "refractory period"), "=", w.math(rf.period), rf.pos.line,
                       _source_line(c, rf.pos.line))
        what = "after a spike, for this long"
    else:
        assert rf.condition is not None
        st = Statement(ref, "while", w.compare(rf.condition), rf.pos.line, _source_line(c, rf.pos.line))
        what = "after a spike, as long as the condition holds"
    return Block("refractory", [st], f"{what} the neuron is refractory: it cannot spike, and statements marked "
                                     "\u201cunless refractory\u201d hold their state")


def _derived_step(c: Compiled) -> tuple[Block, list[Statement], list[Statement], str]:
    """The discretized step (no temporaries), the new states, the outputs, the method's text."""
    step = c.step
    shown, subs = without_temporaries(list(step.assignments))

    def line(y: sp.Symbol) -> int:
        return (step.origins.get(y.name) or A.Pos(0, 0)).line

    sts = [Statement(_math(y), "=", _math(e), line(y), _source_line(c, line(y))) for y, e in shown]
    next_states = [Statement(Math(_next(s.name), rf"{latex(s)}'", f"{s.name}'"), "=", _math(v.xreplace(subs)))
                   for s, v in zip(step.states, step.next_states)]
    outs = [Statement(_name(n), "=", _math(v.xreplace(subs))) for n, v in step.outputs]
    method_doc = METHODS[step.method].doc if step.method else ""
    return Block("step", sts), next_states, outs, method_doc


def _derived_backward(c: Compiled) -> tuple[list[Statement], list[Math], list[Statement]]:
    """The backward (no temporaries), the gradients it is given, and the gradients it returns."""
    step, bw = c.step, c.backward
    adj = frozenset({g.name for g in [*bw.grad_outputs, *bw.grad_next_states]}
                    | {y.name for y, _ in bw.assignments if y.name.startswith("grad_")})
    _, forward = without_temporaries(list(step.assignments))
    # a backward's expressions are values: a stop-gradient in one (the forward's, re-used) is its argument
    plain = [(y, e.replace(Detach, lambda a: a)) for y, e in bw.assignments]
    shown, subs = without_temporaries(plain, forward)
    bsts = [Statement(_math(y, adj), "=", _math(e, adj)) for y, e in shown]
    given = [_math(g, adj) for g in [*bw.grad_outputs, *bw.grad_next_states]]
    results = []
    for leaf, g in [*zip(step.inputs, bw.grad_inputs), *zip(step.states, bw.grad_states),
                    *zip((p.symbol for p in step.learnable), bw.grad_params)]:
        lhs = Math(f"<mfrac><mrow><mo>\u2202</mo><mi>L</mi></mrow><mrow><mo>\u2202</mo>{mathml_inner(leaf)}</mrow>"
                   "</mfrac>", rf"\frac{{\partial L}}{{\partial {latex(leaf)}}}", f"dL/d{leaf.name}")
        results.append(Statement(lhs, "=", _math(g.xreplace(subs).replace(Detach, lambda a: a), adj)))
    return bsts, given, results


def _sources(c: Compiled) -> dict[str, str]:
    """The generated code a model page shows: the reference backend's, then every backend's that
    has a `docs_title` (the registry's)."""
    from .. import backends

    srcs = {backends.REFERENCE: c.source(backends.REFERENCE)}
    for name in source_titles():
        if name not in srcs:
            try:
                srcs[name] = c.source(name)
            except Exception as e:  # noqa: BLE001 - the page says why instead of failing
                srcs[name] = f"# {source_titles()[name]}: could not be generated here: {e}\n"
    return srcs


def source_titles() -> dict[str, str]:
    """Each backend whose code the pages show, with its title."""
    from .. import backends

    out = {}
    for name in backends.names():
        title = getattr(backends.get(name), "docs_title", None)
        if title:
            out[name] = title
    return out


def _plain_number(e: A.Expr) -> bool:
    """A number as written (`2.0`, `-70.6`, `0 pA`): its value needs no second mention."""
    return isinstance(e, A.Num | A.Quantity) or (isinstance(e, A.Neg) and isinstance(e.operand, A.Num | A.Quantity))


def _differs(current: dict[str, Any] | None, name: str, default: float) -> str | None:
    if not current or name not in current:
        return None
    v = current[name]
    if hasattr(v, "detach"):  # a learnable param: its value, without the autograd graph (and its warning)
        v = v.detach()
    try:
        f = float(v)
    except (TypeError, ValueError, RuntimeError):  # a per-channel tensor
        shape = tuple(getattr(v, "shape", ()))
        return f"per channel, shape {shape}"
    return None if f == default else f"{f:.6g}"


_S_PRIME = '<mi>S</mi><mo lspace="0" rspace="0">\u2032</mo>'


def _next(name: str) -> str:
    return f'<mrow>{mathml_inner(_sym(name))}<mo lspace="0" rspace="0">\u2032</mo></mrow>'


def _where_text(c: Compiled, where: A.Compare | None) -> str:
    if where is None:
        return ""
    return A.constraint_text(c.text, where)  # the constraint's text as written


def _surrogate_doc(c: Compiled, w: _Written, a: Math, b: Math) -> SurrogateDoc:
    ck = c.checked
    rs = ck.surrogate
    sur = c.step.surrogate
    assert rs is not None and sur is not None
    x = _sym("x")
    kw_syms = {k: _sym(k) for k in rs.kwargs}
    if rs.user is not None:
        local = dict(w.env)
        local.update(kw_syms)
        local[rs.arg] = _sym(rs.arg)
        with sp.evaluate(False):
            generic = w.to_sympy(rs.user.body, local)
        x = _sym(rs.arg)
        source = "defined in this model"
    else:
        from ..ir.surrogates import BUILTIN_SURROGATES

        generic = BUILTIN_SURROGATES[rs.name].derivative(x, **kw_syms)
        source = SURROGATES[rs.name].source
    call = surrogate_call(c) or rs.name  # as written: keywords with their units (alpha=1/mV)
    lhs_g = Math(f"<mrow>{_S_PRIME}<mo stretchy=\"false\">(</mo>{mathml_inner(x)}<mo stretchy=\"false\">)</mo></mrow>",
                 f"S'({latex(x)})", f"S'({x.name})")
    lhs_u = Math(f"<mrow>{_S_PRIME}<mo stretchy=\"false\">(</mo><mi>u</mi><mo stretchy=\"false\">)</mo></mrow>", "S'(u)",
                 "S'(u)")
    u = Statement(Math("<mi>u</mi>", "u", "u"), "=",
                  Math(f"<mrow>{a.mathml}<mo>\u2212</mo>{_paren(b)}</mrow>", f"{a.latex} - {_paren_tex(b)}",
                       f"{a.text} - ({b.text})"))
    return SurrogateDoc(rs.name, call, Statement(lhs_g, "=", _math(generic, order="none" if rs.user else None)), Statement(lhs_u, "=",
                        _math(sur.derivative)), u, source, rs.user is not None)


def _paren(m: Math) -> str:
    return m.mathml if re.fullmatch(r"<m[in]>[^<]*</m[in]>|<msub>.*</msub>", m.mathml) else (
        f"<mrow><mo>(</mo>{m.mathml}<mo>)</mo></mrow>")


def _paren_tex(m: Math) -> str:
    return m.latex if re.fullmatch(r"[\\A-Za-z0-9_{}.]+", m.latex) else rf"\left({m.latex}\right)"


def surrogate_call(c: Compiled) -> str | None:
    """The surrogate as the model writes it, keywords with their units: `sigmoid(alpha=1/mV)`."""
    rs = c.checked.surrogate
    if rs is None:
        return None
    ws = (c.checked.written or c.checked).surrogate or rs
    return f"{rs.name}(" + ", ".join(f"{k}={_kw_text(c, None, v)}" for k, v in ws.kwargs.items()) + ")"


def _kw_text(c: Compiled, w: _Written | None, e: A.Expr) -> str:
    """A surrogate keyword's value as written in the model (a default: its value)."""
    if isinstance(e, A.Num):
        return e.text
    return A.to_text(e)


def derived_note(doc: ModelDoc) -> str:
    """What the derived step's names and functions beyond the model's own mean (empty: none)."""
    out = ""
    if doc.bookkeeping:
        names = ", ".join(doc.bookkeeping)
        out += (f"; in sans-serif ({names}): the state{'s' if len(doc.bookkeeping) > 1 else ''} flexdsl adds to "
                "keep refractoriness and threshold crossings from step to step")
    if doc.stop_gradient:
        out += "; sg(x) is x with no gradient through it (a stop-gradient)"
    return out


def method_text(doc: ModelDoc) -> str:
    if not doc.method:
        return ""
    return f"{doc.method}" + (" (chosen automatically)" if doc.method_auto else "")


__all__ = ["describe", "derived_note", "ModelDoc", "Statement", "Math", "Row", "Block", "SurrogateDoc", "split_doc", "method_text"]
