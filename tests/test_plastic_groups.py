"""Plastic layers whose groups differ: a rule that both carries an `output` and changes its weight (its
presynaptic states advance once per step, not twice), and a `window` group beside an `online` one (its
weights held over the call). Against float64 hand loops of the rules' equations."""

from __future__ import annotations

import pytest
import torch

import flexdsl

STP_STDP = """rule STPSTDP:
    state x = 0
    state u = 1
    update:
        x = 0.5 * x + pre
        u = 0.9 * u + 0.1 - 0.3 * u * pre
        let r = u * pre
    on post:
        w += 0.1 * x
    output r
"""


def _hand_carried(pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule's trace x and carried value r at every step, from x = 0, u = 1 (float64)."""
    x, u = torch.zeros_like(pre[0]), torch.ones_like(pre[0])
    xs, rs = [], []
    for t in range(pre.shape[0]):
        x = 0.5 * x + pre[t]
        u = 0.9 * u + 0.1 - 0.3 * u * pre[t]
        xs.append(x)
        rs.append(u * pre[t])
    return torch.stack(xs), torch.stack(rs)


@pytest.mark.parametrize("mode", ["window", "online"])
def test_a_carrying_rule_that_changes_its_weight_advances_its_traces_once(mode, tmp_path):
    """The current reads r (the rule's output) and the change reads x, both from one pass over the
    presynaptic side: the layer ran that side twice (once to carry, once for the change), the change
    reading the traces of a second pass from the first's end (dW 0.447 against 0.4375)."""
    p = tmp_path / "r.rule"
    p.write_text(STP_STDP)
    pre = (torch.rand(8, 1, 3, generator=torch.Generator().manual_seed(0)) < 0.5).double()
    m = flexdsl.feedforward("lif", 3, 2, bias=False, rule=str(p), plasticity=mode, backend="torch").double()
    with torch.no_grad():
        m.W.fill_(2.0)
    w0 = m.W.detach().clone()
    post = m(pre)
    xs, rs = _hand_carried(pre)
    lif = flexdsl.load("lif", backend="torch").double()
    w = w0.clone()
    want_post, dw = [], torch.zeros_like(w0)
    for t in range(pre.shape[0]):  # the neuron's input: W r[t] (online: the weights after every change before)
        s = lif(rs[t:t + 1] @ (w if mode == "online" else w0).T)
        want_post.append(s[0])
        step = 0.1 * s[0].T @ xs[t]
        dw += step
        if mode == "online":
            w = w + step
    assert torch.equal(post, torch.stack(want_post))
    assert torch.allclose(m.W.detach() - w0, dw, rtol=0, atol=1e-14)
    # a second call continues from the first's states: equal to one call of both
    m2 = flexdsl.feedforward("lif", 3, 2, bias=False, rule=str(p), plasticity=mode, backend="torch").double()
    with torch.no_grad():
        m2.W.fill_(2.0)
    m2(pre[:5])
    m2(pre[5:])
    assert torch.allclose(m2.W.detach(), m.W.detach(), rtol=0, atol=1e-14)


def test_a_window_group_beside_an_online_group_keeps_its_weights_over_the_call():
    """`Wa` online and `Wb` window in one layer: Wb's current reads Wb as it was before the call, and
    Wb takes the window change of the call's spikes (SpikingJelly's semantics) once, after it. The layer
    ran every group online."""
    text = ("layer Two:\n    neuron lif\n    size 3\n    input a size 4\n    input b size 3\n"
            "    synapses Wa from a to x:\n        rule stdp_sj online\n"
            "    synapses Wb from b to x:\n        rule stdp_sj window\n")
    g = torch.Generator().manual_seed(2)
    xa = (torch.rand(12, 2, 4, generator=g) < 0.5).double()
    xb = (torch.rand(12, 2, 3, generator=g) < 0.5).double()
    m = flexdsl.loads(text, backend="torch").double()
    with torch.no_grad():
        m.Wa.fill_(0.8)
        m.Wb.fill_(0.8)
    y = m(xa, xb)
    # by hand: Wa changes every step (the rule's online steps), Wb held
    rule_a = flexdsl.load_rule("stdp_sj").double()
    lif = flexdsl.load("lif", backend="torch").double()
    wa, wb = torch.full((3, 4), 0.8, dtype=torch.float64), torch.full((3, 3), 0.8, dtype=torch.float64)
    want = []
    for t in range(12):
        s = lif(xa[t:t + 1] @ wa.T + xb[t:t + 1] @ wb.T)
        want.append(s[0])
        wa = rule_a.online(xa[t:t + 1], s, wa)
    want = torch.stack(want)
    assert torch.equal(y, want)
    dwb = flexdsl.load_rule("stdp_sj").double().window(xb, want, wb)
    assert torch.allclose(m.Wb.detach(), wb + dwb, rtol=0, atol=1e-13)
    assert torch.allclose(m.Wa.detach(), wa, rtol=0, atol=1e-13)
