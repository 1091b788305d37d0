"""A plasticity rule's documentation page (`flexdsl doc x.rule`, a directory's `.rule` files, the
library's rules): its docstring, interface (inputs, weight and bounds, params, where each state
lives), one step's equations as written (LaTeX for the Markdown page, MathML for the HTML page, from
the same sympy expressions), the window's change as the sum of products the compiler derived, and
the rule's STDP window — the weight change of one pre/post pair against t_post - t_pre — plotted
from a simulation of the compiled rule (a short-term plasticity rule: what successive spikes carry).

    md, html, summary = rule_page(rule, "stdp_additive.rule", outdir="site")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sympy as sp
import torch

from ..frontend import ast as A
from ..ir.rule import NEXT, plan_rule
from ..ir.tosympy import to_sympy
from .units import display

SIDE_WORDS = {"pre": "per presynaptic neuron", "post": "per postsynaptic neuron", "global": "per sample",
              "synapse": "per synapse (and sample)"}
LAGS = 40  # the STDP window's half-width, in steps


def _sym(name: str) -> sp.Symbol:
    return sp.Symbol(name, real=True)


def _expr(e: A.Expr, names: set[str]) -> sp.Expr:
    return to_sympy(e, {n: _sym(n) for n in names})


def _statements(title: str, stmts: list[A.Assign], names: set[str], formula: Any) -> list[str]:
    out = [title, ""]
    for st in stmts:
        rhs = _expr(st.value, names)
        op = {"=": ("←", r"\leftarrow"), "+=": ("+=", r"\mathrel{+}="), "-=": ("−=", r"\mathrel{-}="),
              "*=": ("×=", r"\mathrel{\times}="), "/=": ("/=", r"\mathrel{/}=")}[st.op]
        out += [formula(_sym(st.target), op[0], rhs, op[1]), ""]
    return out


def _equations(rule: Any, formula: Any) -> list[str]:
    ck = rule.ir.rule
    a = ck.ast
    names = {"pre", "post", ck.weight, *(p.name for p in ck.model.params), *(s.name for s in ck.model.states),
             *(i.name for i in ck.model.inputs), *ck.model.locals}
    lines = ["## One step", "",
             "At every step, in this order (`pre`, `post`: this step's spikes of the synapse's two sides):", ""]
    eqs = a.of(A.Equations)
    then = "Then the update:" if eqs else "The update:"
    if eqs:
        t = _sym("t")
        lines += ["The traces' equations, integrated exactly over the step `dt`:", ""]
        for ln in eqs[0].lines:
            if isinstance(ln, A.ODE):
                lhs = sp.Derivative(_sym(ln.state), t, evaluate=False)
                lines += [formula(lhs, "=", _expr(ln.value, names), "="), ""]
    for upd in a.of(A.Update):
        lines += _statements(then, upd.statements, names, formula)
    for ev in a.of(A.SynapseEvent):
        side = "presynaptic" if ev.kind == "pre" else "postsynaptic"
        lines += _statements(f"Where the {side} neuron spiked (`on {ev.kind}`):", ev.statements, names, formula)
    return lines


def _change(rule: Any, formula: Any) -> list[str]:
    ck = rule.ir.rule
    plan = plan_rule(rule.ir.step, ck.weight, ck.output)
    if plan.terms is None:
        kept = [s for s in plan.of_side("synapse") if s != ck.weight]
        why = (f"its state {', '.join(f'`{s}`' for s in kept)} lives per synapse" if kept else
               "its change does not factor into presynaptic and postsynaptic parts (a clip of the weight, "
               "a product of both sides' values)")
        return ["## The window's change", "", f"This rule runs per synapse and sample, step by step: {why}.", ""]
    if not rule.changes_weight:
        return []
    W = sp.IndexedBase("W")
    i, j, t, b = (sp.Symbol(s) for s in "ijtb")
    rename = {_sym(NEXT + s): sp.Symbol(f"{s}'") for s in plan.sides}
    total = sp.Integer(0)
    for c, aa, bb in plan.terms:
        total += c.xreplace({_sym(ck.weight): W[j, i]}).xreplace(rename) * (
            aa.xreplace(rename) * bb.xreplace(rename))
    lines = ["## The window's change", "",
             "With the weights held over a call (`window`), the change is a sum over the call's steps and samples "
             "of products of a postsynaptic factor and a presynaptic one (x' is a trace after this step's update), "
             "one matrix product per term on the device:", "",
             formula(sp.IndexedBase("dW")[j, i], "=", sp.Sum(sp.Sum(total, (b, 1, sp.Symbol("B"))),
                                                               (t, 1, sp.Symbol("T"))), "="), ""]
    return lines


def stdp_window(rule: Any, lags: int = LAGS, w: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lag, dW): the change of one weight from one presynaptic and one postsynaptic spike, the
    postsynaptic `lag` steps after the presynaptic one (negative: before), for lags -lags..lags;
    simulated with the compiled rule (window semantics, the weight `w`: the middle of its bounds,
    else 1). Modulators are 1 at every step."""
    lo, hi = rule.bounds()
    if w is None:
        w = (lo + hi) / 2 if lo is not None and hi is not None else 1.0
    lag = torch.arange(-lags, lags + 1)
    # (a state per synapse, an eligibility, pays a pair out over time after the last spike: the run goes on
    # until it has, ten of the window's length)
    eligible = any(side == "synapse" for s, side in rule.sides.items() if s != rule.weight_name)
    T = 2 * lags + 3 + (10 * lags if eligible else 0)
    n = len(lag)
    pre = torch.zeros(T, 1, n, dtype=torch.float64)
    post = torch.zeros(T, 1, 1, dtype=torch.float64)
    t_post = lags + 1
    pre[t_post - lag, 0, torch.arange(n)] = 1.0
    post[t_post, 0, 0] = 1.0
    rule.reset()
    mods = {k: torch.ones(T, dtype=torch.float64) for k in rule.modulators if k not in rule.post_inputs}
    for k in rule.post_inputs:  # (a membrane at rest, depolarized by 60 for the spike's step and the next)
        rest = float(rule.param_values().get("u_rest", 0.0))
        v = torch.full((T, 1, 1), rest, dtype=torch.float64)
        v[t_post:t_post + 2] = rest + 60.0
        mods[k] = v
    with torch.no_grad():
        dw = rule.window(pre, post, torch.full((1, n), float(w), dtype=torch.float64), **mods)[0]
    rule.reset()
    return lag, dw


