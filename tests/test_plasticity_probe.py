"""Plasticity edge cases found by probing: a rule's kept states after a call (or a module move) in
another dtype, a per-sample modulator of a rule that carries an `output`, a modulator in another dtype
than an online layer's, NumPy scalar modulators. Each against a float64 hand loop of the rule's
equations, or the same computation run another way (exact where the values are exact)."""

from __future__ import annotations

import pytest
import torch

import flexdsl

F64 = torch.float64


def _trains(seed: int, T: int, B: int, n_pre: int, n_post: int, p: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    pre = (torch.rand(T, B, n_pre, generator=g) < p).to(F64)
    post = (torch.rand(T, B, n_post, generator=g) < p).to(F64)
    return pre, post, torch.rand(n_post, n_pre, generator=g, dtype=F64)


@pytest.mark.parametrize("mode", ["window", "online"])
def test_a_layer_moved_to_another_dtype_runs_its_kept_rule_states_in_it(mode):
    """`m.double()` then `m.float()` between calls: the rule's kept traces (float64 from the float64
    call) run in the call's dtype, as the neuron's do (were float64: online a RuntimeError of
    mismatched dtypes, window a float64 change and traces for a float32 layer)."""
    torch.manual_seed(0)
    m = flexdsl.feedforward("lif", 4, 3, rule="mstdpet", plasticity=mode, backend="torch").double()
    pre = (torch.rand(5, 2, 4) < 0.5).to(F64)
    m(pre, reward=torch.ones(5, dtype=F64))
    m.float()
    y = m(pre.float(), reward=torch.ones(5))
    assert y.dtype == torch.float32 and m.W.dtype == torch.float32 and m.last_dw("W").dtype == torch.float32
    assert all(v.dtype == torch.float32 for v in m.rules["W"]._states.values())


def test_a_rule_call_after_one_in_another_dtype_returns_the_weights_dtype():
    pre, post, w = _trains(1, 6, 2, 4, 3)
    r = flexdsl.load_rule("mstdpet")
    r.window(pre, post, w, reward=1.0)
    assert r.window(pre.float(), post.float(), w.float(), reward=1.0).dtype == torch.float32
    assert r.online(pre.float(), post.float(), w.float(), reward=1.0).dtype == torch.float32


GATED_STP = """rule GatedSTP:
    input gain
    state u = 1
    update:
        u = 0.9 * u + 0.1 - 0.3 * u * pre * gain
        let r = u * pre
    output r
"""


def _gated_stp_hand(pre: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """GatedSTP's carried value at every step (float64), a gain per step and sample."""
    u, rs = torch.ones_like(pre[0]), []
    for t in range(pre.shape[0]):
        u = 0.9 * u + 0.1 - 0.3 * u * pre[t] * gain[t][:, None]
        rs.append(u * pre[t])
    return torch.stack(rs)


@pytest.mark.parametrize("mode", ["window", "online"])
def test_a_carrying_rule_takes_a_modulator_per_step_and_sample(mode, tmp_path):
    """A modulator `[T, *batch]` of a rule with an `output` (what its synapse carries) is one value per
    step and sample, as the docs say of every modulator (was refused: `carry` checked it as if the call
    had no batch, "[T, *batch] = [T]", in `rule.carry` and in a layer of either semantics)."""
    path = tmp_path / "gated.rule"
    path.write_text(GATED_STP)
    pre, _, _ = _trains(2, 6, 2, 5, 1, p=0.5)
    gain = torch.rand(6, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    ref = _gated_stp_hand(pre, gain)
    got = flexdsl.load_rule(str(path)).carry(pre, gain=gain)
    assert (got - ref).abs().max() <= 6 * 8 * 2.0**-53 * ref.abs().max()  # (T steps of ~8 operations)
    m = flexdsl.feedforward("lif", 5, 3, rule=str(path), plasticity=mode, backend="torch").double()
    lif = flexdsl.load("lif", backend="torch")
    assert torch.equal(m(pre, gain=gain), lif(ref @ m.W.detach().T + m.bias.detach()))


@pytest.mark.parametrize("shape", ["[T]", "[T, batch]"])
def test_a_float64_modulator_of_a_float32_online_layer_runs_in_float32(shape):
    """A reward in another dtype than the layer's (float64 for a float32 layer) gives what the same
    values in float32 give: the online loop takes the modulators as the rule does, cast to the call's
    dtype (`[T, batch]` was a RuntimeError, "mat2 must have the same dtype": the float64 reward made the
    weights float64 after the first step)."""
    torch.manual_seed(0)
    pre = (torch.rand(6, 2, 5) < 0.5).float()
    reward = (torch.arange(12).reshape(6, 2) % 3 - 1).float()  # (-1, 0, 1: exact in either dtype)
    reward = reward[:, 0] if shape == "[T]" else reward
    got = []
    for r in (reward.double(), reward):
        torch.manual_seed(1)
        m = flexdsl.feedforward("lif", 5, 4, rule="mstdp", plasticity="online", backend="torch")
        with torch.no_grad():
            m.W.mul_(3).abs_()
        got.append((m(pre, reward=r), m.W.detach().clone()))
    assert got[0][1].dtype == torch.float32
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


@pytest.mark.parametrize("mode", ["window", "online"])
def test_a_numpy_scalar_modulator_is_a_number(mode):
    """`reward=np.float32(0.5)` (a reward from a NumPy environment) is the number 0.5, as `np.float64`
    and `float` already were (was a located error, "must be a real number or tensor, not float32")."""
    np = pytest.importorskip("numpy")
    pre, post, w = _trains(4, 5, 2, 4, 3, p=0.5)
    want = getattr(flexdsl.load_rule("mstdp"), mode)(pre, post, w, reward=0.5)
    for r in (np.float32(0.5), np.float16(0.5), np.int64(2)):
        got = getattr(flexdsl.load_rule("mstdp"), mode)(pre, post, w, reward=r)
        assert torch.equal(got, want if float(r) == 0.5 else getattr(flexdsl.load_rule("mstdp"), mode)(
            pre, post, w, reward=2.0))
    with pytest.raises(flexdsl.FlexDSLError, match="real number or tensor") as e:
        flexdsl.load_rule("mstdp").window(pre, post, w, reward=np.bool_(True))
    assert e.value.hint


@pytest.mark.parametrize("case", ["int spikes", "weight rank", "batch", "sizes"])
def test_a_rule_calls_bad_inputs_are_located_errors_with_a_hint(case):
    """A rule called with spikes that are not floats, a weight that is not [n_post, n_pre], sides of
    another batch or sizes the weight does not connect: a FlexDSLError located in the rule's file and
    saying what to pass (a hint), never a bare torch error."""
    pre, post, w = _trains(5, 4, 2, 3, 2)
    pre, post, w = pre.float(), post.float(), w.float()
    args = {"int spikes": (pre.long(), post, w), "weight rank": (pre, post, w.flatten()),
            "batch": (pre, post[:, :1], w), "sizes": (pre, post, w.t())}[case]
    r = flexdsl.load_rule("stdp_additive")
    with pytest.raises(flexdsl.FlexDSLError) as e:
        r.window(*args)
    assert e.value.filename and e.value.filename.endswith(".rule") and e.value.hint
