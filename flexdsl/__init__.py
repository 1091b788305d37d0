"""flexdsl: spiking neurons from equations.

    m = flexdsl.load("lif")            # a trainable torch.nn.Module
    r = flexdsl.recurrent("alif", in_features=700, hidden=512)   # a recurrent layer, compiled time loop
    f = flexdsl.feedforward("lif", 700, 256)   # Linear -> LIF as one module; flexdsl.load("x.layer") for a layer file
    c = flexdsl.conv_layer("lif", 64, 128, 3, padding=1)   # Conv2d -> BN -> LIF, keeping little for backward
    flexdsl.save_spikes_as_bits(net)   # an existing network's products save their 0/1 inputs as bits
    flexdsl.save_spikes_as_bits(net, recompute="product")   # ... and recompute normalizations and products
    c = flexdsl.compile("lif")         # generated sources and sympy equations
    flexdsl.nir.export(net, x, dt=1e-4), flexdsl.nir.load("net.nir")   # NIR interchange (flexdsl[nir])

torch is imported on first use of `load`/`loads`/`NeuronModule`, so `flexdsl check` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import docs as _docs  # noqa: F401 - the notebook display of models and modules (light: no torch, no sympy)
from .errors import FlexDSLError
from .library import library, rules

if TYPE_CHECKING:
    from . import nir
    from .api import compile, conv_layer, feedforward, load, load_rule, loads, recurrent
    from .runtime.compiler import Compiled
    from .runtime.finite import NonFiniteError
    from .runtime.layer import FeedForwardModule
    from .runtime.module import NeuronModule
    from .runtime.recurrent import RecurrentModule
    from .runtime.rewrite import memory_report, save_spikes_as_bits
    from .runtime.rule import Rule

from ._version import __version__

__all__ = ["load", "loads", "load_rule", "rules", "Rule", "recurrent", "feedforward", "conv_layer", "FeedForwardModule", "compile", "library", "FlexDSLError", "NonFiniteError", "NeuronModule",
           "RecurrentModule", "Compiled", "nir", "save_spikes_as_bits", "memory_report", "__version__"]

_LAZY = {"load": "api", "loads": "api", "load_rule": "api", "Rule": "runtime.rule", "recurrent": "api", "feedforward": "api", "conv_layer": "api", "compile": "api",
         "FeedForwardModule": "runtime.layer", "Compiled": "runtime.compiler",
         "NeuronModule": "runtime.module", "RecurrentModule": "runtime.recurrent", "NonFiniteError": "runtime.finite",
         "save_spikes_as_bits": "runtime.rewrite", "memory_report": "runtime.rewrite"}


def __getattr__(name: str) -> Any:
    if name == "nir":  # the submodule flexdsl.nir (imports torch, sympy and the `nir` package on use)
        import importlib

        return importlib.import_module(".nir", __name__)
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flexdsl' has no attribute {name!r}")
