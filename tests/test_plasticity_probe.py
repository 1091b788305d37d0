"""Plasticity edge cases found by probing: kept states of a call in another dtype, ... Each against
a float64 hand loop of the rule's equations or the same computation run another way."""

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
