"""Located errors for malformed `.neuron` inputs (docs/language.md, sections 2–5 and 10).

Every case is a small model (mostly the LIF of docs/language.md, section 1) with one thing
broken.  The expected position is the 1-based (line, column) of the start of the
offending token; it is computed from the case text by `At(line_substring, token)`
so that the numbers cannot drift from the text.  Where the contract leaves the
exact token open (e.g. `*=` versus its target), a case lists the few acceptable
positions.

Each case checks:
  * `flexdsl.loads(text)` raises `flexdsl.FlexDSLError`;
  * `.line` / `.column` equal the expected position;
  * the message starts with `<string>:LINE:COL: error:`;
  * the message shows the offending source line and a caret `^` under the column;
  * the message (outside the echoed source line) contains the given substrings
    (a tuple means "any of these", case-insensitive).
"""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import flexdsl
from flexdsl.errors import printable

# --------------------------------------------------------------------------- #
# base models
# --------------------------------------------------------------------------- #
LIF = textwrap.dedent("""\
    neuron LIF:
        input x
        param tau = 2.0 where tau > 1
        param v_threshold = 1.0
        param v_reset = 0.0
        state v = v_reset

        update:
            v = v + (x - (v - v_reset)) / tau

        spike when v >= v_threshold surrogate sigmoid(alpha=4.0)

        on spike:
            v = v_reset

        output spike
    """)

ODE = textwrap.dedent("""\
    neuron LIF_ODE:
        input I
        param dt = 0.1
        param tau_m = 10.0 where tau_m > 0
        param v_rest = 0.0
        param v_threshold = 1.0
        state v = v_rest

        equations method exact:
            dv/dt = (v_rest - v + I) / tau_m

        spike when v > v_threshold surrogate atan(alpha=2.0)
        on spike:
            v = v_rest
        output spike
    """)

UPDATE_LINE = "        v = v + (x - (v - v_reset)) / tau"
RESET_LINE = "        v = v_reset\n"  # the `on spike:` statement of LIF
ODE_LINE = "        dv/dt = (v_rest - v + I) / tau_m"


def mut(base: str, old: str, new: str) -> str:
    """Replace the first occurrence of `old` by `new` (which must exist)."""
    assert old in base, (old, base)
    return base.replace(old, new, 1)


# --------------------------------------------------------------------------- #
# expected positions
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class At:
    """Position of `token` (its `nth` occurrence) on the first line containing `line`.

    token "$EOL" means the column just after the last character of the line
    (where a missing `:` would have to go)."""

    line: str
    token: str
    nth: int = 1

    def resolve(self, text: str) -> tuple[int, int]:
        lines = text.split("\n")
        for i, src in enumerate(lines):
            if self.line in src:
                if self.token == "$EOL":
                    return i + 1, len(src.rstrip()) + 1
                col = -1
                for _ in range(self.nth):
                    col = src.index(self.token, col + 1)
                return i + 1, col + 1
        raise AssertionError(f"line {self.line!r} not in case text")


@dataclass(frozen=True)
class LC:
    """An explicit (line, column)."""

    line: int
    col: int

    def resolve(self, text: str) -> tuple[int, int]:
        return self.line, self.col


@dataclass
class Case:
    id: str
    text: str
    at: object  # At | LC | list of them (acceptable alternatives)
    subs: tuple = ()  # each: str (must appear) or tuple of str (any must appear)
    overrides: dict = field(default_factory=dict)

    def positions(self) -> list[tuple[int, int]]:
        alts = self.at if isinstance(self.at, list) else [self.at]
        return [a.resolve(self.text) for a in alts]


UNKNOWN = ("unknown", "undefined", "undeclared", "not declared", "not defined", "did you mean")
DUP = ("duplicate", "already", "redeclar", "redefin", "twice", "more than once")
ARITY = ("argument", "arity")
RESERVED = ("reserved",)
KEYWORD = ("keyword", "reserved")
CONSTRAINT = ("constraint", "where", "violat", "must", "not satisf")
SYNTAX = ("unexpected", "expected", "stray", "invalid")

DID = "did you mean"

_ODE_NO_DT = mut(ODE, "    param dt = 0.1\n", "")
_ODE_NL = mut(ODE, ODE_LINE, "        dv/dt = (v_rest - v*v + I) / tau_m")
_NO_INPUT = mut(mut(LIF, "    input x\n", ""), UPDATE_LINE, "        v = v - (v - v_reset) / tau")
_NO_HEADER = textwrap.dedent("\n".join(LIF.split("\n")[1:]))
_TWO = LIF + textwrap.dedent("""\

    neuron B:
        input y
        state u = 0.0
        update:
            u = y
        output u
    """)
_SURR_USER = mut(
    mut(
        LIF,
        "    state v = v_reset\n",
        "    state v = v_reset\n    surrogate mine(u, k=1.0) = k / (1 + abs(zz))\n",
    ),
    "surrogate sigmoid(alpha=4.0)",
    "surrogate mine(k=2.0)",
)


