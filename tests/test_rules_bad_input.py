"""Plasticity rules under bad input and at their edges (issue 32's bad input, as an attacker tries it):
every refusal a located `FlexDSLError` at load where the issue says so, never a bare exception or
silently wrong weights; gradients of learnable constants against central finite differences of rules
loaded with the perturbed value (float64), wherever the constant is used."""

from __future__ import annotations

import pytest
import torch

import flexdsl
from flexdsl import FlexDSLError

F64 = torch.float64


def _spikes(seed: int, *shape: int, p: float = 0.3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) < p).to(F64)


def _line(text: str, words: str) -> int:
    return next(i + 1 for i, line in enumerate(text.splitlines()) if words in line)


BOUNDED = """rule R:
    state x_pre = 0
    weight w where {bounds}
    on pre:
        x_pre += 1
        w -= x_pre
"""


# ------------------------------------------------------------------------------ bounds that cannot hold
@pytest.mark.parametrize("bounds", ["1 <= w <= 0", "1 < w < 1", "1 <= w < 1", "2 <= w < 1"])
def test_bounds_no_weight_satisfies_are_refused_at_load(bounds):
    text = BOUNDED.format(bounds=bounds)
    with pytest.raises(FlexDSLError, match="cannot hold") as e:
        flexdsl.load_rule(text)
    assert e.value.line == _line(text, "weight w")


def test_bound_params_that_cannot_hold_are_refused_at_load_and_in_a_layer():
    with pytest.raises(FlexDSLError, match="cannot hold"):
        flexdsl.load_rule("stdp_additive", w_min=2.0, w_max=1.0)
    with pytest.raises(FlexDSLError, match="cannot hold"):
        flexdsl.feedforward("lif", 3, 2, rule="stdp_additive", rule_params={"w_min": 2.0, "w_max": 1.0})
    r = flexdsl.load_rule("stdp_additive", w_min=0.5, w_max=0.5)  # (a closed bound at one value holds)
    assert r.bounds() == (0.5, 0.5)


# ------------------------------------------------------------------------- gradients wherever used
def _fd(make, name: str, value: float, loss, h: float = 1e-6) -> float:
    return (loss(make(**{name: value + h})) - loss(make(**{name: value - h}))) / (2 * h)


def test_a_learnable_bound_gets_the_gradient_of_the_clamp():
    """Weights held at `w_max` by the clamp move with it: d(sum W)/d(w_max) = the number of clamped
    weights (was: no gradient at all)."""
    pre, post = torch.ones(6, 1, 3, dtype=F64), torch.ones(6, 1, 2, dtype=F64)
    w0 = torch.full((2, 3), 0.95, dtype=F64)
    rule = flexdsl.load_rule("stdp_additive", learnable=["w_max", "A_plus"]).double()
    rule.online(pre, post, w0).sum().backward()

    def loss(r):
        return float(r.double().online(pre, post, w0).sum())

    fd = _fd(lambda **kw: flexdsl.load_rule("stdp_additive", **kw), "w_max", 1.0, loss)
    assert abs(fd - 6.0) < 1e-6
    assert abs(float(rule.w_max.grad) - fd) <= 1e-6 * max(1.0, abs(fd))


def test_a_param_computed_from_a_learnable_one_follows_it():
    """`stdp_song`'s `dApost = -dApre * taupre / taupost * 1.05`: with `dApre` learnable, `dApost` is
    computed from it (as `load_rule(dApre=...)` computes it), and the gradient goes through both."""
    pre, post = _spikes(1, 30, 2, 4), _spikes(2, 30, 2, 3)
    w0 = torch.rand(3, 4, generator=torch.Generator().manual_seed(3), dtype=F64) * 0.01

    def loss(r):
        r.reset()
        return (r.window(pre, post, w0) ** 2).sum() * 1e4

    rule = flexdsl.load_rule("stdp_song", learnable=["dApre"]).double()
    d0 = float(rule.dApre.detach())
    loss(rule).backward()
    fd = _fd(lambda **kw: flexdsl.load_rule("stdp_song", **kw).double(), "dApre", d0, lambda r: float(loss(r)))
    assert abs(float(rule.dApre.grad) - fd) <= 1e-4 * max(1.0, abs(fd))
    with torch.no_grad():
        rule.dApre.fill_(2e-4)
    ref = flexdsl.load_rule("stdp_song", dApre=2e-4)
    assert abs(float(rule.dApost) - float(ref.dApost)) <= 1e-12
    rule.dApost = -1e-3  # (a value given: it stays)
    with torch.no_grad():
        rule.dApre.fill_(3e-4)
    assert float(rule.dApost) == -1e-3


