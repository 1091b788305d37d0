"""`flexdsl.save_spikes_as_bits(net)`: an existing network (a `Sequential`, SpikingJelly's zoo, any
module tree) rewritten in place so that its synaptic products save their 0/1 inputs as bits for the
weights' gradients (`bits.py`): every `nn.Linear` and `nn.Conv1d/2d/3d` (SpikingJelly's `layer.Linear`,
`layer.Conv2d`... are these) gets a class of its own that computes the same product and saves a 0/1
input packed; the spikes of SpikingJelly's IF/LIF/PLIF/QIF/EIF/Izhikevich nodes (while their surrogate
is SpikingJelly's, in spiking mode: asked at each call) and of flexdsl neurons are known to be 0/1 (no
check of the values), and so are max-pools and flattenings of them. Parameters, buffers, hooks and the module tree are untouched (an
optimizer made before keeps working); outputs and gradients are those of the network before.
Anything else is left as it is; the returned line says what was changed and what was not.

The network's forward is also a keep session (`recompute.py`): other saved spikes (a max-pool's
input) are kept as bits, a max-pool's indices made again from it, an unmarked product input checked
for 0/1 on the device without a host sync; `recompute="norm"`/`"product"` leave normalizations' (and
products') outputs out of what is saved and make them again in the backward, bit for bit.

    print(flexdsl.save_spikes_as_bits(net))
    print(flexdsl.save_spikes_as_bits(net, recompute="norm")); ...; print(flexdsl.memory_report(net))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import FlexDSLError
from . import recompute as _recompute
from .bits import known_binary, mark_binary, spike_conv, spike_linear

# SpikingJelly 2.0.0's nodes whose output is their surrogate's forward of the membrane, and the surrogates
# whose forward in spiking mode (`spiking=True`) is 0/1 (a Heaviside step; PoissonPass: a Bernoulli draw)
_SPIKING_JELLY_NODES = ("IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode")
_SURROGATES_MODULE = "spikingjelly.activation_based.surrogate"
_STEP_SURROGATES = frozenset((
    "ATan", "DeterministicPass", "Erf", "FakeNumericalGradient", "LeakyKReLU", "LogTailedReLU", "NonzeroSignLogAbs",
    "PiecewiseExp", "PiecewiseLeakyReLU", "PiecewiseQuadratic", "PoissonPass", "QPseudoSpike", "Rect", "S2NN",
    "Sigmoid", "SoftSign", "SquarewaveFourierSeries", "SuperSpike"))
_CLASSES: dict[type, type] = {}


def _linear_forward(self: nn.Linear, x: Any) -> Any:
    return spike_linear(x, self.weight, self.bias, self.__dict__)


def _conv_forward(self: nn.modules.conv._ConvNd, x: Any, weight: Any, bias: Any) -> Any:
    if self.padding_mode != "zeros":  # (as nn.Conv*d: the padding applied first)
        x = nn.functional.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
        return spike_conv(x, weight, bias, self.stride, 0, self.dilation, self.groups, self.__dict__)
    return spike_conv(x, weight, bias, self.stride, self.padding, self.dilation, self.groups, self.__dict__)


_PREFIX = "BitsOf_"  # (a Bits class's name for pickle: this, then its class's dotted path encoded)


def _encode(path: str) -> str:
    """A dotted path as one attribute name, reversibly: `_` as `_u`, `.` as `_d` (`__main__.MyLinear`
    -> `_u_umain_u_u_dMyLinear`)."""
    return path.replace("_", "_u").replace(".", "_d")


def _decode(name: str) -> str:
    out, i = [], 0
    while i < len(name):
        if name[i] == "_" and i + 1 < len(name) and name[i + 1] in "ud":
            out.append("_" if name[i + 1] == "u" else ".")
            i += 2
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def _bits_class(cls: type) -> type:
    """`cls` with its product saving a 0/1 input as bits (one class per original class: `BitsLinear`,
    found by pickle as `BitsOf_<module.class encoded>` of this module, so that a rewritten network
    pickles and loads back in another process: `__getattr__` below makes the class again)."""
    c = _CLASSES.get(cls)
    if c is None:
        attrs = {"forward": _linear_forward} if issubclass(cls, nn.Linear) else {"_conv_forward": _conv_forward}
        name = _PREFIX + _encode(f"{cls.__module__}.{cls.__qualname__}")  # (what pickle looks up)
        c = _CLASSES[cls] = type(f"Bits{cls.__name__}", (cls,), {**attrs, "__module__": __name__, "__qualname__": name})
    return c


def _class_at(parts: list[str]) -> Any:
    """The object at a dotted path split in `parts`: the longest importable module, then attributes."""
    import importlib

    for k in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    return None


def __getattr__(name: str) -> type:
    """The Bits class a pickled network names (`BitsOf_torch_dnn_dmodules_dlinear_dLinear`; also the
    names of earlier versions, `Bits__torch__nn__modules__linear__Linear`, dots as `__`)."""
    obj = None
    if name.startswith(_PREFIX):
        obj = _class_at(_decode(name[len(_PREFIX):]).split("."))
    elif name.startswith("Bits__"):
        obj = _class_at(name[len("Bits__"):].split("__"))
    if isinstance(obj, type) and issubclass(obj, nn.Linear | nn.modules.conv._ConvNd):
        return _bits_class(obj)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _own_output() -> bool:
    """Whether a forward hook registered first (`prepend=True`) sees the module's own output: no
    global forward hook (`nn.modules.module.register_module_forward_hook`, which runs before a
    module's own hooks and may have returned another tensor)."""
    return not nn.modules.module._global_forward_hooks


def _spikes(node: nn.Module) -> bool:
    """Whether a SpikingJelly node's output is 0/1 now: its surrogate is one of SpikingJelly's own
    step surrogates (that class, not a subclass of it) in spiking mode. Asked at each call: the mode
    (`set_spiking_mode(False)`: the surrogate's graded value) and the surrogate may change any time;
    a surrogate of another kind (`nn.Sigmoid()`, a function) is never taken for spikes."""
    sg = getattr(node, "surrogate_function", None)
    cls = type(sg)
    return cls.__module__ == _SURROGATES_MODULE and cls.__name__ in _STEP_SURROGATES and sg.spiking is True


def _mark_output(module: nn.Module, inputs: Any, out: Any) -> None:
    """A SpikingJelly node's spikes are 0/1 (where `_spikes` says so). Registered first among the
    node's hooks, this sees what its forward returned: a user's hook that returns another tensor
    (graded, `out * 2`) gives an unmarked one, and one that writes `out` in place changes its version
    (the mark then lapses)."""
    if hasattr(out, "_version") and _own_output() and _spikes(module):
        mark_binary(out)


def _pass_on(module: nn.Module, inputs: Any, out: Any) -> None:
    """A max-pool or flatten of 0/1 values is 0/1 (registered first, as `_mark_output`)."""
    if inputs and known_binary(inputs[0]) and hasattr(out, "_version") and _own_output():
        mark_binary(out)


_KEEPS_BINARY = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
                 nn.AdaptiveMaxPool3d, nn.Flatten, nn.Identity)