CASES: list[Case] = [
    # ---------------------------------------------------------------- syntax
    Case(
        "missing_colon_header",
        mut(LIF, "neuron LIF:", "neuron LIF"),
        At("neuron LIF", "$EOL"),
        (("colon", "':'", "`:`", '":"', "expected"),),
    ),
    Case(
        "missing_colon_update",
        mut(LIF, "    update:", "    update"),
        At("    update", "$EOL"),
        (("colon", "':'", "`:`", '":"', "expected"),),
    ),
    Case(
        "missing_colon_on_spike",
        mut(LIF, "    on spike:", "    on spike"),
        At("    on spike", "$EOL"),
        (("colon", "':'", "`:`", '":"', "expected"),),
    ),
    Case(
        "missing_colon_equations",
        mut(ODE, "equations method exact:", "equations method exact"),
        At("equations method exact", "$EOL"),
        (("colon", "':'", "`:`", '":"', "expected"),),
    ),
    Case(
        "unexpected_indent",
        mut(LIF, UPDATE_LINE, UPDATE_LINE + "\n            v = v * 0.5"),
        At("            v = v * 0.5", "v"),
        ("indent",),
    ),
    Case(
        "bad_dedent",
        mut(LIF, UPDATE_LINE, UPDATE_LINE + "\n      v = v * 0.5"),
        At("      v = v * 0.5", "v"),
        ("indent",),
    ),
    Case(
        "unterminated_string",
        mut(LIF, "    input x\n", '    input x "input current\n'),
        At('input x "input', '"'),
        (("unterminated", "string", "quote"),),
    ),
    Case(
        "unterminated_docstring",
        mut(LIF, "neuron LIF:\n", 'neuron LIF:\n    """Leaky neuron\n'),
        At('"""Leaky', '"""'),
        (("unterminated", "string", "docstring", "quote"),),
    ),
    Case(
        "stray_number",
        mut(LIF, "param v_threshold = 1.0", "param v_threshold = 1.0 2.0"),
        At("param v_threshold", "2.0"),
        (SYNTAX,),
    ),
    Case(
        "stray_paren",
        mut(LIF, UPDATE_LINE, UPDATE_LINE + " )"),
        At("/ tau )", ")", 3),
        (SYNTAX + ("paren",),),
    ),
    Case(
        "missing_equals_param",
        mut(LIF, "param v_threshold = 1.0", "param v_threshold 1.0"),
        At("param v_threshold", "1.0"),
        (("=", "expected"),),
    ),
    Case(
        "missing_equals_update",
        mut(LIF, UPDATE_LINE, "        v v + (x - (v - v_reset)) / tau"),
        At("        v v +", "v", 2),
        (SYNTAX + ("=",),),
    ),
    Case(
        "invalid_character",
        mut(LIF, UPDATE_LINE, "        v = v $ (x - (v - v_reset)) / tau"),
        At("v = v $", "$"),
        (SYNTAX + ("character",),),
    ),
    # ---------------------------------------------------------- unknown names
    Case(
        "unknown_in_update",
        mut(LIF, UPDATE_LINE, "        v = v + (x - (v - v_reset)) / tua"),
        At("/ tua", "tua"),
        ("tua", DID, "`tau`"),
    ),
    Case(
        "unknown_in_spike",
        mut(LIF, "v >= v_threshold", "v >= v_thresold"),
        At("spike when", "v_thresold"),
        ("v_thresold", DID, "v_threshold"),
    ),
    Case(
        "unknown_in_param_default",
        mut(LIF, "param v_threshold = 1.0", "param v_threshold = 0.5 * tauu"),
        At("param v_threshold", "tauu"),
        ("tauu", DID, "`tau`"),
    ),
    Case(
        "unknown_in_state_init",
        mut(LIF, "state v = v_reset", "state v = v_rset"),
        At("state v", "v_rset"),
        ("v_rset", DID, "v_reset"),
    ),
    Case(
        "unknown_in_where",
        mut(LIF, "where tau > 1", "where tua > 1"),
        At("param tau", "tua"),
        ("tua", DID, "`tau`"),
    ),
    Case(
        "unknown_in_on_spike",
        mut(LIF, RESET_LINE, "        v = v_reste\n"),
        At("v = v_reste", "v_reste"),
        ("v_reste", DID, "v_reset"),
    ),
    Case(
        "unknown_in_output",
        mut(LIF, "output spike", "output spike, vv"),
        At("output spike", "vv"),
        ("vv", UNKNOWN),
    ),
    Case(
        "unknown_in_equations",
        mut(ODE, ODE_LINE, "        dv/dt = (v_rst - v + I) / tau_m"),
        At("dv/dt", "v_rst"),
        ("v_rst", DID, "v_rest"),
    ),
    Case(
        "unknown_function",
        mut(LIF, UPDATE_LINE, "        v = v + (x - (v - v_reset)) / expp(tau)"),
        At("/ expp", "expp"),
        ("expp", DID, "`exp`"),
    ),
    Case(
        "dt_not_declared_in_update",
        mut(LIF, UPDATE_LINE, "        v = v + dt * (x - v) / tau"),
        At("v = v + dt", "dt"),
        ("dt", UNKNOWN + ("param",)),
    ),
    Case(
        "unknown_augassign_target",
        mut(LIF, UPDATE_LINE, UPDATE_LINE + "\n        w += 1.0"),
        At("w += 1.0", "w"),
        (UNKNOWN + ("state", "defined"),),
    ),
    Case("unknown_in_user_surrogate", _SURR_USER, At("surrogate mine(u", "zz"), (UNKNOWN,)),
    Case(
        "param_uses_later_param",
        mut(LIF, "param tau = 2.0", "param tau = v_threshold * 2.0"),
        At("param tau", "v_threshold"),
        ("v_threshold", ("before", "declared", "later", "order", "defined", "unknown", "earlier")),
    ),
    # ------------------------------------------------------ declarations
    Case(
        "duplicate_param",
        mut(LIF, "    param v_reset = 0.0\n", "    param v_reset = 0.0\n    param tau = 3.0\n"),
        At("param tau = 3.0", "tau"),
        ("tau", DUP),
    ),
    Case(
        "duplicate_state_vs_param",
        mut(LIF, "    state v = v_reset\n", "    state v = v_reset\n    state tau = 0.0\n"),
        At("state tau", "tau"),
        ("tau", DUP),
    ),
    Case("duplicate_input", mut(LIF, "    input x\n", "    input x, x\n"), At("input x, x", "x", 2), (DUP,)),
    Case(
        "reserved_param_spike",
        mut(LIF, "    param v_reset = 0.0\n", "    param v_reset = 0.0\n    param spike = 1.0\n"),
        At("param spike", "spike"),
        ("spike", RESERVED),
    ),
    Case(
        "reserved_state_spike",
        mut(LIF, "    state v = v_reset\n", "    state v = v_reset\n    state spike = 0.0\n"),
        At("state spike", "spike"),
        ("spike", RESERVED + ("cannot be declared",)),
    ),
    Case(
        "reserved_state_where",
        mut(LIF, "    state v = v_reset\n", "    state v = v_reset\n    state where = 0.0\n"),
        At("state where", "where"),
        ("where", RESERVED + ("cannot be declared", "built-in")),
    ),
    Case(
        "reserved_param_input",
        mut(LIF, "    param v_reset = 0.0\n", "    param v_reset = 0.0\n    param input = 1.0\n"),
        At("param input", "input"),
        ("input", RESERVED),
    ),
    Case(
        "reserved_input_learnable",
        mut(LIF, "    input x\n", "    input x, learnable\n"),
        At("input x, learnable", "learnable"),
        ("learnable", RESERVED),
    ),
    Case(
        "python_keyword_param_lambda",
        mut(LIF, "    param v_reset = 0.0\n", "    param v_reset = 0.0\n    param lambda = 1.0\n"),
        At("param lambda", "lambda"),
        ("lambda", KEYWORD),
    ),
    Case(
        "python_keyword_state_class",
        mut(LIF, "    state v = v_reset\n", "    state v = v_reset\n    state class = 0.0\n"),
        At("state class", "class"),
        ("class", KEYWORD),
    ),
    Case(
        "python_keyword_input_import",
        mut(LIF, "    input x\n", "    input x, import\n"),
        At("input x, import", "import"),
        ("import", KEYWORD),
    ),
    Case(
        "underscore_param",
        mut(LIF, "    param v_reset = 0.0\n", "    param v_reset = 0.0\n    param _tau = 2.0\n"),
        At("param _tau", "_tau"),
        (("underscore", "_tau", "'_'", "`_`", "identifier", "name"),),
    ),
    Case(
        "underscore_state_dunder",
        mut(LIF, "    state v = v_reset\n", "    state v = v_reset\n    state __w = 0.0\n"),
        At("state __w", "__w"),
        (("underscore", "__w", "'_'", "`_`", "identifier", "name"),),
    ),
    Case(
        "state_init_uses_state",
        mut(LIF, "    state v = v_reset\n", "    state v = v_reset\n    state w = v\n"),
        At("state w = v", "v"),
        (("param", "state", "initial"),),
    ),
    Case(
        "state_init_uses_input",
        mut(LIF, "state v = v_reset", "state v = x"),
        At("state v = x", "x"),
        (("param", "input", "initial"),),
    ),
    Case(
        "param_default_uses_state",
        mut(LIF, "    state v = v_reset\n", "    state v = v_reset\n    param k = v\n"),
        At("param k = v", "v"),
        (("param", "state", "constant", "before", "declared"),),
    ),
    Case("no_input", _NO_INPUT, [LC(1, 1), LC(1, 8)], ("input",)),
    Case("missing_neuron_header", _NO_HEADER, LC(1, 1), ("neuron",)),
    Case(
        "two_neurons",
        _TWO,
        At("neuron B:", "neuron"),
        (("one neuron", "only one", "second", "multiple", "more than one", "per file", "unexpected"),),
    ),
    Case(
        "where_default_violated",
        mut(LIF, "param tau = 2.0", "param tau = 0.5"),
        [At("param tau", "where"), At("param tau", "tau", 2), At("param tau", "0.5"), At("param tau", "tau")],
        ("tau", CONSTRAINT),
    ),
    Case(
        "where_chain_violated",
        mut(LIF, "    param v_reset = 0.0\n", "    param v_reset = 0.0\n    param p = 1.5 where 0 < p < 1\n"),
        [At("param p", "where"), At("param p", "0 <"), At("param p", "1.5"), At("param p", "p", 2)],
        (CONSTRAINT,),
    ),
    # ------------------------------------------------------------ statements
    Case(
        "assign_input_in_update",
        mut(LIF, UPDATE_LINE, "        x = x * 2.0\n" + UPDATE_LINE),
        At("x = x * 2.0", "x"),
        ("input",),
    ),
    Case(
        "assign_param_in_update",
        mut(LIF, UPDATE_LINE, "        tau = 3.0\n" + UPDATE_LINE),
        At("tau = 3.0", "tau"),
        ("param",),
    ),
    Case(
        "augassign_param_in_update",
        mut(LIF, UPDATE_LINE, UPDATE_LINE + "\n        v_reset += 1.0"),
        At("v_reset += 1.0", "v_reset"),
        ("param",),
    ),
    Case(
        "let_on_state",
        mut(LIF, UPDATE_LINE, "        let v = v + (x - (v - v_reset)) / tau"),
        At("let v", "v"),
        (("state", "let"),),
    ),
    Case(
        "assign_spike_in_update",
        mut(LIF, UPDATE_LINE, UPDATE_LINE + "\n        spike = 1.0"),
        At("spike = 1.0", "spike"),
        ("spike", RESERVED + ("cannot", "not allowed", "only")),
    ),
    Case(
        "on_spike_mul_assign",
        mut(LIF, RESET_LINE, "        v *= 0.5\n"),
        [At("v *= 0.5", "v"), At("v *= 0.5", "*=")],
        (("*=", "on spike", "only", "allowed"),),
    ),
    Case(
        "on_spike_assign_param",
        mut(LIF, RESET_LINE, RESET_LINE + "        tau = 2.0\n"),
        At("        tau = 2.0", "tau"),
        ("state",),
    ),
    Case(
        "on_spike_assign_input",
        mut(LIF, RESET_LINE, RESET_LINE + "        x = 0.0\n"),
        At("x = 0.0", "x"),
        ("state",),
    ),
    Case(
        "second_spike_rule",
        mut(LIF, "    on spike:", "    spike when v >= 2.0 surrogate sigmoid(alpha=4.0)\n    on spike:"),
        At("spike when v >= 2.0", "spike"),
        (("one spike", "second", "duplicate", "already", "more than one", "at most", "multiple"),),
    ),
    Case(
        "unknown_surrogate",
        mut(LIF, "surrogate sigmoid(", "surrogate sigmiod("),
        At("surrogate sigmiod", "sigmiod"),
        ("sigmiod", DID, "`sigmoid`"),
    ),
    Case(
        "unknown_surrogate_keyword",
        mut(LIF, "sigmoid(alpha=4.0)", "sigmoid(alhpa=4.0)"),
        At("sigmoid(alhpa", "alhpa"),
        ("alhpa", "alpha"),
    ),
    Case(
        "arity_exp",
        mut(LIF, UPDATE_LINE, "        v = v + exp(v, x) / tau"),
        At("exp(v, x)", "exp"),
        ("exp", ARITY),
    ),
    Case(
        "arity_clip",
        mut(LIF, UPDATE_LINE, "        v = v + clip(x, 1) / tau"),
        At("clip(x, 1)", "clip"),
        ("clip", ARITY),
    ),
    Case(
        "arity_where_function",
        mut(LIF, UPDATE_LINE, "        v = v + where(x > 1, x) / tau"),
        At("where(x > 1, x)", "where"),
        ("where", ARITY),
    ),
    Case(
        "arity_heaviside",
        mut(LIF, UPDATE_LINE, "        v = v + heaviside() / tau"),
        At("heaviside()", "heaviside"),
        ("heaviside", ARITY),
    ),
    Case(
        "comparison_in_update",
        mut(LIF, UPDATE_LINE, "        v = v + (x > 1.0) / tau"),
        [At("(x > 1.0)", "x"), At("(x > 1.0)", ">")],
        (("comparison", "where", "unexpected"),),
    ),
    Case(
        "comparison_in_param_default",
        mut(LIF, "param v_threshold = 1.0", "param v_threshold = 1.0 > 0.5"),
        [At("param v_threshold", "1.0"), At("param v_threshold", ">")],
        (("comparison", "where", "unexpected"),),
    ),
    Case(
        "tab_space_mix",
        mut(LIF, "    output spike", "\toutput spike"),
        [At("output spike", "output"), At("output spike", "\t")],
        (("indent", "tab"),),
    ),
    Case("duplicate_input_lines", mut(LIF, "    input x\n", "    input x\n    input x\n"), LC(3, 11), (DUP,)),
    Case(
        "surrogate_keyword_twice",
        mut(LIF, "sigmoid(alpha=4.0)", "sigmoid(alpha=4.0, alpha=2.0)"),
        At("sigmoid(alpha=4.0, alpha", "alpha", 2),
        ("alpha", DUP),
    ),
    Case(
        "where_not_a_comparison",
        mut(LIF, "where tau > 1", "where tau"),
        [At("param tau", "tau", 2), At("param tau", "where"), At("param tau", "$EOL")],
        (("comparison", "where", "condition", "expected", "`>`"),),
    ),
    Case(
        "unknown_in_where_function",
        mut(LIF, UPDATE_LINE, "        v = v + where(x > v_thresh, x, 0) / tau"),
        At("where(x > v_thresh", "v_thresh"),
        ("v_thresh", DID, "v_threshold"),
    ),
    Case(
        "output_spike_without_rule",
        mut(
            mut(
                mut(LIF, "    spike when v >= v_threshold surrogate sigmoid(alpha=4.0)\n", ""),
                "    on spike:\n" + RESET_LINE,
                "",
            ),
            "output spike",
            "output v, spike",
        ),
        At("output v, spike", "spike"),
        ("spike",),
    ),
    Case(
        "on_spike_without_rule",
        mut(
            mut(LIF, "    spike when v >= v_threshold surrogate sigmoid(alpha=4.0)\n", ""),
            "output spike",
            "output v",
        ),
        [At("on spike:", "on"), At("on spike:", "spike")],
        ("spike",),
    ),
    Case(
        "state_without_initial_value",
        mut(LIF, "state v = v_reset", "state v"),
        [At("    state v", "$EOL"), At("    state v", "v")],
        (("=", "initial", "expected"),),
    ),
    Case(
        "param_without_value",
        mut(LIF, "param v_threshold = 1.0", "param v_threshold ="),
        At("param v_threshold =", "$EOL"),
        (("expected", "expression", "value"),),
    ),
    # --------------------------------------------------------------- ODEs
    Case(
        "derivative_of_input",
        mut(ODE, ODE_LINE, ODE_LINE + "\n        dI/dt = 0.0"),
        [At("dI/dt", "dI"), At("dI/dt", "I")],
        ("state",),
    ),
    Case(
        "derivative_twice",
        mut(ODE, ODE_LINE, ODE_LINE + "\n        dv/dt = -v / tau_m"),
        [At("dv/dt = -v", "dv"), At("dv/dt = -v", "v")],
        (DUP + ("second",),),
    ),
    Case(
        "derivative_wrt_dx",
        mut(ODE, "dv/dt", "dv/dx"),
        [At("dv/dx", "dv"), At("dv/dx", "/"), At("dv/dx", "dx")],
        (("dt", "derivative") + SYNTAX,),
    ),
    Case(
        "ode_without_dt_param",
        _ODE_NO_DT,
        [At("equations method", "equations"), At("dv/dt", "dv"), At("dv/dt", "v")],
        ("dt",),
    ),
    Case("exact_on_nonlinear", _ODE_NL, [At("dv/dt", "dv"), At("dv/dt", "v")], ("exact",)),
    Case(
        "unknown_method",
        mut(ODE, "method exact", "method exakt"),
        At("equations method", "exakt"),
        ("exakt", DID, "exact"),
    ),
    # ------------------------------------ a newcomer's mistakes (issue 37): the right hint for each
    Case(
        "brian2_factor_times_derivative",
        mut(ODE, ODE_LINE, "        tau_m * dv/dt = v_rest - v + I"),
        At("tau_m * dv/dt", "tau_m"),
        ("brian2", "`dv/dt = (v_rest - v + i) / tau_m`"),
    ),
    Case(
        "brian2_factor_without_spaces",
        mut(ODE, ODE_LINE, "        tau_m*dv/dt = (v_rest - v + I)  # Brian2"),
        At("tau_m*dv/dt", "tau_m"),
        ("`dv/dt = (v_rest - v + i) / tau_m`",),
    ),
    Case(
        "swapped_ge",
        mut(LIF, "v >= v_threshold", "v => v_threshold"),
        At("spike when", "=>"),
        ("`=>`", DID, "`>=`"),
    ),
    Case(
        "swapped_le_in_where",
        mut(LIF, "where tau > 1", "where 1 =< tau"),
        At("where 1", "=<"),
        ("`=<`", DID, "`<=`"),
    ),
    Case("misspelled_param", mut(LIF, "param v_threshold", "parm v_threshold"), At("parm", "parm"),
         ("`parm`", DID, "`param`")),
    Case("misspelled_state", mut(LIF, "state v", "sate v"), At("sate v", "sate"), (DID, "`state`")),
    Case("misspelled_update", mut(LIF, "    update:", "    upate:"), At("upate:", "upate"), (DID, "`update`")),
    Case("misspelled_input", mut(LIF, "    input x", "    inpt x"), At("inpt x", "inpt"), (DID, "`input`")),
    Case("misspelled_on_spike", mut(LIF, "on spike:", "on spkie:"), At("on spkie", "spkie"), (DID, "`spike`")),
    Case("misspelled_when", mut(LIF, "spike when", "spike wen"), At("spike wen", "wen"), (DID, "`when`")),
    Case(
        "misspelled_equations",
        mut(ODE, "equations method exact:", "equatons method exact:"),
        At("equatons", "equatons"),
        (DID, "`equations`"),
    ),
]