def test_a_learnable_constant_no_derivative_reaches_is_refused():
    text = ("rule R:\n    param A = 0.5 learnable\n    state x_pre = A\n    on pre:\n        x_pre += 1\n"
            "    on post:\n        w += x_pre\n")
    with pytest.raises(FlexDSLError, match="initial value") as e:
        flexdsl.load_rule(text)
    assert e.value.line == 2
    with pytest.raises(FlexDSLError, match="learnable="):
        flexdsl.load_rule("stdp_additive", learnable=3)
    # True: every constant a derivative reaches (the bounds' too)
    names = {n for n, _ in flexdsl.load_rule("stdp_additive", learnable=True).named_parameters()}
    assert {"A_plus", "A_minus", "tau_plus", "tau_minus", "w_min", "w_max"} <= names


def test_a_rules_params_are_one_number_each():
    with pytest.raises(FlexDSLError, match="one number each") as e:
        flexdsl.load_rule("stdp_additive", tau_plus=torch.ones(3) * 5)
    assert "param tau_plus" in str(e.value)
    r = flexdsl.load_rule("stdp_additive")
    with pytest.raises(FlexDSLError, match="one number each"):
        r.tau_plus = torch.ones(2)
    assert float(flexdsl.load_rule("stdp_additive", tau_plus=torch.tensor([5.0])).tau_plus) == 5.0


# ------------------------------------------------------------------------------------ in a layer
@pytest.mark.parametrize("rule", ["tsodyks_markram", "clopath"])
def test_a_rule_that_reads_no_post_spikes_runs_on_a_neuron_without_spikes(rule):
    params = {"dt": 0.001} if rule == "clopath" else {}
    m = flexdsl.feedforward("li", 3, 2, rule=rule, rule_params=params).double()
    y = m(_spikes(4, 5, 2, 3))
    assert y.shape == (5, 2, 2) and torch.isfinite(y).all()


def test_a_rule_that_reads_post_spikes_needs_a_neuron_with_spikes():
    text = ("layer L:\n    neuron li\n    size 2\n    input s size 3\n    synapses W from s to x:\n"
            "        rule stdp_sj\n")
    with pytest.raises(FlexDSLError, match="no spike output") as e:
        flexdsl.loads(text)
    assert e.value.line == _line(text, "rule stdp_sj")


def test_an_output_reading_a_per_sample_state_is_refused_at_load():
    text = ("rule R:\n    input reward\n    state g = 0\n    state u = 1\n    update:\n        g = g * 0.5 + reward\n"
            "        u = u * 0.9 + 0.1 - 0.5 * u * pre\n        let r = g * u * pre\n    output r\n")
    with pytest.raises(FlexDSLError, match="not a presynaptic value"):
        flexdsl.load_rule(text)


@pytest.mark.parametrize("mode", ["window", "online"])
@pytest.mark.parametrize("shape", [(7,), (4, 2, 1), (2,), (4, 1), (4, 3), (4, 2, 2)])
def test_a_modulator_of_the_wrong_shape_is_refused_in_both_semantics(mode, shape):
    m = flexdsl.feedforward("lif", 3, 2, rule="mstdp", plasticity=mode).double()
    w0 = m.W.detach().clone()
    with pytest.raises(FlexDSLError, match="modulator `reward` has shape"):
        m(_spikes(5, 4, 2, 3), reward=torch.ones(shape, dtype=F64))
    assert torch.equal(m.W.detach(), w0)  # (nothing ran)
    for good in ((4,), (4, 2)):
        assert m(_spikes(5, 4, 2, 3), reward=torch.ones(good, dtype=F64)).shape == (4, 2, 2)


# ------------------------------------------------------------------------------------ no steps
def test_calls_of_no_steps_change_nothing():
    pre, post = _spikes(6, 8, 2, 3), _spikes(7, 8, 2, 2)
    w0 = torch.rand(2, 3, generator=torch.Generator().manual_seed(8), dtype=F64)
    r = flexdsl.load_rule("stdp_additive")
    assert torch.equal(r.window(pre[:0], post[:0], w0), torch.zeros_like(w0))
    assert torch.equal(r.online(pre[:0], post[:0], w0), w0)
    assert r.window(pre[..., :0], post, w0[:, :0]).shape == (2, 0)
    assert flexdsl.load_rule("tsodyks_markram").carry(pre[:0]).shape == (0, 2, 3)
    # a stream with an empty chunk learns as the stream without it
    whole = flexdsl.load_rule("stdp_additive").online(pre, post, w0)
    r.reset()
    a = r.online(pre[:3], post[:3], w0)
    a = r.online(pre[3:3], post[3:3], a)
    assert torch.allclose(r.online(pre[3:], post[3:], a), whole, rtol=0, atol=1e-15)
    for mode in ("window", "online"):
        torch.manual_seed(9)
        m = flexdsl.feedforward("lif", 3, 2, rule="stdp_additive", plasticity=mode).double()
        w = m.W.detach().clone()
        assert m(pre[:0]).shape == (0, 2, 2)
        assert torch.equal(m.W.detach(), w)


