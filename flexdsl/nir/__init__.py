"""NIR (the Neuromorphic Intermediate Representation) export and import.

    graph = flexdsl.nir.export(net, sample_input, dt=1e-4)   # a nir.NIRGraph (nir.write saves it)
    net2 = flexdsl.nir.load("net.nir", dt=1e-4)                # a torch.nn.Module of flexdsl neurons

Export decides a neuron's NIR primitive from its lowered equations, never from its name. The
step is inlined into one map from the previous states and the input to the next states; every
statement must be linear in the states and the input (the first that is not is the located
error), the spike a threshold on one state, the reset a constant. The map's coefficients give
the primitive's params for a discretisation (`euler` or `exact`), and the map that `load` runs
for those params (flexdsl's own lowering of the generated `.neuron` text) must equal the
model's, coefficient by coefficient.

Import makes one flexdsl neuron per NIR neuron node from generated `.neuron` text (kept as
`module.neuron_text`) and runs the graph layer by layer over whole sequences, so the neurons
use their multi-step kernels; a graph with cycles runs step by step, a recurrent edge carrying
the previous step's value. torch.fx traces the network for export and forward hooks record
the layer shapes; nirtorch is not used (its tracer records no shapes, its executor runs one
step at a time).

`docs/nir.md` states the conventions (time step, discretisation, threshold, reset, initial states).
"""

from __future__ import annotations

from .._sympy import load as sympy_ready
from ..errors import FlexDSLError

try:
    import numpy  # noqa: F401
except ImportError:  # numpy comes with the `nir` package
    raise FlexDSLError("flexdsl.nir needs numpy and the `nir` package, which are not installed", "<flexdsl.nir>",
                       hint="pip install 'flexdsl[nir]'") from None

sympy_ready()  # (before the modules below import it: one thread at a time)
from .exporter import export  # noqa: E402
from .fit import Exported, match  # noqa: E402
from .importer import load  # noqa: E402
from .linear import Affine, LinearStep, analyse, classify  # noqa: E402
from .network import NIRNetwork  # noqa: E402
from .primitives import DEFAULT_SURROGATE, METHODS, PRIMITIVES, Primitive, neuron_text  # noqa: E402

__all__ = ["export", "load", "match", "analyse", "classify", "neuron_text", "NIRNetwork", "PRIMITIVES", "Primitive",
           "Exported", "LinearStep", "Affine", "METHODS", "DEFAULT_SURROGATE"]