assert len({c.id for c in CASES}) == len(CASES)

# Cases that are errors of the file itself (usable by `flexdsl check`).
FILE_CASES = [c for c in CASES if not c.overrides]


# --------------------------------------------------------------------------- #
# checking helpers (also used by test_cli.py)
# --------------------------------------------------------------------------- #
def _strip_source_echo(msg: str, src: str) -> str:
    """The message without the echoed source line and the caret line."""
    out, skip_next = [], False
    key = src.strip()
    for ln in msg.split("\n"):
        if (
            skip_next
            and "^" in ln
            and not ln.replace("^", "").replace("~", "").replace("|", "").strip(" 0123456789")
        ):
            skip_next = False
            continue
        skip_next = False
        if key and key in ln and not ln.startswith("<string>:") and ": error:" not in ln:
            skip_next = True
            continue
        out.append(ln)
    return "\n".join(out)


def check_message(msg: str, text: str, filename: str, line: int, col: int, subs) -> None:
    head = f"{filename}:{line}:{col}: error:"
    assert msg.startswith(head), f"message does not start with {head!r}:\n{msg}"
    src = text.split("\n")[line - 1].rstrip()
    key = src.strip()
    lines = msg.split("\n")
    # the echoed source line followed by a caret line
    idx = [i for i, ln in enumerate(lines[1:], 1) if key and key in ln]
    assert idx, f"source line {src!r} not shown in:\n{msg}"
    ok = False
    for i in idx:
        if i + 1 < len(lines) and "^" in lines[i + 1]:
            shown = lines[i]
            p = shown.index(key)
            lead = len(src) - len(src.lstrip())
            want = p + (col - 1 - lead)
            if lines[i + 1].index("^") == want:
                ok = True
                break
    assert ok, f"caret not under column {col}:\n{msg}"
    rest = _strip_source_echo(msg, src).lower()
    for s in subs:
        alts = (s,) if isinstance(s, str) else tuple(s)
        assert any(a.lower() in rest for a in alts), (
            f"none of {alts!r} in the message (outside the source echo):\n{msg}"
        )