# ----------------------------------------------------------------------------------- the API
def test_plasticity_options_without_a_rule_and_unknown_groups_are_errors():
    with pytest.raises(FlexDSLError, match="without rule="):
        flexdsl.feedforward("lif", 3, 2, plasticity="online")
    with pytest.raises(FlexDSLError, match="without rule="):
        flexdsl.feedforward("lif", 3, 2, rule_params={"A_plus": 0.1})
    m = flexdsl.feedforward("lif", 3, 2, rule="stdp_additive")
    assert m.last_dw("W") is None
    with pytest.raises(FlexDSLError, match="not a synapse group with a plasticity rule"):
        m.last_dw("Wx")


def test_the_cli_refuses_what_load_refuses_without_a_traceback(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    bad = tmp_path / "bad.rule"
    bad.write_text(BOUNDED.format(bounds="1 <= w <= 0"))
    out = tmp_path / "bad_out.rule"
    out.write_text("rule R:\n    state x_pre = 0\n    state x_post = 0\n    weight w\n    update:\n"
                   "        let r = x_post * pre\n    output r\n")
    for args in (["show", bad], ["check", bad], ["doc", out, "-o", tmp_path / "d"], ["show", out]):
        p = subprocess.run([sys.executable, "-m", "flexdsl", *map(str, args)], capture_output=True, text=True,
                           cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root), "MPLBACKEND": "Agg"},
                           timeout=180)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and "error:" in p.stderr, (args, p.stderr)


def test_a_complex_modulator_is_refused():
    m = flexdsl.feedforward("lif", 3, 2, rule="mstdp").double()
    with pytest.raises(FlexDSLError, match="real number or tensor"):
        m(_spikes(5, 4, 2, 3), reward=torch.ones(4, dtype=torch.complex128))


def test_a_rules_dt_without_a_unit_counts_in_the_neurons_unit():
    """`stdp_additive`'s `dt = 1.0` (a number) on `lif_ode` (`dt = 0.1 ms`): the rule would count its
    times in steps of 1 ms against the neuron's 0.1 ms; refused at the rule's line, and agreeing
    values load."""
    with pytest.raises(FlexDSLError, match=r"dt = 1 and neuron `LIFODE` by dt = 0.1 ms") as e:
        flexdsl.feedforward("lif_ode", 3, 2, rule="stdp_additive")
    assert "rule_params={'dt': 0.1}" in str(e.value)
    flexdsl.feedforward("lif_ode", 3, 2, rule="stdp_additive", rule_params={"dt": 0.1})
    flexdsl.feedforward("lif_ode", 3, 2, rule="stdp_song")  # (0.1 ms both)
    with pytest.raises(FlexDSLError, match="a rule steps with its neuron"):
        flexdsl.feedforward("lif_ode", 3, 2, rule="stdp_song", dt="0.2 ms")


def test_a_rule_on_a_recurrent_layers_input_synapses_is_a_located_error():
    """The recurrent scan runs no rule: the rule on `W_in` loaded, `flexdsl check` said ok, and W_in
    never changed."""
    text = ("layer R:\n    neuron lif\n    size 3\n    input spikes size 4\n    synapses W_in from spikes to x:\n"
            "        rule stdp_additive online\n    synapses W_rec from spike to x\n")
    with pytest.raises(flexdsl.FlexDSLError, match="plasticity rule") as e:
        flexdsl.loads(text)
    assert e.value.line == 6


@pytest.mark.parametrize("case", ["no_rule_file", "no_rule_recurrent", "not_a_dict"])
def test_rule_params_that_reach_no_rule_or_are_not_a_dict_are_located_errors(case):
    with pytest.raises(flexdsl.FlexDSLError, match="rule_params"):
        if case == "no_rule_file":
            flexdsl.load("ff_lif.layer", hidden=3, in_features=4, rule_params={"A_plus": 0.5})
        elif case == "no_rule_recurrent":
            flexdsl.load("rlif.layer", hidden=3, in_features=4, rule_params={"A_plus": 0.5})
        else:
            flexdsl.feedforward("lif", 4, 3, rule="stdp_additive", rule_params={"W": 5})


