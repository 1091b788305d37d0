"""A model page's e-prop section: the eligibility factors `ir/eprop.py` derives from the step (for the
model's first input), as equations beside the derived backward."""

from __future__ import annotations

import re

import sympy as sp

from ..ir.eprop import derive_eprop
from .mathdoc import Math, Statement, _math, latex, mathml_inner, without_temporaries

_HIDDEN = re.compile(r"(_d_)?_t(_\d+)?(__.+)?")  # `_t3`, `_d__t_3__v`: the generated code's shared temporaries

NOTE = ("With learning=\"eprop\" (a recurrent layer), each synapse into {port} keeps an eligibility vector "
        "\u03b5 ({states}), the derivative of the neuron's states along its own history: "
        "\u03b5(t) = J \u03b5(t\u22121) + b pre(t), e(t) = c \u00b7 \u03b5(t\u22121) + g pre(t), and the weight's "
        "update is \u03a3\u209c L(t) e(t), L the learning signal (the gradient reaching the output). Derived from "
        "the step (forward mode; factors not shown are 0){kept}:")


def _factor(name: str) -> Math:
    """`J[v,a]` as J with the subscript v,a."""
    head, _, rest = name.partition("[")
    parts = rest.rstrip("]").split(",")
    syms = [sp.Symbol(p) for p in parts]
    ml = "<mo>,</mo>".join(mathml_inner(s) for s in syms)
    return Math(f"<msub><mi>{head}</mi><mrow>{ml}</mrow></msub>", f"{head}_{{{','.join(latex(s) for s in syms)}}}",
                name)


def eprop_section(c) -> tuple[list[Statement], str]:
    """(statements, note) of a model's page; nothing for a model without input or with noise."""
    step = c.step
    if not step.inputs or step.draws:
        return [], ""
    e = derive_eprop(step, 0)
    own = {y for y, _ in step.assignments}
    _, subs = without_temporaries(list(step.assignments))
    shown = []
    for y, v in e.assignments:  # (a shared temporary, or a derivative of one, is substituted: not a name to read)
        v = v.xreplace(subs)
        if _HIDDEN.fullmatch(y.name):
            subs[y] = v
        elif y not in own:
            shown.append((y, v))
    sts = [Statement(_math(y), "=", _math(v)) for y, v in shown]
    sts += [Statement(_factor(n), "=", _math(v.xreplace(subs))) for n, v in e.factors() if v != 0]
    kept = ("; J and b depend on params only, so one trace per presynaptic value stands for a synapse's" if e.constant
            else "; J or b depends on the state, so the eligibility is kept per synapse")
    note = NOTE.format(port=step.inputs[0].name, states=", ".join(s.name for s in step.states), kept=kept)
    return sts, note


__all__ = ["eprop_section"]