def _raise(case: Case):
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(case.text, **case.overrides)
    return ei.value


# --------------------------------------------------------------------------- #
# tests
# --------------------------------------------------------------------------- #
def test_base_models_are_valid():
    flexdsl.loads(LIF)
    flexdsl.loads(ODE)
    assert issubclass(flexdsl.FlexDSLError, ValueError)


def test_enough_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_located_error(case: Case):
    err = _raise(case)
    positions = case.positions()
    got = (err.line, err.column)
    assert got in positions, f"got {got}, expected one of {positions}\n{err}"
    assert err.filename == "<string>"
    check_message(str(err), case.text, "<string>", err.line, err.column, case.subs)


def _where_positions(text):
    return [
        At("param tau", "where").resolve(text),
        At("param tau", "tau", 2).resolve(text),
        At("param tau", "2.0").resolve(text),
        At("param tau", "tau").resolve(text),
    ]


def test_override_violating_where():
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(LIF, tau=0.5)
    err = ei.value
    assert err.line == 3, str(err)  # the constraint's line
    assert str(err).startswith(f"<string>:3:{err.column}: error:")
    assert (err.line, err.column) in [(3, c) for _, c in _where_positions(LIF)] + [(3, 5)]
    assert "tau" in str(err)
    check_message(str(err), LIF, "<string>", err.line, err.column, ("tau",))