def _figure(rule: Any):
    from .plots import _figure as figure

    fig, axes = figure(5.4, 2.8)
    ax = axes[0][0]
    dt = rule.param_values().get("dt")
    if not rule.changes_weight and rule.has_output:
        T = 12
        pre = torch.zeros(T * 10, 1, 1, dtype=torch.float64)
        pre[::10] = 1.0
        rule.reset()
        with torch.no_grad():
            out = rule.carry(pre)[:, 0, 0]
        rule.reset()
        k = torch.arange(T)
        ax.bar(k.numpy(), out[::10].numpy(), color="tab:purple")
        ax.set_xlabel("spike number (a regular train, one spike every 10 steps)")
        ax.set_ylabel("value carried")
        ax.set_title(f"{rule.name}: what successive spikes carry", fontsize=9)
    else:
        lag, dw = stdp_window(rule, _lags(rule))
        x = lag.double() * (float(dt) if dt is not None else 1.0)
        ax.axhline(0.0, color="0.6", lw=0.8)
        ax.axvline(0.0, color="0.6", lw=0.8)
        ax.plot(x.numpy(), dw.numpy(), "o-", ms=3, color="tab:blue")
        unit = _time_unit(rule)
        ax.set_xlabel("t_post - t_pre" + (f" ({unit})" if unit else " (steps)"))
        ax.set_ylabel("weight change")
        mods = " (modulators 1)" if set(rule.modulators) - set(rule.post_inputs) else ""
        mods += " (post_ inputs +60 at the spike's step and the next)" if rule.post_inputs else ""
        ax.set_title(f"{rule.name}: the STDP window, one pair{mods}", fontsize=8)
    fig.tight_layout()
    return fig


def _lags(rule: Any) -> int:
    """Steps on each side of the window's plot: three of the rule's longest time constant (`tau*`
    params, over `dt`, each in the units it is written in), from 10 to 400."""
    from ..runtime.params import written_scale

    ck = rule.ir.checked
    vals = {k: (float(v.detach()) if isinstance(v, torch.Tensor) else float(v)) * written_scale(ck, k)
            for k, v in rule.param_values().items() if not isinstance(v, torch.Tensor) or v.numel() == 1}
    taus = [v for k, v in vals.items() if k.startswith("tau") and not k.endswith("_inv") and v > 0]
    if not taus:
        return LAGS
    steps = 3 * max(taus) / vals.get("dt", 1.0)
    return int(min(400, max(10, round(steps))))


def _time_unit(rule: Any) -> str | None:
    """The unit `dt` is written in (its param's declared unit), None where the rule has no `dt`."""
    ck = rule.ir.checked
    if not any(p.name == "dt" for p in ck.params):
        return None
    written = ck.written.param("dt") if ck.written is not None else None
    if written is not None and isinstance(written.default, A.Quantity):
        return A.quantity_unit(written.default)
    from .units import unit_of

    return unit_of(next(p for p in ck.params if p.name == "dt")) or "in the unit of dt"


def _written_unit(p: Any) -> str:
    """` ms` where the param's value is written with a unit (`20 ms`: the value the rule holds is in
    it, as on the neuron pages), else `` (a plain number, or an expression of other params)."""
    e = p.default.operand if isinstance(p.default, A.Neg) else p.default
    return f" {display(e.unit)}" if isinstance(e, A.Quantity) and e.unit else ""


