"""flexdsl: spiking neurons from equations.

    m = flexdsl.load("lif")            # a trainable torch.nn.Module
    c = flexdsl.compile("lif")         # generated sources and sympy equations
"""

from __future__ import annotations

from .api import compile, library, load, loads
from .compiler import Compiled
from .errors import FlexDSLError
from .module import NeuronModule

__version__ = "0.1.0"

__all__ = ["load", "loads", "compile", "library", "FlexDSLError", "NeuronModule", "Compiled", "__version__"]
