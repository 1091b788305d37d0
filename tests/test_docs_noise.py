"""The language reference's caveat on learning a noise amplitude (docs/language.md, Noise), checked
on the model it describes: through spikes the surrogate gradient of a firing rate with respect to
`sigma` points against a finite difference with common random numbers, and where the loss is a
smooth function of the states the reparametrization gradient is the finite difference."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import flexdsl

D = torch.float64
MEMBRANE = """neuron OU:
    input I : nA
    param dt = 0.1 ms
    param tau_m = 10 ms
    param R = 10 MOhm
    param v_rest = -65 mV
    param sigma = {sigma} mV learnable
    state v = v_rest
    equations:
        dv/dt = (v_rest - v + R*I)/tau_m + sigma*sqrt(2/tau_m)*xi
"""
SPIKING = MEMBRANE + """    spike when v >= -50 mV surrogate sigmoid(alpha=1/mV)
    on spike:
        v = v_rest
"""
SMOOTH = MEMBRANE + "    output v\n"


def _value_and_grad(text: str, sigma: float, current: float, seed: int, loss, grad: bool = True):
    m = flexdsl.loads(text.format(sigma=sigma), backend="torch", detach_reset=True).to(D)
    out = m(torch.full((2000, 1000), current, dtype=D), seed=seed)
    value = loss(out[0] if isinstance(out, tuple) else out)
    if not grad:
        return float(value.detach()), float(m.sigma.detach())  # (the param as stored: 2.2 may have been rounded on the way)
    (g,) = torch.autograd.grad(value, [m.sigma])
    return float(value.detach()), float(g)


def _rate(s: torch.Tensor) -> torch.Tensor:
    return s.sum(0).mean() / 0.2  # Hz over 200 ms


def _variance(v: torch.Tensor) -> torch.Tensor:
    return ((v[500:] - v[500:].mean()) ** 2).mean()


def test_surrogate_gradient_of_a_rate_wrt_sigma_can_point_the_wrong_way():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "language.md").read_text(encoding="utf-8")
    assert re.search(r"\*\*Learning a noise amplitude\*\*.*?wrong way.*?same `seed=`", doc, re.S)
    rate, surrogate = _value_and_grad(SPIKING, 2.0, 1.8, 1, _rate)
    up, _ = _value_and_grad(SPIKING, 2.2, 1.8, 1, _rate, grad=False)
    down, _ = _value_and_grad(SPIKING, 1.8, 1.8, 1, _rate, grad=False)
    fd = (up - down) / 0.4
    assert rate > 10 and fd > 1.0 and surrogate < -10.0, (rate, fd, surrogate)


def test_reparametrization_gradient_of_a_smooth_loss_is_exact():
    value, g = _value_and_grad(SMOOTH, 2.0, 1.0, 3, _variance)
    up, s_up = _value_and_grad(SMOOTH, 2.2, 1.0, 3, _variance, grad=False)
    down, s_down = _value_and_grad(SMOOTH, 1.8, 1.0, 3, _variance, grad=False)
    # the variance is quadratic in sigma (the same draws scaled): the central difference is exact up
    # to the roundoff of sums of ~1e6 float64 terms (~1e-10 relative; 1e-8 leaves room)
    fd = (up - down) / (s_up - s_down)
    assert abs(g - fd) <= 1e-8 * abs(g) and abs(value - 4.0) < 0.5, (value, g, fd)