def test_tab_indented_file_is_valid():
    import torch

    text = LIF.replace("        ", "\t\t").replace("    ", "\t")
    assert "\t\tv = v_reset" in text
    x = torch.full((6, 2), 1.5, dtype=torch.float64)
    assert torch.equal(flexdsl.loads(text)(x), flexdsl.loads(LIF)(x))


def test_mixed_tabs_and_spaces_rejected():
    """Section 2: blocks are indented by 4 spaces *or* a tab, consistently: a file indented
    with spaces that has one tab-indented line is an error (not a tab counted as 8)."""
    text = LIF.replace(RESET_LINE, "\tv = v_reset\n")
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(text)
    err = ei.value
    assert err.line == 14, str(err)
    assert any(w in str(err).lower() for w in ("indent", "tab")), str(err)


@pytest.mark.parametrize("n", [1000])
def test_long_expression_is_not_a_crash(n):
    """Section 10: every problem raises FlexDSLError; a long (flat) sum must not hit Python's
    recursion limit (either it compiles, or it is a located FlexDSLError)."""
    import torch

    text = mut(LIF, "/ tau", "/ (" + " + ".join(["tau"] * n) + ")")
    try:
        m = flexdsl.loads(text)
    except flexdsl.FlexDSLError:
        return
    x = torch.full((4, 2), 1.5 * n, dtype=torch.float64)
    assert m(x).shape == (4, 2)


def test_state_init_domain_error_is_a_flexdsl_error():
    """Section 10: a state's initial value that cannot be evaluated (like a param default that
    cannot, which is a located error at load) raises FlexDSLError, not a bare ValueError."""
    import torch

    text = mut(LIF, "state v = v_reset", "state v = sqrt(-1.0)")
    try:
        m = flexdsl.loads(text)
    except flexdsl.FlexDSLError as e:
        assert (e.line, e.column) in [(6, 11), (6, 15)], str(e)
        return
    with pytest.raises(flexdsl.FlexDSLError):
        m(torch.ones(2, 1))


def test_comments_and_blank_lines_are_ignored():
    import torch

    text = "# a comment before the header\n\n" + LIF.replace(
        UPDATE_LINE, "        # comment inside a block\n\n" + UPDATE_LINE + "   # trailing comment"
    ).replace("    output spike", "    # comment\n    output spike  # the spikes")
    x = torch.full((6, 2), 1.5, dtype=torch.float64)
    assert torch.equal(flexdsl.loads(text)(x), flexdsl.loads(LIF)(x))


def test_error_line_counts_comment_lines():
    text = "# comment\n# another\n" + mut(LIF, "/ tau", "/ tua")
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(text)
    assert (ei.value.line, ei.value.column) == At("/ tua", "tua").resolve(text)


def test_override_of_unknown_param():
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(LIF, tua=3.0)
    msg = str(ei.value)
    assert "tua" in msg
    assert DID in msg.lower()
    assert "tau" in msg.replace("tua", "")


def test_override_of_unknown_param_library():
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.load("lif", v_treshold=1.0)
    assert "v_threshold" in str(ei.value) and DID in str(ei.value).lower()


def test_runtime_assignment_checks_where():
    import torch

    m = flexdsl.load("lif")
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        m.tau = 0.5
    assert "tau" in str(ei.value)
    # a valid reassignment works and changes the dynamics, like an override at load
    m.tau = 3.0
    assert float(m.tau) == 3.0
    x = torch.full((12, 3), 1.3, dtype=torch.float64)
    m.reset()
    y = m(x)
    ref = flexdsl.load("lif", tau=3.0)
    assert torch.equal(y, ref(x))
    m2 = flexdsl.load("lif")
    assert not torch.equal(m2(x), y)


def test_runtime_assignment_checks_where_inline():
    m = flexdsl.loads(LIF)
    with pytest.raises(flexdsl.FlexDSLError):
        m.tau = 1.0  # tau > 1 is strict
    m.tau = 1.5
    assert float(m.tau) == 1.5


