"""Physical units: the dimension check (located errors naming both units), the conversion to
flexdsl's base units (ms, mV, pA, nS, pF, um, mM) against Brian2's unit system, the generated code
of a model with units against its twin written in base units, and overrides with units.

Expected positions are computed from the case text (`At(line_substring, token)`), as in
test_errors.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flexdsl
from flexdsl.frontend.dims import Dim, show, unit

warnings.filterwarnings("ignore")
import brian2 as b2  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class At:
    """Position of `token` (its `nth` occurrence) on the first line containing `line`."""

    line: str
    token: str
    nth: int = 1

    def resolve(self, text: str) -> tuple[int, int]:
        for i, src in enumerate(text.split("\n")):
            if self.line in src:
                col = -1
                for _ in range(self.nth):
                    col = src.index(self.token, col + 1)
                return i + 1, col + 1
        raise AssertionError(f"line {self.line!r} not in case text")


ADEX = textwrap.dedent("""\
    neuron AdEx:
        input I : pA
        param dt = 0.1 ms
        param C = 281 pF where C > 0
        param g_L = 30 nS
        param E_L = -70.6 mV
        param V_T = -50.4 mV
        param Delta_T = 2 mV
        param tau_w = 144 ms where tau_w > 0
        param a = 4 nS
        param b = 80.5 pA
        param V_peak = V_T + 5 * Delta_T
        state v = E_L
        state w = 0 pA

        equations method euler:
            dv/dt = (-g_L * (v - E_L) + g_L * Delta_T * exp((v - V_T) / Delta_T) - w + I) / C
            dw/dt = (a * (v - E_L) - w) / tau_w

        spike when v > V_peak surrogate sigmoid(alpha=1/mV)

        on spike:
            v = E_L
            w += b
        output spike
    """)

DV = "(-g_L * (v - E_L) + g_L * Delta_T * exp((v - V_T) / Delta_T) - w + I) / C"
DW = "(a * (v - E_L) - w) / tau_w"


def mut(old: str, new: str, base: str = ADEX) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


def _with_update(stmts: str, base: str = ADEX) -> str:
    return mut("    on spike:", f"    update:\n{textwrap.indent(stmts, ' ' * 8)}\n    on spike:", base)


# (id, text, position, substrings the message must contain)
CASES = [
    ("ode_term", mut(DV, "(-g_L * (v - E_L) + g_L * Delta_T * exp((v - V_T) / Delta_T) + I) / C - w"),
     At("/ C - w", "w"), ("dv/dt", "V/s", "`w` is A")),
    ("ode_needs_per_time", mut(DV, "(E_L - v)"), At("dv/dt", "E_L"), ("V/s", "is V", "time constant")),
    ("sum_terms", mut(DW, "(a * (v - E_L) - v) / tau_w"), At("dw/dt", "v)"), ("sum", "`v` is V", "is A")),
    ("exp_argument", mut("exp((v - V_T) / Delta_T)", "exp(v - V_T)"), At("exp(v", "v - V_T"),
     ("exp", "dimensionless", "is V")),
    ("tanh_argument", mut("exp((v - V_T) / Delta_T)", "tanh(w)"), At("tanh(w)", "w)"),
     ("tanh", "dimensionless", "is A")),
    ("log_argument", mut("exp((v - V_T) / Delta_T)", "log(v)"), At("log(v)", "v)"), ("log", "is V")),
    ("sigmoid_argument", mut("exp((v - V_T) / Delta_T)", "sigmoid(tau_w)"), At("sigmoid(tau_w)", "tau_w"),
     ("sigmoid", "is s")),
    ("spike_rule", mut("v > V_peak", "v > tau_w"), At("spike when", "tau_w"), ("V", "s", "same unit")),
    ("where_constraint", mut("where tau_w > 0", "where tau_w > 1 mV"), At("where tau_w", "1 mV"),
     ("comparison", "is s", "is V")),
    ("reset_value", mut("        v = E_L\n", "        v = b\n"), At("        v = b", "b"), ("`v`", "is A", "V")),
    ("reset_increment", mut("w += b", "w += E_L"), At("w += E_L", "E_L"), ("`w += ...`", "is V", "A")),
    ("update_scale", _with_update("w *= a"), At("w *= a", "a"), ("would change the unit", "is S")),
    ("update_local", _with_update("let z = v\nz = w"), At("z = w", "w"), ("local `z`", "is A", "V")),
    ("min_arguments", mut("w += b", "w += min(b, E_L)"), At("min(b, E_L)", "E_L"), ("min", "is A", "is V")),
    ("clip_arguments", mut("w += b", "w += clip(b, 0, E_L)"), At("clip(b, 0, E_L)", "E_L"),
     ("clip", "is A", "is V")),
    ("where_values", mut("w += b", "w += where(v > E_L, b, E_L)"), At("where(v > E_L, b, E_L)", "E_L", 2),
     ("where", "is A", "is V")),
    ("where_condition", mut("w += b", "w += where(v > b, b, w)"), At("where(v > b", "b"),
     ("comparison", "is V", "is A")),
    ("unknown_unit", mut("281 pF", "281 pf"), At("281 pf", "pf"), ("unknown unit", "`pF`")),
    ("name_after_number", mut("param V_peak = V_T + 5 * Delta_T", "param V_peak = 2 V_T"), At("2 V_T", "V_T"),
     ("`V_T` is not a unit", "2 * V_T")),
    ("dt_not_time", mut("0.1 ms", "0.1 mV"), At("param dt", "0.1"), ("`dt`", "time", "is V")),
    ("refractory_not_time", mut("    on spike:", "    refractory 2 mV\n\n    on spike:"), At("refractory 2", "2"),
     ("refractory period", "time", "is V")),
    ("refractory_condition", mut("    on spike:", "    refractory while v > tau_w\n\n    on spike:"),
     At("refractory while", "tau_w"), ("comparison", "is V", "is s")),
    ("surrogate_scale", mut("alpha=1/mV", "alpha=1.0"), At("alpha=1.0", "1.0"),
     ("alpha", "sigmoid", "1/V", "dimensionless")),
    ("surrogate_without_scale", mut("sigmoid(alpha=1/mV)", "fast_sigmoid(slope=25)"), At("fast_sigmoid", "fast"),
     ("fast_sigmoid", "dimensionless", "is V")),
    ("user_surrogate", mut("surrogate sigmoid(alpha=1/mV)", "surrogate mine(k=1/mV)").replace(
        "    state w = 0 pA\n", "    state w = 0 pA\n    surrogate mine(x, k=1.0) = k / (1 + abs(x))**2\n"),
     At("surrogate mine(x", "abs(x)"), ("sum", "`abs(x)` is V")),
    ("user_surrogate_keyword_at_use", mut("surrogate sigmoid(alpha=1/mV)", "surrogate mine(k=1/ms)").replace(
        "    state w = 0 pA\n", "    state w = 0 pA\n    surrogate mine(x, k=1/mV) = k / (1 + (k*x)**2)\n"),
     At("surrogate mine(k=", "1/ms"), ("`k` of the surrogate `mine` must be 1/V", "default `1/mV`", "is 1/s")),
    ("input_unit_name", mut("input I : pA", "input I : foo"), At("input I", "foo"), ("`foo` is not a unit",)),
    ("input_unit_value", mut("input I : pA", "input I : 2 pA"), At("input I", "2 pA"), ("unit",)),
    ("exponent_with_unit", mut(DW, "(a * (v - E_L) - w) / tau_w * (w / pA) ** (v - E_L)"), At("** (v", "v - E_L", 2),
     ("exponent", "dimensionless", "is V")),
    ("power_of_a_quantity", mut(DW, "(a * (v - E_L) - w) / tau_w * (v ** g_L) / mV ** g_L"),
     At("(v ** g_L)", "g_L"), ("exponent", "is S")),
    ("unit_power_limit", mut("param g_L = 30 nS", "param g_L = 30 nS * 2 cm**20"), At("2 cm**20", "cm"),
     ("power of a unit",)),
    ("zero_state_hint", mut("state w = 0 pA", "state w = 0"), At("- w + I", "w"), ("`w` is 1", "0 pA")),
    ("param_sum", mut("param V_peak = V_T + 5 * Delta_T", "param V_peak = V_T + 5"), At("V_T + 5", "5"),
     ("sum", "`5` is 1", "5 mV")),
    ("zero_times_a_quantity", mut(DW, "(a * (v - E_L) - w) / tau_w + 0 * v * v / ms"), At("0 * v * v", "0"),
     ("`dw/dt`", "V**2/s", "expected A/s")),
    ("bare_unit_in_unitless_expression", mut("param V_peak = V_T + 5 * Delta_T", "param V_peak = V_T + ms"),
     At("V_T + ms", "ms"), ("sum", "is s", "the unit ms")),
]


def test_enough_distinct_unit_errors():
    assert len({c[0] for c in CASES}) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_unit_error_is_located(case):
    _, text, at, subs = case
    with pytest.raises(flexdsl.FlexDSLError) as ei:
        flexdsl.compile(text)
    err = ei.value
    line, col = at.resolve(text)
    msg = str(err)
    assert (err.line, err.column) == (line, col), msg
    assert msg.startswith(f"<string>:{line}:{col}: error: "), msg
    shown = msg.split("\n")
    assert shown[1] == text.split("\n")[line - 1] and shown[2] == " " * (col - 1) + "^", msg
    for s in subs:
        assert s in msg, (s, msg)


def test_base_model_is_valid():
    flexdsl.compile(ADEX)


def test_cli_prints_a_unit_error_and_exits_1(tmp_path):
    f = tmp_path / "adex_bad.neuron"
    f.write_text(CASES[0][1])
    r = subprocess.run([sys.executable, "-m", "flexdsl", "check", str(f)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{f}:17:" in r.stderr and "expected V/s" in r.stderr


# --------------------------------------------------------------------------- the unit system
# flexdsl's base units, written with Brian2's units (an independent implementation of SI)
BASE = {
    "time": b2.ms, "voltage": b2.mV, "current": b2.pA, "conductance": b2.nS, "capacitance": b2.pF,
    "resistance": b2.Gohm, "length": b2.um, "concentration": b2.mmolar, "area current": b2.pA / b2.um**2,
    "area conductance": b2.nS / b2.um**2, "area capacitance": b2.pF / b2.um**2, "rate": 1 / b2.ms,
}

UNITS = [  # (flexdsl unit name or expression, the same in Brian2, the base unit of its dimension)
    ("ms", b2.ms, "time"), ("second", b2.second, "time"), ("us", b2.us, "time"), ("msecond", b2.msecond, "time"),
    ("mV", b2.mV, "voltage"), ("V", b2.volt, "voltage"), ("uV", b2.uvolt, "voltage"), ("mvolt", b2.mvolt, "voltage"),
    ("nA", b2.nA, "current"), ("pA", b2.pA, "current"), ("uA", b2.uA, "current"), ("namp", b2.namp, "current"),
    ("nS", b2.nS, "conductance"), ("uS", b2.uS, "conductance"), ("mS", b2.mS, "conductance"),
    ("pF", b2.pF, "capacitance"), ("nF", b2.nF, "capacitance"), ("uF", b2.uF, "capacitance"),
    ("MOhm", b2.Mohm, "resistance"), ("Mohm", b2.Mohm, "resistance"), ("kohm", b2.kohm, "resistance"),
    ("um", b2.um, "length"), ("cm", b2.cm, "length"), ("mm", b2.mm, "length"),
    ("mM", b2.mmolar, "concentration"), ("uM", b2.umolar, "concentration"),
    ("kHz", b2.kHz, "rate"), ("Hz", b2.Hz, "rate"),
]


@pytest.mark.parametrize("name,ref,kind", UNITS, ids=[u[0] for u in UNITS])
def test_unit_factors_match_brian2(name, ref, kind):
    factor, dim = unit(name)
    expected = float(ref / BASE[kind])
    assert float(factor) == pytest.approx(expected, rel=1e-15)
    assert (ref / BASE[kind]).dim == b2.units.fundamentalunits.DIMENSIONLESS


@pytest.mark.parametrize("written,ref,kind", [
    ("120 mS/cm**2", 120 * b2.mS / b2.cm**2, "area conductance"),
    ("1 uF/cm**2", 1 * b2.uF / b2.cm**2, "area capacitance"),
    ("10 uA/cm**2", 10 * b2.uA / b2.cm**2, "area current"),
    ("0.0805 nA", 0.0805 * b2.nA, "current"),
    ("0.04 / mV / ms * 1 mV * 1 mV", 0.04 * b2.mV / b2.ms, None),
])
def test_values_are_converted_to_base_units(written, ref, kind):
    """A param default with a unit, as the kernels see it (`state s = ...` is in base units)."""
    text = f"neuron U:\n    input x\n    state s = {written}\n    update:\n        s = s + x * 0\n    output s\n"
    m = flexdsl.loads(text, backend="torch")
    base = BASE[kind] if kind else b2.mV / b2.ms
    assert float(m.s) == pytest.approx(float(ref / base), rel=1e-14)


def test_dimension_display():
    volt = Dim.of((2, 1, -3, -1, 0, 0, 0))
    second = Dim.of((0, 0, 1, 0, 0, 0, 0))
    meter = Dim.of((1, 0, 0, 0, 0, 0, 0))
    amp = Dim.of((0, 0, 0, 1, 0, 0, 0))
    assert show(volt / second) == "V/s" and show(volt / second, "base") == "mV/ms"
    assert show(amp / volt) == "S" and show(amp / volt / meter**2, "base") == "nS/um**2"
    assert show(amp * second / volt) == "F" and show(Dim()) == "1"
    assert show(Dim() / (volt * second)) == "1/(V*s)"


# --------------------------------------------------------------------------- twins
# The same model written in flexdsl's base units without units: its generated code must be the
# units model's, character for character (the declarations are the only lines that differ, and
# generated code quotes only equation, update, spike and reset lines).
TWIN = (ADEX.replace(" : pA", "").replace(" ms", "").replace(" pF", "").replace(" nS", "")
        .replace(" mV", "").replace(" pA", "").replace("alpha=1/mV", "alpha=1"))


def _strip_header(src: str) -> str:
    return "\n".join(ln for ln in src.split("\n") if not ln.startswith(("# Model file:", "SOURCE_FILE")))


def test_twin_is_unitless_and_equal_in_base_units():
    assert flexdsl.compile(TWIN).checked.units is None
    assert flexdsl.compile(ADEX).checked.units is not None


def test_generated_code_equals_the_base_unit_twin(tmp_path):
    spike_line = "    spike when v > V_peak surrogate sigmoid(alpha=1/mV)"
    units, twin = ADEX.replace(spike_line, "    spike when v > V_peak"), TWIN.replace(
        "    spike when v > V_peak surrogate sigmoid(alpha=1)", "    spike when v > V_peak")
    a, b = flexdsl.compile(units), flexdsl.compile(twin)
    assert a.torch_source == b.torch_source
    assert a.triton_source == b.triton_source
    assert a.torch_backward_source == b.torch_backward_source
    # from files of other names: equal apart from the header lines naming the file
    fa, fb = tmp_path / "adex_units.neuron", tmp_path / "adex_twin.neuron"
    fa.write_text(ADEX)
    fb.write_text(TWIN)
    ca, cb = flexdsl.compile(str(fa)), flexdsl.compile(str(fb))
    assert _strip_header(ca.triton_source) != _strip_header(cb.triton_source)  # the quoted spike line differs...
    strip = [lambda s: "\n".join(ln for ln in _strip_header(s).split("\n") if "# line" not in ln)]
    for f in strip:  # ...and nothing else
        assert f(ca.triton_source) == f(cb.triton_source)
        assert f(ca.torch_source) == f(cb.torch_source)


HH_LIKE = textwrap.dedent("""\
    neuron HH:
        input I : pA/um**2
        param dt = 0.01 ms
        param C_m = 0.01 pF/um**2
        param g_Na = 1.2 nS/um**2
        param g_L = 0.003 nS/um**2
        param E_Na = 50 mV
        param E_L = -54.387 mV
        state v = -65 mV
        state m = 0.05
        equations method rk4:
            alpha_m = 0.1 / mV / ms * (v + 40 mV) / (1 - exp(-(v + 40 mV) / (10 mV)))
            beta_m = 4 / ms * exp(-(v + 65 mV) / (18 mV))
            dv/dt = (I - g_Na * m**3 * (v - E_Na) - g_L * (v - E_L)) / C_m
            dm/dt = alpha_m * (1 - m) - beta_m * m
        spike when v crosses 0 mV surrogate sigmoid(alpha=1 / mV)
        output spike, v
    """)
HH_TWIN = textwrap.dedent("""\
    neuron HH:
        input I
        param dt = 0.01
        param C_m = 0.01
        param g_Na = 1.2
        param g_L = 0.003
        param E_Na = 50
        param E_L = -54.387
        state v = -65
        state m = 0.05
        equations method rk4:
            alpha_m = 0.1 * (v + 40) / (1 - exp(-(v + 40) / 10))
            beta_m = 4 * exp(-(v + 65) / 18)
            dv/dt = (I - g_Na * m**3 * (v - E_Na) - g_L * (v - E_L)) / C_m
            dm/dt = alpha_m * (1 - m) - beta_m * m
        spike when v crosses 0 surrogate sigmoid(alpha=1)
        output spike, v
    """)


def test_units_in_equations_generate_the_twins_code():
    """Numbers with units inside equations fold to the numbers a model written in base units has."""
    a, b = flexdsl.compile(HH_LIKE), flexdsl.compile(HH_TWIN)
    drop = lambda s: "\n".join(ln for ln in s.split("\n") if "# line" not in ln)  # noqa: E731
    assert drop(a.torch_source) == drop(b.torch_source)
    assert drop(a.triton_source) == drop(b.triton_source)


LIF_SI = textwrap.dedent("""\
    neuron LIF:
        input I : nA
        param dt = 100 us
        param tau_m = 0.01 second where tau_m > 0
        param R = 10 Mohm
        param v_rest = -0.065 V
        param v_th = -50 mV
        state v = v_rest
        refractory 0.002 second
        equations method exact:
            dv/dt = (v_rest - v + R * I) / tau_m unless refractory
        spike when v > v_th surrogate sigmoid(alpha=1000 / V)
        on spike:
            v = v_rest
        output spike
    """)
LIF_BASE = textwrap.dedent("""\
    neuron LIF:
        input I
        param dt = 0.1
        param tau_m = 10 where tau_m > 0
        param R = 0.01
        param v_rest = -65
        param v_th = -50
        state v = v_rest
        refractory 2
        equations method exact:
            dv/dt = (v_rest - v + R * I) / tau_m unless refractory
        spike when v > v_th surrogate sigmoid(alpha=1)
        on spike:
            v = v_rest
        output spike
    """)


def test_declared_units_other_than_base_give_the_same_dynamics():
    """Params and inputs keep their declared units (s, V, nA, us); the kernels convert them."""
    x = 2 + torch.rand(1000, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4  # nA
    a = flexdsl.loads(LIF_SI, backend="torch", store_state_seqs=True)
    b = flexdsl.loads(LIF_BASE, backend="torch", store_state_seqs=True)
    sa, sb = a(x), b(x * 1000)  # the twin's input is in pA
    assert sa.sum() > 20
    assert torch.equal(sa, sb)
    torch.testing.assert_close(a.state_seqs["v"], b.state_seqs["v"], rtol=1e-12, atol=1e-12)
    assert (a.tau_m, a.v_rest, a.dt, a.R) == (0.01, -0.065, 100.0, 10.0)  # read back in the declared units
    assert b.tau_m == 10.0


def test_overrides_are_numbers_in_the_declared_unit_or_strings_with_units():
    x = torch.full((300, 1), 2.0, dtype=torch.float64)
    ref = flexdsl.loads(LIF_SI, backend="torch", tau_m=0.02)(x)
    for v in ("20 ms", "0.02 second", "20000 us", "0.02 s"):
        m = flexdsl.loads(LIF_SI, backend="torch", tau_m=v)
        assert m.tau_m == pytest.approx(0.02, rel=1e-15)
        assert torch.equal(m(x), ref)
    m = flexdsl.loads(LIF_SI, backend="torch")
    m.tau_m = "20 ms"  # assignment converts too
    assert m.tau_m == pytest.approx(0.02, rel=1e-15)
    m.tau_m = 0.03
    assert m.tau_m == 0.03
    with pytest.raises(flexdsl.FlexDSLError, match=r"`tau_m` takes a number \(in second\).*is V, but `tau_m` is s"):
        flexdsl.loads(LIF_SI, tau_m="20 mV")
    with pytest.raises(flexdsl.FlexDSLError, match="violates the constraint"):
        flexdsl.loads(LIF_SI, tau_m="-2 ms")
    with pytest.raises(flexdsl.FlexDSLError, match="`msec` is not a unit"):
        m.tau_m = "20 msec"
    with pytest.raises(flexdsl.FlexDSLError, match="takes a number"):
        flexdsl.loads(LIF_SI, tau_m="20 ms; import os")
    with pytest.raises(flexdsl.FlexDSLError):
        flexdsl.load("lif", tau="20 ms")  # a model without units takes plain numbers


def test_meta_units_of_declarations():
    ck = flexdsl.compile(LIF_SI).checked
    units = {d.name: d.meta["unit"] for d in [*ck.inputs, *ck.params, *ck.states] if not d.meta.get("hidden")}
    assert units == {"I": "nA", "dt": "us", "tau_m": "second", "R": "Mohm", "v_rest": "V", "v_th": "mV", "v": "mV"}
    assert ck.units.unit["v"] == "mV" and ck.units.unit["tau_m"] == "second"
    hh = flexdsl.compile("hodgkin_huxley").checked
    assert {p.name: p.meta["unit"] for p in hh.params}["g_Na"] == "mS/cm**2"
    assert {s.name: s.meta["unit"] for s in hh.states}["m"] == "1"


def test_unitless_library_models_have_no_units():
    with_units = {"adex", "hodgkin_huxley", "izhikevich_2003", "lif_ode", "lif_refractory", "morris_lecar"}
    for stem in flexdsl.library():
        assert (flexdsl.compile(stem).checked.units is not None) == (stem in with_units), stem


def test_a_model_with_units_loads_from_the_disk_cache_without_sympy(tmp_path):
    code = ("import sys, torch, flexdsl; m = flexdsl.load('adex', tau_w='100 ms'); s = m(torch.full((50, 2), 900.0)); "
            "print('sympy' in sys.modules, s.sum().item(), float(m.v.sum()))")
    env = {**__import__("os").environ, "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    (used1, *v1), (used2, *v2) = (r.stdout.split() for r in runs)
    assert used1 == "True" and used2 == "False" and v1 == v2


def test_cli_run_takes_and_prints_units():
    r = subprocess.run([sys.executable, "-m", "flexdsl", "run", "lif_refractory", "--T", "300", "--input", "3",
                        "--param", "t_ref=5 ms", "--param", "tau_m=0.02 second"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "state v: final" in r.stdout and " mV" in r.stdout and "_steps_since_spike" not in r.stdout
    bad = subprocess.run([sys.executable, "-m", "flexdsl", "run", "lif_refractory", "--param", "t_ref=5 mV"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and "`t_ref` takes a number (in ms)" in bad.stderr


def test_one_over_a_unit_after_a_number():
    """`0.02 1/ms` (NESTML's way) is `0.02 / ms`; its declared unit is 1/ms."""
    text = ("neuron U:\n    input x : 1/ms\n    param a = 0.02 1/ms\n    param b = 0.02 / ms\n"
            "    param c = 3 1/um**2\n    state s = 0\n    update:\n        s = (a - b) * x * 1 ms**2 + c * 1 cm**2\n"
            "    output s\n")
    m = flexdsl.loads(text, backend="torch")
    ck = m.compiled.checked
    assert {p.name: p.meta["unit"] for p in ck.params} == {"a": "1/ms", "b": "1/ms", "c": "1/um**2"}
    assert m.a == m.b == 0.02
    out = m(torch.ones(2, 1, dtype=torch.float64))
    assert torch.equal(out, torch.full((2, 1), 3.0e8, dtype=torch.float64))  # 3/um**2 * 1 cm**2


# --------------------------------------------------------------------------- robustness
_UNITS = ["ms", "mV", "nA", "pA", "nS", "pF", "um", "cm", "mM", "second", "V", "Mohm", "Hz", "m", "s", "x", "v",
          "tau", "mv", "MS", "1", "0", "2.5", "1e-300", "1e300", "cm**2", "ms**-1", "(ms*mV)", "1/ms"]
_OPS = ["*", "/", "+", "-", "**"]


@st.composite
def _unit_model(draw) -> str:
    """Mostly plausible models with units (about half load), with hostile pieces mixed in."""

    def const() -> str:
        number = draw(st.sampled_from(["1", "2.5", "-3", "0", "10", "1e-3", "1e-300", "1e300"]))
        unit = draw(st.sampled_from(["mV", "mV", "ms", " ", "nA", "mV**2", "1/ms", "cm**2", "tau", "mv", "MS"]))
        return f"{number} {unit}".strip()

    def expr(names: list[str]) -> str:
        parts = [draw(st.sampled_from([*names, const(), const()]))]
        for _ in range(draw(st.integers(0, 3))):
            parts.append(draw(st.sampled_from([" + ", " - ", " * ", " / ", "**"])))
            parts.append(draw(st.sampled_from([*names, const(), *_UNITS])))
        return "".join(parts)

    unit = draw(st.sampled_from(["", " : mV/ms", " : mV/ms", " : nA", " : 1/ms", " : tau", " : 2 ms", " : ms**99"]))
    ref = draw(st.sampled_from(["", "    refractory 2 ms\n", "    refractory while v > 1 mV\n", "    refractory tau\n",
                                "    refractory 2 mV\n"]))
    held = draw(st.sampled_from(["", " unless refractory"]))
    rule = draw(st.sampled_from([">", ">=", "crosses"]))
    dt = draw(st.sampled_from(["0.1 ms", "0.1 ms", "100 us", "0.1"]))
    tau = draw(st.sampled_from(["10 ms", "0.01 second", const()]))
    rhs = draw(st.sampled_from(["(-v + x * 1 ms) / tau", f"({expr(['v', 'x', 'tau'])} - v) / tau"]))
    return (f"neuron F:\n    input x{unit}\n    param dt = {dt}\n    param tau = {tau}\n"
            f"    state v = {draw(st.sampled_from(['0 mV', '-65 mV', const()]))}\n{ref}"
            f"    equations:\n        dv/dt = {rhs}{held}\n"
            f"    spike when v {rule} {draw(st.sampled_from(['1 mV', '-50 mV', const()]))} surrogate "
            f"{draw(st.sampled_from(['sigmoid(alpha=1/mV)', 'sigmoid()', 'fast_sigmoid()', 'atan(alpha=2)']))}\n"
            f"    output spike\n")


@settings(max_examples=300, deadline=None, database=None)
@given(_unit_model())
def test_random_models_with_units_fail_only_with_located_errors(text):
    t0 = time.perf_counter()
    try:
        m = flexdsl.loads(text, backend="torch")
        with torch.no_grad():
            m(torch.linspace(-2.0, 3.0, 6, dtype=torch.float64).reshape(2, 3))
    except flexdsl.FlexDSLError as e:
        assert e.format().startswith("<string>")
    assert time.perf_counter() - t0 < 2.0, text
