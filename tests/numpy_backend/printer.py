"""The NumPy backend's printer: a `BasePrinter` with its own `SPELL` table (every built-in
function), the draws of a noisy model spelled as calls of the step's `_noise`."""

from __future__ import annotations

from flexdsl.backends.printer import BasePrinter

PROLOGUE = """import math

import numpy as np


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _exprel(z):
    z = np.asarray(z, dtype=np.float64)
    zb = np.where(z == 0, 1.0, z)
    return np.where(z == 0, 1.0, np.expm1(zb) / zb)


def _exprel_d(z):
    z = np.asarray(z, dtype=np.float64)
    small = np.abs(z) < 1.0
    zs = np.where(small, z, 0.0)
    series = np.zeros_like(z)
    for k in range(19, -1, -1):
        series = series * zs + (k + 1) / math.factorial(k + 2)
    zb = np.where(small, 1.0, z)
    return np.where(small, series, ((zb - 1.0) * np.exp(zb) + 1.0) / (zb * zb))
"""


class NumpyPrinter(BasePrinter):
    TARGET = "numpy"
    SPELL = {
        "exp": "np.exp({0})", "log": "np.log({0})", "sqrt": "np.sqrt({0})", "abs": "np.abs({0})",
        "sin": "np.sin({0})", "cos": "np.cos({0})", "tanh": "np.tanh({0})", "sigmoid": "_sigmoid({0})",
        "relu": "np.maximum({0}, 0.0)", "min": "np.minimum({0}, {1})", "max": "np.maximum({0}, {1})",
        "clip": "np.clip({0}, {1}, {2})", "where": "np.where({0}, {1}, {2})",
        "heaviside": "np.where({0} >= 0, 1.0, 0.0)", "spike_ge": "np.where({0} >= 0, 1.0, 0.0)",
        "spike_gt": "np.where({0} > 0, 1.0, 0.0)", "detach": "{0}", "sign": "np.sign({0})",
        "exprel": "_exprel({0})", "exprel_d": "_exprel_d({0})",
    }

    # the draws of a noisy model: `_noise` is the step's draws (`noise.NumpyDraws`), the step's last argument
    def _print_Randn(self, e) -> str:
        return f"_noise.randn({int(e.args[0])})"

    def _print_Rand(self, e) -> str:
        return f"_noise.rand({int(e.args[0])})"