def _interface(rule: Any) -> list[str]:
    ck = rule.ir.rule
    lo, hi = rule.bounds()
    bound = ("unbounded" if lo is None and hi is None else
             f"kept in [{'-∞' if lo is None else f'{lo:g}'}, {'∞' if hi is None else f'{hi:g}'}] after every update")
    reads = set(rule._gen[1]["input_reads"])
    spikes = [f"`{k}`: the {side} spikes of this step" for k, side in (("pre", "presynaptic"), ("post", "postsynaptic"))
              if k in reads]
    lines = ["## Interface", "",
             *(["- " + "; ".join(spikes) + ("" if "post" in reads else " (it reads no postsynaptic spike)")]
               if spikes else []),
             *(f"- modulator `{m}`: given at every call (a number, one per step, or one per step and sample)"
               for m in ck.modulators),
             f"- weight `{ck.weight}`: {bound}" + ("" if rule.changes_weight else " (this rule does not change it)"),
             *([f"- output `{ck.output}`: what the synapse carries instead of `pre`"] if ck.output else []), "",
             "| param | value | |", "| --- | --- | --- |"]
    vals = rule.param_values()
    written = {p.name: p for p in (ck.model.written or ck.model).params}
    for p in ck.model.params:
        v = vals[p.name]
        v = float(v.detach()) if isinstance(v, torch.Tensor) and v.numel() == 1 else v
        learn = " (learnable)" if p.name in dict(rule.named_parameters()) else ""
        unit = _written_unit(written.get(p.name, p))
        lines.append(f"| `{p.name}` | {v:g}{unit}{learn} | {p.doc} |" if isinstance(v, float) else
                     f"| `{p.name}` | {v}{unit} | {p.doc} |")
    lines += ["", "| state | lives | initial | |", "| --- | --- | --- | --- |"]
    for s in ck.model.states:
        if s.name == ck.weight or s.meta.get("hidden"):
            continue
        lines.append(f"| `{s.name}` | {SIDE_WORDS[rule.sides[s.name]]} | `{A.to_text(s.init)}` | {s.doc} |")
    return lines + [""]


def rule_page(rule: Any, label: str, index_link: str | None = None, reference: str | None = None,
              outdir: str | Path | None = None, stem: str | None = None) -> tuple[str, str, str]:
    """(Markdown, HTML, one-line summary) of a rule's page; its figure a PNG in `outdir` (named after
    `stem`), or embedded without `outdir`."""
    from .layerpage import _Formulas, guide_pages
    from .plots import figure_src

    ck = rule.ir.rule
    a = ck.ast
    formula = _Formulas()
    summary = (a.doc.strip().split("\n\n")[0].replace("\n", " ").replace("`", "") if a.doc.strip() else
               f"plasticity rule {ck.name}")  # (the index shows it as text)
    src = figure_src(_figure(rule), outdir, f"{stem or ck.name}.window.png")
    lo, hi = rule.bounds()
    held = f"{(lo + hi) / 2:g}, the middle of its bounds" if lo is not None and hi is not None else "1"
    what = ("The weight change from one presynaptic and one postsynaptic spike against their timing, simulated "
            f"with the compiled rule (window semantics; the weight {held}):"
            if rule.changes_weight else "What the synapse carries at the spikes of a regular train, simulated "
            "with the compiled rule:")
    lines = [f"# {ck.name}", "", "*plasticity rule* · " + (f"`{label}`" if not label.startswith("<") else "loaded from text"), "", *([a.doc.strip(), ""] if a.doc.strip() else []),
             *_interface(rule), *_equations(rule, formula), *_change(rule, formula),
             "## Its window" if rule.changes_weight else "## What it carries", "", what, "",
             f"![{ck.name}]({src})", "",
             "## Use", "", "```python", "import flexdsl", "",
             f"rule = flexdsl.load_rule({Path(label).stem if label.endswith('.rule') else ck.name!r})"
             if not label.startswith("<") else "rule = flexdsl.load_rule(text)           # text: the rule as written",
             *(["dW = rule.window(pre, post, W)          # weights held over the window (SpikingJelly's learners)",
                "W = rule.online(pre, post, W)           # every step's change applied (Brian2)"]
               if rule.changes_weight else []),
             *(["r = rule.carry(pre)                     # what the synapse carries instead of pre, every step"]
               if ck.output else []),
             f"m = flexdsl.feedforward(\"lif\", 700, 256, rule={Path(label).stem!r}, plasticity=\"online\")"
             if not label.startswith("<") else
             "m = flexdsl.feedforward(\"lif\", 700, 256, rule=\"my.rule\", plasticity=\"online\")  # saved as my.rule",
             "```", ""]
    md, page = guide_pages(lines, formula, f"{ck.name} (plasticity rule)", label, index_link, reference)
    return md, page, summary


__all__ = ["rule_page", "stdp_window"]