def test_a_modulator_on_another_device_is_a_located_error():
    rule = flexdsl.load_rule("mstdp")
    pre = (torch.rand(4, 2, 3) < 0.5).float()
    post = (torch.rand(4, 2, 5) < 0.5).float()
    with pytest.raises(flexdsl.FlexDSLError, match="meta"):
        rule.window(pre, post, torch.zeros(5, 3), reward=torch.ones(4, device="meta"))


def test_an_online_layer_called_with_an_empty_batch_changes_nothing():
    m = flexdsl.feedforward("lif", 3, 4, rule="stdp_additive", plasticity="online")
    w0 = m.W.detach().clone()
    assert m(torch.zeros(5, 0, 3)).shape == (5, 0, 4)
    assert torch.equal(m.W.detach(), w0.clamp(0, 1))  # (stdp_additive's bounds, as any call applies)


def test_a_per_neuron_dt_is_checked_against_the_rules():
    """A per-neuron `dt` tensor skipped the check (only one number was compared)."""
    with pytest.raises(flexdsl.FlexDSLError, match="0.5"):
        flexdsl.feedforward("lif_ode", 3, 4, rule="stdp_additive", dt=torch.tensor([0.1, 0.1, 0.5, 0.1]),
                            rule_params={"dt": 0.1})
    flexdsl.feedforward("lif_ode", 3, 4, rule="stdp_additive", dt=torch.full((4,), 0.1), rule_params={"dt": 0.1})


@pytest.mark.parametrize("dtype, unit", [(torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)])
@pytest.mark.parametrize("name", ["stdp_sj", "stdp_additive"])
def test_half_precision_weights_get_the_float32_change_rounded_once(name, dtype, unit):
    """A window over half-precision weights: the traces and sums ran in bf16 (2e-2 relative from
    float64 in bfloat16). Now within one rounding of the weight's dtype of the float64 change computed
    from the same (half-precision) weights, element by element, plus float32's sums."""
    g = torch.Generator().manual_seed(7)
    pre = (torch.rand(200, 4, 64, generator=g) < 0.1).float()
    post = (torch.rand(200, 4, 32, generator=g) < 0.1).float()
    w = torch.rand(32, 64, generator=g).to(dtype)
    rule = flexdsl.load_rule(name)
    ref = flexdsl.load_rule(name).double().window(pre.double(), post.double(), w.double())
    got = rule.window(pre.to(dtype), post.to(dtype), w)
    assert got.dtype == dtype
    bound = unit * ref.abs() + 800 * 2.0 ** -24 * ref.abs().max()  # (one rounding; float32 sums of 800 terms)
    assert bool(((got.double() - ref).abs() <= bound).all())


def test_a_dt_assigned_after_load_is_checked_at_the_next_call():
    """The rule's `dt` checked against the neuron's at load only: assigned afterwards, the layer ran."""
    m = flexdsl.feedforward("lif_ode", 3, 4, rule="stdp_additive", rule_params={"dt": 0.1})
    x = (torch.rand(5, 2, 3) < 0.5).float()
    m(x)
    m.rules["W"].dt = 0.5
    with pytest.raises(flexdsl.FlexDSLError, match="dt = 0.5"):
        m(x)
    m.rules["W"].dt = 0.1
    m(x)


# ------------------------------------------------------------------------------ coupled traces
COUPLED = """rule R:
    param dt = 1.0
    param A = 0.1
    state x = 0
    state y = 0
    equations:
        s = y
        dx/dt = -x + {rhs}
        dy/dt = -y - x
    on pre:
        x += 1
        w += A * y
"""


@pytest.mark.parametrize("rhs", ["y", "s"])
def test_coupled_odes_are_refused_at_the_equation_that_couples_them(rhs):
    """The caret was on `param dt = 1.0` (the rule's first param), not on the equations."""
    text = COUPLED.format(rhs=rhs)
    with pytest.raises(FlexDSLError, match="couple states") as e:
        flexdsl.load_rule(text)
    at = (_line(text, "dx/dt"), 22) if rhs == "y" else (_line(text, "s = y"), 13)  # (the `y` read)
    assert (e.value.line, e.value.column) == at and "`dx/dt` reads `y`" in e.value.reason