def test_error_from_file_names_the_file(tmp_path):
    p = tmp_path / "bad.neuron"
    text = mut(LIF, UPDATE_LINE, "        v = v + (x - (v - v_reset)) / tua")
    p.write_text(text)
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.load(str(p))
    err = ei.value
    assert err.filename is not None and os.path.basename(str(err.filename)) == "bad.neuron"
    assert (err.line, err.column) == At("/ tua", "tua").resolve(text)
    assert str(err).startswith(f"{err.filename}:{err.line}:{err.column}: error:")


# --------------------------------------------------------------------------- #
# a .neuron file is data: nothing in it is executed as Python
# --------------------------------------------------------------------------- #
def _payload(sentinel):
    return f"__import__('os').system('touch {sentinel}')"


def _try_everything(text):
    """Load/compile/run; FlexDSLError is an acceptable outcome, nothing else is."""
    import torch

    try:
        c = flexdsl.compile(text)
        _ = c.torch_source
        m = flexdsl.loads(text)
        m(torch.ones(3, 2))
    except flexdsl.FlexDSLError:
        return False
    return True


def test_docstrings_are_text_not_code(tmp_path):
    s = tmp_path / "SENTINEL_doc"
    p = _payload(s)
    text = mut(
        LIF,
        "neuron LIF:\n",
        "neuron LIF:\n"
        f'    """Docs with code: {p}\n'
        f"    and quotes ''' + {p} + ''' and {{{p}}} and \\n {p} ' \" # \n"
        f'    end of doc {p}"""\n',
    )
    text = mut(text, "    input x\n", f"    input x    \"''' + {p} + ''' {{{p}}} %s\"\n")
    assert _try_everything(text), "a model with ordinary docstrings must load"
    assert not s.exists(), "a string in a .neuron file was executed"
    assert isinstance(flexdsl.compile(text).torch_source, str)
    assert not s.exists()
    # a one-line string has no escapes: `"\"` is a complete string, what follows is not
    text2 = mut(LIF, "param v_reset = 0.0", f'param v_reset = 0.0   "\\" + {p} + "\\ {p}"')
    _try_everything(text2)
    assert not s.exists()


def test_docstring_with_backslash_is_text(tmp_path):
    s = tmp_path / "SENTINEL_bs"
    p = _payload(s)
    text = mut(LIF, "neuron LIF:\n", f'neuron LIF:\n    """trailing backslash {p} \\\\"""\n')
    _try_everything(text)
    text2 = mut(LIF, "    input x\n", f'    input x "{p} \\\\"\n')
    _try_everything(text2)
    assert not s.exists()


RESERVED_WORDS = (
    "neuron input param state update equations method spike when surrogate on output where learnable let"
).split()


@pytest.mark.parametrize("word", RESERVED_WORDS)
@pytest.mark.parametrize("kind", ["param", "state", "input", "let"])
def test_reserved_words_rejected_as_names(word, kind):
    """docs/language.md, section 2: reserved words are rejected with a located error."""
    if kind == "param":
        text = mut(LIF, "    param v_reset = 0.0\n", f"    param v_reset = 0.0\n    param {word} = 1.0\n")
        at = At(f"param {word} =", word)
    elif kind == "state":
        text = mut(LIF, "    state v = v_reset\n", f"    state v = v_reset\n    state {word} = 0.0\n")
        at = At(f"state {word} =", word)
    elif kind == "input":
        text = mut(LIF, "    input x\n", f"    input x, {word}\n")
        at = At(f"input x, {word}", word)
    else:
        text = mut(LIF, UPDATE_LINE, UPDATE_LINE + f"\n        let {word} = 1.0")
        at = At(f"let {word} =", word)
    if word == kind:  # `param param`, `let let`...: the second one
        at = At(at.line, word, 2)
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(text)
    err = ei.value
    assert (err.line, err.column) == at.resolve(text), str(err)
    check_message(str(err), text, "<string>", err.line, err.column, ())


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('touch {s}')",
        "eval('0')",
        "exec('0')",
        "open('{s}', 'w')",
        "x.__class__",
        "getattr(x, 'real')",
        "x if 1 else 0",
        "[x for x in (1,)]",
        "lambda: 0",
    ],
)
def test_python_in_expressions_rejected(tmp_path, expr):
    s = tmp_path / "SENTINEL_expr"
    e = expr.format(s=s)
    text = mut(LIF, UPDATE_LINE, f"        v = v + {e}")
    with pytest.raises(flexdsl.FlexDSLError):
        flexdsl.loads(text)
    assert not s.exists()
    with pytest.raises(flexdsl.FlexDSLError):
        flexdsl.compile(text)
    assert not s.exists()


_LOWERING = """\
neuron M:
    input x
    param a = 0.5
    param dt = 1.0
    state v = 0.0
    state w = 0.0
    {body}
    spike when v >= 1
    on spike:
        v = 0
    output spike, v
"""