def _rewritable(m: nn.Module) -> bool:
    """A Linear or convolution whose product is torch's own (a subclass that computes it otherwise is
    left alone: SpikingJelly's layers only reshape around it)."""
    if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
        return False  # (a lazy layer becomes its class at its first forward: rewrite after that)
    if isinstance(m, nn.Linear):
        return type(m).forward is nn.Linear.forward
    return (isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d)
            and type(m)._conv_forward in (nn.Conv1d._conv_forward, nn.Conv2d._conv_forward, nn.Conv3d._conv_forward))


def save_spikes_as_bits(net: nn.Module, recompute: str | None = None) -> str:
    """Rewrite `net` in place (see the module doc); returns one line: what was changed, what not.

    During `net`'s forward, any other saved tensor known to be 0/1 (spikes a max-pool or another
    operation keeps) is kept as bits too, and `recompute` trades time for memory
    (`runtime/recompute.py`): `"norm"` leaves a batch normalization's output (the next neuron's
    input) out of what is saved and runs the normalization again in the backward; `"product"` also
    leaves out a product's output whose input is kept as bits (the product runs again from the
    bits). Gradients are the same either way, bit for bit. `flexdsl.memory_report(net)` says what
    the last forward kept."""
    if not isinstance(net, nn.Module):
        raise FlexDSLError(f"save_spikes_as_bits takes a torch.nn.Module, not {type(net).__name__}",
                           "<save_spikes_as_bits>", hint="flexdsl.save_spikes_as_bits(net) with net an nn.Module")
    scripted = [name or type(m).__name__ for name, m in net.named_modules() if isinstance(m, torch.jit.ScriptModule)]
    if scripted:  # (TorchScript runs its own code: no hooks, no class of ours)
        return (f"flexdsl.save_spikes_as_bits: nothing changed; left as it is: {', '.join(scripted[:3])} "
                "(TorchScript; rewrite the network before torch.jit.script)")
    if recompute not in _recompute.MODES:
        call = f"save_spikes_as_bits(net, recompute={recompute!r})"
        raise FlexDSLError(f"recompute={recompute!r} is not one of None, 'norm', 'product'", "<save_spikes_as_bits>",
                           1, call.index("recompute=") + 1, call,
                           hint="'norm': normalizations run again in the backward (little time, a neuron's input "
                                "less per layer); 'product': products too (one more product per layer, the "
                                "layer's activations as bits)")
    products, nodes, left, graded = [], 0, [], []
    for name, m in net.named_modules():
        cls = type(m)
        if cls in _CLASSES.values():
            products.append(name or cls.__name__)
        elif _rewritable(m):
            m.__class__ = _bits_class(cls)
            products.append(name or cls.__name__)
        elif cls.__name__ in _SPIKING_JELLY_NODES and cls.__module__.startswith("spikingjelly"):
            if not getattr(m, "_flexdsl_marks", False):  # (the hook asks at each call whether it spikes 0/1)
                m.register_forward_hook(_mark_output, prepend=True)  # (before any user's hook: see _mark_output)
                m._flexdsl_marks = True
            if _spikes(m):
                nodes += 1
            else:
                graded.append(name or cls.__name__)  # (`spiking=False`, or a surrogate not SpikingJelly's step)
        elif isinstance(m, _KEEPS_BINARY) and not getattr(m, "_flexdsl_marks", False):
            m.register_forward_hook(_pass_on, prepend=True)  # (SpikingJelly's pooling and Flatten layers are these)
            m._flexdsl_marks = True
        elif isinstance(m, nn.Linear | nn.modules.conv._ConvNd | nn.Bilinear | nn.RNNBase):
            left.append(name or cls.__name__)
    norms = _recompute.install(net, recompute)
    line = (f"flexdsl.save_spikes_as_bits: {len(products)} product(s) save their 0/1 inputs as bits"
            + (f" ({', '.join(products[:6])}{', ...' if len(products) > 6 else ''})" if products else "")
            + f"; {nodes} SpikingJelly node(s) known to spike 0/1")
    if recompute == "norm":
        line += f"; {norms} normalization(s) run again in the backward"
    elif recompute == "product":
        line += f"; {norms} normalization(s) and the products before them run again in the backward"
    if graded:
        line += ("; not marked 0/1 while their surrogate is not SpikingJelly's in spiking mode (graded output): "
                 f"{', '.join(graded[:6])}{', ...' if len(graded) > 6 else ''}")
    if left:
        line += f"; left as they are: {', '.join(left[:6])}{', ...' if len(left) > 6 else ''} (their product is not torch's Linear or Conv1d/2d/3d, or a lazy layer before its first forward)"
    return line


def memory_report(net: nn.Module) -> _recompute.Report | None:
    """What the last forward of a network rewritten by `save_spikes_as_bits` saved for its backward:
    bytes kept as they are, 0/1 values kept as bits, tensors left out and recomputed (None before
    its first forward)."""
    if not isinstance(net, nn.Module):
        raise FlexDSLError(f"memory_report takes a torch.nn.Module, not {type(net).__name__}", "<memory_report>",
                           hint="the network given to flexdsl.save_spikes_as_bits")
    return _recompute.report(net)


__all__ = ["memory_report", "save_spikes_as_bits"]