@pytest.mark.parametrize("body, line, what", [
    ("update:\n        v = x*1e300*1e300", 8, "overflow a float"),  # sympy folds it to 1e600*x
    ("update:\n        v = v + x/(2e-200*1e-200)", 8, "overflow a float"),
    ("equations method exact:\n        dv/dt = min(0.5, v - x/(where(a > 0, 2, 1) - 1))", 8, "cannot be lowered"),
    ("equations method exponential_euler:\n        dw/dt = clip(1.0, log(where(1 > w, a, 0)*min(dt, 0.0)), 1e30)\n"
     "        dv/dt = x - v", 8, "cannot be lowered"),
], ids=["folded_overflow", "folded_division", "where_in_min", "where_in_log"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_lowering_failures_are_located_errors(body, line, what, backend):
    """What sympy cannot lower, or folds into a constant beyond a float, is a located error on
    load or on the first call — never sympy's TypeError or a NameError in generated code."""
    text = _LOWERING.format(body=body)
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(text, backend=backend)(torch.rand(3, 2))
    assert ei.value.line == line and what in str(ei.value), str(ei.value)


def test_params_that_make_a_denominator_zero_are_located_errors():
    """`x/(a - 1)` at a = 1 would run as NaN at every step: a located error at load and on
    assignment; a division guarded by a `where` is the model's own business and stays allowed."""
    text = """neuron M:
    input x
    param a = {a}
    state v = 0.0
    update:
        v = v + x/(a - 1) + where(a > 5, x/(a - 5), 0)
    spike when v >= 1
    on spike:
        v = 0
"""
    with pytest.raises(flexdsl.FlexDSLError, match="divides by zero") as ei:
        flexdsl.loads(text.format(a="1.0"))
    assert (ei.value.line, ei.value.column) == (6, 9)
    m = flexdsl.loads(text.format(a="2.0"))
    assert torch.equal(m(torch.ones(2, 1)), torch.ones(2, 1))  # v = 0 + 1/(2 - 1) = 1: a spike, a reset, again
    with pytest.raises(flexdsl.FlexDSLError, match="divides by zero"):
        m.a = 1.0
    m.a = 5.0  # (the guarded division by a - 5 = 0 is not taken)
    assert torch.isfinite(m(torch.ones(2, 1))).all()


@pytest.mark.parametrize("surrogate, says", [
    ("sigmoid(alpha=1e300)", "beyond float32"),  # S'(0) = alpha/4: inf in float32, NaN gradients
    ("sigmoid(alpha=0-4)", "must be positive at the threshold"),
])
def test_surrogates_whose_gradients_cannot_be_used_are_located_errors(surrogate, says):
    text = f"""neuron M:
    input x
    state v = 0.0
    update:
        v = v + x
    spike when v >= 1 surrogate {surrogate}
    on spike:
        v = 0
"""
    with pytest.raises(flexdsl.FlexDSLError, match=says) as ei:
        flexdsl.loads(text)(torch.rand(3, 2))
    assert (ei.value.line, ei.value.column) == (6, 33)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_an_initial_state_beyond_the_input_dtype_is_a_located_error(backend):
    text = """neuron M:
    input x
    state v = 0.0
    state w = 1e300
    update:
        v = v + x
        w = w * 0.5
"""
    with pytest.raises(flexdsl.FlexDSLError, match="starts at 1e.300, beyond what torch.float32 holds") as ei:
        flexdsl.loads(text, backend=backend)(torch.rand(3, 2))
    assert ei.value.line == 4
    m = flexdsl.loads(text, backend="torch", store_state_seqs=True).double()
    m(torch.rand(3, 2, dtype=torch.float64))
    assert m.state_seqs["w"][-1, 0].item() == 1e300 / 8


# --------------------------------------------------------------------------- #
# a newcomer's mistakes (issue 37): pasting the hint gives a model that loads
# --------------------------------------------------------------------------- #
NEURONS = Path(__file__).resolve().parents[1] / "neurons"


def _hint_code(err: flexdsl.FlexDSLError) -> str:
    """The code a hint proposes: its first backquoted text."""
    m = re.search(r"`([^`]+)`", err.hint or "")
    assert m, f"no code in the hint:\n{err}"
    return m.group(1)


def _paste(text: str, line: int, code: str) -> str:
    """`text` with line `line` (1-based) replaced by `code`, indented as that line was."""
    lines = text.split("\n")
    old = lines[line - 1]
    lines[line - 1] = old[: len(old) - len(old.lstrip())] + code
    return "\n".join(lines)


def test_pasting_the_brian2_hints_gives_the_library_adex_back():
    """AdEx written as Brian2 writes it (`C * dv/dt = ...`, `tau_w*dw/dt = ...`): each line is a
    located error whose hint, pasted over it, is the library's own line, so the result is the
    library model's text."""
    lib = (NEURONS / "adex.neuron").read_text()
    dv = "dv/dt = (-g_L * (v - E_L) + g_L * Delta_T * exp((v - V_T) / Delta_T) - w + I) / C"
    dw = "dw/dt = (a * (v - E_L) - w) / tau_w"
    brian = mut(lib, dv, "C * dv/dt = -g_L * (v - E_L) + g_L * Delta_T * exp((v - V_T) / Delta_T) - w + I")
    brian = mut(brian, dw, "tau_w*dw/dt = a * (v - E_L) - w")
    text = brian
    for factor, fixed in (("C * dv/dt", dv), ("tau_w*dw/dt", dw)):
        with pytest.raises(flexdsl.FlexDSLError) as ei:
            flexdsl.loads(text)
        err = ei.value
        assert (err.line, err.column) == At(factor, factor).resolve(text), str(err)
        assert "brian2" in err.reason.lower() and _hint_code(err) == fixed
        text = _paste(text, err.line, _hint_code(err))
    assert text == lib
    flexdsl.loads(text)


def test_the_brian2_rewrite_keeps_unless_refractory_and_groups_the_factor():
    text = textwrap.dedent("""\
        neuron B:
            input I
            param dt = 0.1
            param R = 2.0
            param tau = 10.0
            state v = 0.0
            refractory 2.0
            equations:
                R*tau * dv/dt = -v + R*I unless refractory
            spike when v > 1
            on spike:
                v = 0
        """)
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(text)
    assert _hint_code(ei.value) == "dv/dt = (-v + R*I) / (R*tau) unless refractory"
    fixed = flexdsl.loads(_paste(text, ei.value.line, _hint_code(ei.value)), backend="torch").double()
    hand = flexdsl.loads(mut(text, "R*tau * dv/dt = -v + R*I", "dv/dt = (-v + R*I) / (R*tau)"),
                         backend="torch").double()
    x = torch.rand(50, 3, dtype=torch.float64)
    assert torch.equal(fixed(x), hand(x)) and fixed(x).sum() >= 0


_UNITS_UPDATE = textwrap.dedent("""\
    neuron U:
        input x : mV
        param tau = 10 ms where tau > 0
        state v = 0 mV
        update:
            v = v + dt * (x - v) / tau
        spike when v > 1 mV surrogate sigmoid(alpha=4/mV)
        on spike:
            v = 0 mV
    """)


@pytest.mark.parametrize("case", ["adex", "ode_without_units", "update_with_units"])
def test_pasting_the_missing_dt_hint_gives_a_model_that_loads(case):
    """The hint for a missing `dt` carries a time unit where the model writes units (the unitless
    `param dt = 0.1` is refused there), none where it does not; pasted, the model loads and runs."""
    if case == "adex":
        full = (NEURONS / "adex.neuron").read_text()
        line = next(ln for ln in full.split("\n") if ln.lstrip().startswith("param dt"))
        text = mut(full, line, "    # (dt removed)")
    elif case == "ode_without_units":
        text, full = mut(ODE, "    param dt = 0.1\n", "    # (dt removed)\n"), ODE
    else:
        text, full = mut(_UNITS_UPDATE, "    state v", "    # (dt removed)\n    state v"), None
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.loads(text)
    code = _hint_code(ei.value)
    units = case != "ode_without_units"
    assert code == ("param dt = 0.1 ms" if units else "param dt = 0.1"), str(ei.value)
    at = At("(dt removed)", "#").resolve(text)[0]
    m = flexdsl.loads(_paste(text, at, code), backend="torch").double()
    x = torch.full((300, 2), 900.0 if case == "adex" else 1.5, dtype=torch.float64)
    out = m(x)
    out = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(out).all()
    if full is not None:  # the pasted value is the one the complete model has: the same outputs
        ref = flexdsl.loads(full, backend="torch").double()
        r = ref(x)
        assert torch.equal(out, r[0] if isinstance(r, tuple) else r) and out.sum() > 0
    if units:  # (what the hint said before: a number without a unit, which the unit check refuses)
        with pytest.raises(flexdsl.FlexDSLError, match="must be a time"):
            flexdsl.loads(_paste(text, at, "param dt = 0.1"))


# --------------------------------------------------------------------------- #
# issue 36: bad arguments, line breaks inside a line, very long lines
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("call, says", [
    (lambda: flexdsl.load(5), "not a value of type int"), (lambda: flexdsl.load(None), "not None"),
    (lambda: flexdsl.loads(5), "must be text"), (lambda: flexdsl.loads(None), "must be text"),
    (lambda: flexdsl.compile(5), "not a value of type int"), (lambda: flexdsl.compile(2.5), "type float"),
    (lambda: flexdsl.recurrent(None, 3, 4), "not None"), (lambda: flexdsl.recurrent(7, 3, 4), "type int"),
    (lambda: flexdsl.load(b"neuron A:\n"), "decode"), (lambda: flexdsl.load(["lif"]), "type list"),
    (lambda: flexdsl.load(flexdsl.load("lif")), "loaded already"),
    (lambda: flexdsl.load("x" * 100_000), "no such file"), (lambda: flexdsl.load("li\x00f"), "no such file")])
def test_a_model_argument_of_another_kind_is_a_located_error(call, says):
    """What `load`, `loads`, `compile` and `recurrent` take as the model (a path, a library name,
    text, or for `recurrent` a loaded module): anything else is a FlexDSLError naming the argument,
    with a hint, never Python's TypeError or an OSError of a name no file can have."""
    with pytest.raises(flexdsl.FlexDSLError) as e:
        call()
    err = e.value
    assert says in str(err), str(err)
    assert err.hint and str(err).startswith(printable(err.filename)[:20]) and len(str(err)) < 2000, str(err)


BREAKS = ["\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x0b", "\x0c"]


@pytest.mark.parametrize("sep", BREAKS)
@pytest.mark.parametrize("case", ["string", "description", "docstring", "name", "comment"])
def test_line_breaks_inside_a_line_never_shift_an_error(sep, case, tmp_path):
    """A character `str.splitlines` splits at (but the language does not) inside a string, a
    description, a docstring, a name or a comment: the error's line and column are the real ones,
    and its message has exactly its own lines (the header, the source line, the caret, the hint),
    so the caret stands under the column in the line shown, whatever prints it."""
    base = ('neuron A:\n    """doc"""\n    input x  # note\n    param a = 0.5 "half"\n    state v = 0.0\n'
            '    update:\n        v = v * a + x\n    output v\n')
    edits = {"string": ("        v = v * a + x\n", f'        v = v * a + x "q{sep}r"\n'),
             "description": ('"half"', f'"half" "more{sep}text"'),
             "docstring": ('    output v\n', f'    output v\n    """late{sep}doc"""\n'),
             "name": ("v * a + x\n", f"v * a{sep}b + x\n"),
             "comment": ("# note\n", f"# no{sep}te\n    input z z\n")}
    old, new = edits[case]
    text = base.replace(old, new)
    path = tmp_path / "m.neuron"
    path.write_bytes(text.encode("utf-8"))
    for model in (text, str(path)):
        with pytest.raises(flexdsl.FlexDSLError) as e:
            flexdsl.load(model)
        err = e.value
        real = text.split("\n")[err.line - 1]  # (the parser's lines: split at `\n` only)
        lines = err.format().split("\n")
        assert err.format().splitlines() == lines, lines  # no other line break in the message
        assert lines[0].startswith(f"{err.filename}:{err.line}:{err.column}: error:")
        assert lines[1] == "".join(ch if ch.isprintable() else " " for ch in real)
        assert lines[2] == " " * (err.column - 1) + "^"
        if sep in "\x1c\x1d\x1e\x0b":  # (control characters: refused where they stand)
            assert (err.line, err.column) == (text[:text.index(sep)].count("\n") + 1,
                                              text.index(sep) - text.rfind("\n", 0, text.index(sep)))
        else:  # the token the parser stops at: the string, the second description, the docstring, the character
            token = {"string": '"q', "description": '"more', "docstring": '"""late', "comment": "z z",
                     "name": "b" if sep == "\x0c" else sep}[case]  # (a form feed is white space)
            want = text.index(token) + (2 if case == "comment" else 0)
            assert (err.line, err.column) == (text[:want].count("\n") + 1, want - text.rfind("\n", 0, want)), \
                (case, err.line, err.column)


@pytest.mark.parametrize("body", ["        v = " + "x + " * 250_000 + "x\n", "    input x  # " + "c" * 1_000_000 + "\n",
                                  "    param a = " + "1" * 1_000_000 + "\n", "    param a = " + "(" * 500_000 + "\n"])
def test_a_one_megabyte_line_is_a_short_located_error(body, tmp_path, capsys):
    """A line of a million characters (a model file of one huge line): a located error from the
    first look at the text (the longest line the language takes is `MAX_LINE`), and a message of a
    few hundred characters whose shown line is a window around the column, the caret under it."""
    from flexdsl import cli
    from flexdsl.frontend.parse import MAX_LINE

    text = "neuron A:\n    input x\n    state v = 0.0\n    update:\n" + body + "    output v\n"
    line = text[:text.index(body)].count("\n") + 1
    path = tmp_path / "big.neuron"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(flexdsl.FlexDSLError, match="too long") as e:
        flexdsl.load(str(path))
    err = e.value
    assert (err.line, err.column) == (line, MAX_LINE + 1)
    assert len(str(err)) < 1000
    shown, caret = str(err).split("\n")[1:3]
    assert caret == " " * (err.caret - 1) + "^" and shown[err.caret - 1] == body.rstrip("\n")[err.column - 1]
    assert cli.main(["check", str(path)]) == 1
    out, errout = capsys.readouterr()
    assert "too long" in errout and len(out + errout) < 2000 and "Traceback" not in errout
