"""Layers at run time: a `.layer` file, `flexdsl.feedforward` and `flexdsl.recurrent`, each built
from the layer level (`frontend/layer.py` checks, `ir/layer.py` plans, `store.pipeline.layer_plan`
caches).

    m = flexdsl.load("ff_lif.layer", hidden=256, in_features=700)   # a layer file (or a library layer)
    m = flexdsl.feedforward("lif", 700, 256)                         # Linear -> LIF, one module

A layer without a recurrent synapse is a `FeedForwardModule`: its synapses' products before the
neuron's time loop (one product over all steps each), then the neuron module's own call (its
kernels, its backward); the weights' gradients are products over all steps. A layer with one is a
`RecurrentModule` (`runtime/recurrent.py`), whose loop is a backend's layer scan made from the
plan's `scan`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import backends
from ..errors import FlexDSLError
from ..frontend import ast as A
from ..frontend.layer import CheckedLayer, CheckedSynapse, check_layer, neuron_ref
from ..frontend.parse import normalize, parse_layer
from ..ir.layer import LayerPlan
from ..library import resolve
from ..store.pipeline import layer_plan
from . import delays as dl
from .bits import synapse_product as _product
from .compiler import compile_model
from .layertext import (
    LayerAttrs,
    allocate,
    delay_words,
    feedforward_text,
    model_ref,
    module_names,
    plan,
    rule_words,
)
from .module import NeuronModule
from .options import make as make_options
from .plastic import PlasticSynapses
from .recurrent import RecurrentModule
from .sparse import SparseInputs


class FeedForwardModule(LayerAttrs, dl.DelayedSynapses, PlasticSynapses, SparseInputs, nn.Module):
    """A feed-forward layer: synapses from the layer's inputs into `size` neurons of one model.

    `m(x, ...)`: one tensor per layer input (`[T, *batch, size_of_input]`, step_mode "m"; without T
    in "s"), then the neuron's inputs no synapse feeds (`[T, *batch, size]`); returns the neuron's
    output(s), `[T, *batch, size]`. Parameters: one weight per synapse (by its name: `[size, n_pre]`
    dense, `[size]` one_to_one), one per bias, and the neuron's own (`m.neuron`); `m.reset()` clears
    the neuron's states. A synapse group with a plasticity rule (`rule stdp_additive [online]`) changes
    its weight at every call (`runtime/plastic.py`): `m.rules[W]` is the rule, the modulators it reads
    are keyword inputs (`m(x, reward=r)`). `sparse_input=True` (`m.sparse_input`): products of
    inputs that are mostly zeros are taken from their nonzero entries (`runtime/sparse.py`)."""

    def __init__(self, neuron: NeuronModule, layer: CheckedLayer, plan: LayerPlan, masks: Mapping[str, Any],
                 step_mode: str = "m", delays: Mapping[str, Any] | None = None,
                 rule_params: Mapping[str, Any] | None = None, sparse_input: bool = False) -> None:
        super().__init__()
        self.neuron = neuron
        self.__dict__["_layer"] = layer
        self.__dict__["_plan"] = plan
        self.__dict__["_kept"] = {}  # the delayed synapses' last steps (their state), by synapse
        delays = dict(delays or {})
        self.size = layer.size
        for s in layer.synapses:
            self.register_parameter(s.name, nn.Parameter(allocate(layer, layer.weight_shape(s), f"synapses `{s.name}`",
                                                                  s.pos)))
            if s.bias is not None:
                self.register_parameter(s.bias, nn.Parameter(allocate(layer, (layer.size,), f"bias `{s.bias}`", s.pos)))
            if s.connect == "mask":
                self.register_buffer(s.name + "_mask", _mask(layer, s, masks.get(s.name)))
        self._register_delays(delays)
        extra = [k for k in masks if k not in {s.name for s in layer.synapses if s.connect == "mask"}]
        if extra:
            raise layer.error(f"a mask was given for `{extra[0]}`, which is not a `connect mask` synapse of this "
                              "layer", layer.ast.pos, "masks={name: 0/1 tensor} for each synapse with `connect mask`")
        self.step_mode = step_mode
        self.reset_parameters()
        self._register_rules(layer, rule_params)
        self.sparse_input = sparse_input

    @property
    def layer_text(self) -> str:
        """The layer this module is, as a `.layer` file writes it (what `flexdsl.feedforward` made of its
        arguments, or the file it was loaded from)."""
        return self._layer.ast.source

    def _layer_error(self, msg: str) -> FlexDSLError:
        return self.__dict__["_layer"].error(msg, None)

    def reset_parameters(self) -> None:
        """`nn.Linear`'s initialisation per synapse (one_to_one: uniform in ±1); masked entries 0."""
        with torch.no_grad():
            for s in self._layer.synapses:
                w = getattr(self, s.name)
                if s.connect == "one_to_one":
                    w.uniform_(-1.0, 1.0)
                else:
                    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
                if s.connect == "mask":
                    w.mul_(getattr(self, s.name + "_mask").to(w.dtype))
                if s.bias is not None:
                    b = 1 / math.sqrt(s.pre_size)
                    getattr(self, s.bias).uniform_(-b, b)

    def reset(self) -> None:
        """The neuron's initial states, and zeros for the delayed synapses' history."""
        self._kept.clear()
        self._reset_rules()
        self.neuron.reset()

    def detach(self) -> None:
        """Cut the kept states (the neuron's, the delayed inputs') from the graph of earlier calls."""
        for k, v in self._kept.items():
            self._kept[k] = v.detach()
        self._detach_rules()
        self.neuron.detach()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_kept"] = {k: v.detach() for k, v in self._kept.items()}
        state["_changes"] = {k: v.detach() for k, v in self.__dict__.get("_changes", {}).items()}
        for k in [k for k in state if k.startswith("_sparse_") and k != "_sparse_input"]:
            del state[k]  # (sparse inputs' per-process caches: kernels, lists, the transposed weight)
        return state

    def forward(self, *xs: Any, seed: Any = None, generator: Any = None, **modulators: Any):
        layer = self._layer
        n_in = len(layer.inputs)
        if len(xs) != n_in + len(layer.direct):
            names = [n for n, _, _ in layer.inputs] + list(layer.direct)
            raise TypeError(f"layer `{layer.name}` takes {len(names)} input{'s' if len(names) != 1 else ''} "
                            f"({', '.join(names)}); got {len(xs)}")
        if self._has_rules():
            return self._plastic_forward(xs[:n_in], list(xs[n_in:]), modulators, seed, generator)
        if modulators:
            raise TypeError(f"layer `{layer.name}` got unexpected keyword input(s) {', '.join(modulators)} (it has no "
                            "plasticity rule reading modulators)")
        if self.sparse_input:
            out = self._sparse_forward(list(xs[:n_in]), list(xs[n_in:]), seed, generator)
            if out is not None:
                return out
        ports = self._ports(xs[:n_in])
        direct = iter(xs[n_in:])
        args = [ports[k] if k in ports else next(direct) for k in range(len(layer.neuron.inputs))]
        return self.neuron(*args, seed=seed, generator=generator)

    def current(self, *xs: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The synapses' currents into the neuron's inputs, without running the neuron: `m.current(x)`
        then `m.neuron(...)` is `m(x)`, with room between the two for what a network puts there
        (BatchNorm over the current, as DCLS-delays' networks do). One tensor per port the synapses
        feed (`[T, *batch, size]`, in the neuron's input order); the delayed synapses' kept steps advance."""
        layer = self._layer
        if len(xs) != len(layer.inputs):
            names = [n for n, _, _ in layer.inputs]
            raise TypeError(f"the synapses of layer `{layer.name}` take {len(names)} input"
                            f"{'s' if len(names) != 1 else ''} ({', '.join(names)}); got {len(xs)}")
        ports = self._ports(xs)
        out = tuple(ports[k] for k in sorted(ports))
        return out[0] if len(out) == 1 else out

    def _ports(self, xs: Sequence[Any]) -> dict[int, torch.Tensor]:
        layer = self._layer
        xs_in = [self._check_input(x, name, size, pos) for x, (name, size, pos) in zip(xs, layer.inputs)]
        ports: dict[int, torch.Tensor] = {}
        for s in layer.synapses:
            cur = self._current(s, xs_in[s.pre_index])
            ports[s.port_index] = cur if s.port_index not in ports else ports[s.port_index] + cur
        return ports

    def _current(self, s: CheckedSynapse, x: torch.Tensor) -> torch.Tensor:
        w = getattr(self, s.name)
        b = getattr(self, s.bias) if s.bias is not None else None
        if s.connect == "mask":
            w = w * getattr(self, s.name + "_mask").to(w.dtype)
        if s.delay_kind is None:
            return _product(x, w, b, s.connect == "one_to_one")
        single = self.step_mode == "s"
        one = s.connect == "one_to_one"
        cur = self._delayed(s, x.unsqueeze(0) if single else x, lambda xx, ww, bb: _product(xx, ww, bb, one), w, b)
        return cur[0] if single else cur

    def _check_input(self, x: Any, name: str, size: int, pos: A.Pos) -> torch.Tensor:
        layer = self._layer
        single = self.step_mode == "s"
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            what = type(x).__name__ if not isinstance(x, torch.Tensor) else f"a {x.dtype} tensor"
            raise layer.error(f"input `{name}` must be a floating-point torch.Tensor, not {what}", pos,
                              "e.g. torch.as_tensor(values, dtype=torch.float32)")
        if x.dim() < (1 if single else 2) or x.shape[-1] != size:
            want = "[*batch, " if single else "[T, *batch, "
            raise layer.error(f"input `{name}` has shape {tuple(x.shape)}; the layer takes {want}{size}]", pos,
                              "use step_mode='s' for one step at a time" if not single else None)
        for s in layer.synapses:
            if s.pre == name:
                w = getattr(self, s.name)
                if w.device != x.device or (w.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type)):
                    raise layer.error(f"input `{name}` is {x.dtype} on {x.device}, but the weights `{s.name}` are "
                                      f"{w.dtype} on {w.device}", s.pos, f"move one of them: m.to({x.dtype}) or "
                                      f"x.to({w.dtype}), m.to(x.device)")
        return x

    def as_sequential(self) -> nn.Sequential:
        """The layer as `nn.Linear` (its synapses' weights, masked, and bias) followed by its neuron
        (after a `Delay` of the inputs where its delays are axonal), the form NIR export writes; a layer of another form (several synapse groups, one_to_one, a
        neuron with further inputs) is a located error."""
        layer = self._layer
        syn = layer.synapses
        delay = self._axonal_delay(syn[0]) if syn and syn[0].delay_kind is not None else None
        if len(syn) != 1 or syn[0].connect == "one_to_one" or layer.direct:
            raise layer.error(f"layer `{layer.name}` has no nn.Linear form (one dense or masked synapse group into a "
                              "neuron of one input): NIR cannot express it", (syn[0] if syn else layer.ast).pos,
                              "export a network of nn.Linear and flexdsl neurons instead")
        s = syn[0]
        w = getattr(self, s.name).detach()
        if s.connect == "mask":
            w = w * getattr(self, s.name + "_mask").to(w.dtype)
        b = getattr(self, s.bias) if s.bias is not None else None
        lin = nn.Linear(s.pre_size, layer.size, bias=b is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(w)
            if b is not None:
                lin.bias.copy_(b.detach())
        parts = [(s.name, lin), ("neuron", self.neuron)]
        if delay is not None:
            parts.insert(0, (s.name + "_delay", delay))
        return nn.Sequential(OrderedDict(parts))

    def extra_repr(self) -> str:
        p = self.plan
        syn = ", ".join(f"{s.name}: {s.pre}->{self._layer.neuron.inputs[s.port].name} {s.connect}" for s in p.synapses)
        return f"{p.name}, size={p.size}, synapses=[{syn}], step_mode={self.step_mode!r}"


def _mask(layer: CheckedLayer, s: CheckedSynapse, mask: Any) -> torch.Tensor:
    shape = layer.weight_shape(s)
    if mask is None:
        raise layer.error(f"synapses `{s.name}` are `connect mask`, but no mask was given at load", s.connect_pos,
                          f"pass masks={{'{s.name}': m}}, m a 0/1 tensor of shape {shape}")
    try:
        m = torch.as_tensor(mask)
    except (TypeError, ValueError, RuntimeError):
        raise layer.error(f"the mask of `{s.name}` must be a tensor of 0/1 values, not {type(mask).__name__}",
                          s.connect_pos) from None
    if tuple(m.shape) != shape:
        raise layer.error(f"the mask of `{s.name}` has shape {tuple(m.shape)}; these synapses need {shape}",
                          s.connect_pos, "mask[i, j] = 1 keeps the weight from presynaptic j to neuron i")
    if m.dtype != torch.bool and (m.is_complex() or not bool(((m == 0) | (m == 1)).all())):
        raise layer.error(f"the mask of `{s.name}` must hold 0/1 (or bool) values", s.connect_pos)
    return m.to(torch.bool)


def _neuron(layer: A.Layer, detach_reset: bool, options: dict[str, Any], backend: str,
            params: dict[str, Any]) -> NeuronModule:
    """The layer's neuron, loaded (a `neuron "file"` relative to the layer file's folder)."""
    ref = neuron_ref(layer)
    target: str | Path = ref.ref
    if ref.is_path and not Path(ref.ref).is_absolute() and not layer.filename.startswith("<"):
        target = Path(layer.filename).parent / ref.ref
    try:
        resolve(target)
    except FlexDSLError as e:
        raise FlexDSLError(e.reason, layer.filename, ref.pos.line, ref.pos.column, layer.source, e.hint) from None
    opts = make_options(options.get("surrogate"), options.get("learnable"),
                        lambda: compile_model(target, detach_reset))
    return NeuronModule(compile_model(target, detach_reset, opts), params, "m", backend, False,
                        options.get("param_shapes"), False)


def load_layer(text: str, filename: str, *, hidden: int | None = None, in_features: Any = None,
               masks: Mapping[str, Any] | None = None, delays: Mapping[str, Any] | None = None, step_mode: str = "m",
               backend: str = "auto", detach_reset: bool = False, param_shapes: Any = None, surrogate: Any = None,
               learnable: Any = None, learning: str = "bptt", readout: Any = None, feedback: Any = "symmetric",
               rule_params: Mapping[str, Any] | None = None, sparse_input: bool = False, **params: Any) -> nn.Module:
    """A layer file's module (see the module docstring); `in_features`: an int (a layer with one
    input) or a dict of sizes by input name; `masks`: the 0/1 masks of `connect mask` synapses;
    `delays`: the steps of `delay axonal|synaptic|dendritic` synapses (integer tensors, by synapse);
    `learning="eprop"` (with `readout=`, `feedback=`): e-prop, for a recurrent layer;
    `sparse_input=True`: a feed-forward layer's products of sparse inputs from their nonzero entries."""
    text = normalize(text)
    layer = parse_layer(text, filename)
    hidden = _given_size(layer, "hidden", hidden)
    opts = {"surrogate": surrogate, "learnable": learnable, "param_shapes": param_shapes}
    neuron = _neuron(layer, detach_reset, opts, backend, params)
    sizes = _input_sizes(layer, in_features)
    checked = check_layer(layer, neuron.compiled.checked, hidden, sizes, _dt(neuron), reserved=module_names())
    lp = layer_plan(checked, neuron.compiled)
    if rule_params and not any(s.rule is not None for s in checked.synapses):
        raise checked.error(f"rule_params given, and no synapses of layer `{checked.name}` have a rule", None,
                            "add `rule NAME` to a synapse group, or leave rule_params out")
    if lp.scan is None:
        _no_eprop(learning, readout, feedback, lambda msg, hint: checked.error(msg, None, hint))
        return FeedForwardModule(neuron, checked, lp, dict(masks or {}), step_mode, delays, rule_params,
                                 sparse_input)
    if sparse_input is not False:
        raise checked.error(f"sparse_input={sparse_input!r} on recurrent layer `{checked.name}`: sparse inputs are "
                            "taken from their nonzero entries in feed-forward layers only", None,
                            "leave sparse_input out (the recurrent scan takes the input's products over all steps)")
    return from_layer(neuron, checked, lp, dict(masks or {}), step_mode, backend, delays,
                      {"learning": learning, "readout": readout, "feedback": feedback})


def describe(model: str | Path) -> tuple[CheckedLayer, LayerPlan]:
    """A layer file checked and planned without building its module (`flexdsl check`, `flexdsl
    show`): sizes it leaves to the load are taken as 1 here (the checks that need them pass)."""
    text, filename = resolve(model)
    layer = parse_layer(normalize(text), filename)
    neuron = _neuron(layer, False, {}, backends.REFERENCE, {})
    written = {d.name: d.size for d in layer.of(A.LayerInput) if d.size is not None}
    o2o = [written[s.pre] for s in layer.of(A.Synapses) if s.connect == "one_to_one" and s.pre in written]
    size = None if layer.of(A.LayerSize) else (o2o[0] if o2o else 1)  # (one_to_one from a written size: that size)
    sizes = {d.name: 1 for d in layer.of(A.LayerInput) if d.size is None}
    if size is None:  # (a one_to_one input of unwritten size takes the layer's)
        n = layer.of(A.LayerSize)[0].value
        sizes = dict.fromkeys(sizes, n)
    checked = check_layer(layer, neuron.compiled.checked, size, sizes, _dt(neuron), reserved=module_names())
    if checked.recurrent is not None:
        recurrent_form(checked)
    from .plastic import loaded_rule

    for s in checked.synapses:  # (a rule's file found, checked, and fit for this neuron: as a load finds it)
        if s.rule is not None:
            loaded_rule(checked, s, {}, None, neuron)
    return checked, layer_plan(checked, neuron.compiled)


def _dt(neuron: NeuronModule) -> float | None:
    """The neuron's `dt` in its base time unit (a delay in time units is a number of these steps),
    None where the model has no `dt` param or it is not one number."""
    if not any(p.name == "dt" for p in neuron.compiled.checked.params):
        return None
    v = neuron.param_values().get("dt")
    if isinstance(v, torch.Tensor):
        v = float(v) if v.numel() == 1 else None
    return float(v) if isinstance(v, int | float) else None


def _given_size(layer: A.Layer, what: str, v: Any) -> int | None:
    """A size given at load (`hidden=`, an input's): a positive int, or a located error."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        return v
    raise FlexDSLError(f"{what}={v!r}: a layer's sizes are positive ints", layer.filename, layer.pos.line,
                       layer.pos.column, layer.source, f"e.g. {what}=256" + (" (int(...) of a tensor or a float)"
                                                                            if not isinstance(v, int) else ""))


def _input_sizes(layer: A.Layer, in_features: Any) -> dict[str, int] | None:
    if isinstance(in_features, Mapping):
        return {k: _given_size(layer, f"in_features[{k!r}]", v) for k, v in in_features.items()}
    if in_features is None:
        return None
    decls = layer.of(A.LayerInput)
    if len(decls) != 1 or isinstance(in_features, bool) or not isinstance(in_features, int):
        raise FlexDSLError(f"in_features={in_features!r}: give an int for a layer with one input, else a dict of "
                           "sizes by input name", layer.filename, layer.pos.line, layer.pos.column, layer.source,
                           "e.g. in_features={'" + (decls[0].name if decls else "x") + "': 700}")
    return {decls[0].name: _given_size(layer, "in_features", in_features)}


def feedforward(model: str | Path | NeuronModule, in_features: int, hidden: int, *, connectivity: str = "dense",
                mask: Any = None, port: str | None = None, bias: bool = True, step_mode: str = "m",
                backend: str = "auto", detach_reset: bool = False, param_shapes: Any = None, surrogate: Any = None,
                learnable: Any = None, delay: Any = None, max_delay: Any = None, learnable_delays: Any = False,
                delays: Any = None, learning: str = "bptt", rule: Any = None, plasticity: str = "window",
                rule_params: Mapping[str, Any] | None = None, sparse_input: bool = False,
                **params: Any) -> FeedForwardModule:
    """`Linear(in_features, hidden)` into `hidden` neurons of `model`, as one module (see
    `FeedForwardModule`): the weight `W` (`[hidden, in_features]`, times `mask` for
    connectivity="mask"; `[hidden]` one_to_one) and `bias` feed the model's input `port`."""
    readout, feedback = params.pop("readout", None), params.pop("feedback", "symmetric")  # (e-prop's: refused)
    neuron = _loaded_neuron(model, backend, detach_reset, param_shapes, surrogate, learnable, params)
    ck = neuron.compiled.checked
    _no_eprop(learning, readout, feedback, lambda msg, hint: neuron._error(msg, ck.ast.pos, hint))
    for what, v in (("in_features", in_features), ("hidden", hidden)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise neuron._error(f"{what} must be a positive int, not {v!r}", ck.ast.pos)
    names = [i.name for i in ck.inputs]
    port = port if port is not None else (names[0] if names else "x")
    connect = {"all": "dense"}.get(connectivity, connectivity) if isinstance(connectivity, str) else repr(connectivity)
    text = feedforward_text(model_ref(neuron), [*names, *(p.name for p in ck.params), *(s.name for s in ck.states)],
                            in_features, hidden, connect, port, bias, delay_words(delay, max_delay, learnable_delays),
                            rule_words(rule, plasticity, lambda msg, hint: neuron._error(msg, ck.ast.pos, hint),
                                       bool(rule_params)))
    checked, lp = plan(text, "<flexdsl.feedforward>", neuron)
    masks = {"W": mask} if mask is not None else {}
    if isinstance(delays, Mapping):  # (by synapse name, as a .layer load takes them: this layer's one is `W`)
        delays = dict(delays)
    elif delays is not None:
        delays = {"W": delays}
    return FeedForwardModule(neuron, checked, lp, masks, step_mode, delays,
                             rule_params, sparse_input)


_DELAYS_HINT = ("write the recurrent layer as a .layer file (a `delay` line on its synapses: `delay 3`, "
                "`delay synaptic max 24 learnable`), or use flexdsl.feedforward")
_RULES_HINT = ("plasticity rules run on a feed-forward layer's dense or masked synapses only (a recurrent layer's, "
               "built from arguments or a .layer file, are refused): use flexdsl.feedforward(..., rule=...)")
# flexdsl.feedforward's options a recurrent layer built from arguments refuses -> where the option is served
_FEEDFORWARD_ONLY = {
    "sparse_input": "sparse inputs are taken from their nonzero entries in feed-forward layers only (a .layer "
                    "recurrent layer refuses it too): leave sparse_input out, or use flexdsl.feedforward",
    "rule": _RULES_HINT, "plasticity": _RULES_HINT, "rule_params": _RULES_HINT,
    "delay": _DELAYS_HINT, "max_delay": _DELAYS_HINT, "learnable_delays": _DELAYS_HINT, "delays": _DELAYS_HINT}


def recurrent(model: str | Path | NeuronModule, in_features: int | None, hidden: int, *,
              connectivity: str = "all", mask: Any = None, source: str | None = None, port: str | None = None,
              bias: bool = True, step_mode: str = "m", backend: str = "auto", detach_reset: bool = False,
              param_shapes: Mapping[str, Sequence[int]] | None = None, surrogate: Any = None, learnable: Any = None,
              learning: str = "bptt", readout: Any = None, feedback: Any = "symmetric", **params: Any
              ) -> RecurrentModule:
    """A recurrent layer of `hidden` neurons of `model` (see `RecurrentModule`)."""
    ff = sorted(set(params) & set(_FEEDFORWARD_ONLY))
    if ff:
        raise FlexDSLError(f"`{ff[0]}` is an option of flexdsl.feedforward, not of a recurrent layer built from "
                           "arguments", "<flexdsl.recurrent>", hint=_FEEDFORWARD_ONLY[ff[0]])
    neuron = _loaded_neuron(model, backend, detach_reset, param_shapes, surrogate, learnable, params)
    return RecurrentModule(neuron, in_features, hidden, connectivity, mask, source, port, bias, step_mode, backend,
                           learning=learning, readout=readout, feedback=feedback)


def _loaded_neuron(model: str | Path | NeuronModule, backend: str, detach_reset: bool, param_shapes: Any,
                   surrogate: Any, learnable: Any, params: dict[str, Any]) -> NeuronModule:
    """A layer's neuron: the module given, or the model loaded with the layer's options (a layer
    runs no per-neuron option: store_state_seqs and check_finite are refused, located)."""
    if isinstance(model, NeuronModule):
        if params or param_shapes or detach_reset or surrogate is not None or learnable is not None:
            raise model._error("params, param_shapes, detach_reset, surrogate and learnable are set when the "
                               "neuron is loaded; here the neuron is given loaded", None,
                               "pass the model's name or path instead, or load it with these options")
        return model
    for name in ("store_state_seqs", "check_finite"):
        if name in params:
            c = compile_model(model, detach_reset)
            raise FlexDSLError(f"`{name}` is not available on layers", c.filename,
                               hint="load the neuron with flexdsl.load for it")
    opts = make_options(surrogate, learnable, lambda: compile_model(model, detach_reset))
    return NeuronModule(compile_model(model, detach_reset, opts), params, "m", backend, False, param_shapes, False)


def recurrent_form(layer: CheckedLayer) -> tuple[CheckedSynapse, list[CheckedSynapse]]:
    """(the recurrent synapse, [the input's]) of a recurrent layer in the form a `RecurrentModule` runs,
    or a located error (`flexdsl check` and the load say the same)."""
    rec = layer.recurrent
    assert rec is not None
    ff = [s for s in layer.synapses if not s.recurrent]
    form = ("a recurrent layer runs in this form: `synapses A from <input> to <port>` (dense, optionally a bias) and "
            "`synapses B from <output> to <port>` (dense, one_to_one or mask)")
    if len(ff) != 1 or ff[0].port != rec.port or ff[0].connect != "dense":
        bad = next((s for s in ff if s.port != rec.port or s.connect != "dense"), ff[1] if len(ff) > 1 else None)
        raise layer.error("this recurrent layer's feed-forward synapses are not one dense group into the port of "
                          f"`{rec.name}`", bad.pos if bad is not None else layer.ast.pos, form)
    if ff[0].rule is not None:  # (the recurrent scan runs no rule: it would never change the weights)
        raise layer.error(f"synapses `{ff[0].name}` have a plasticity rule, in a layer with a recurrent synapse: "
                          "plasticity rules run on feed-forward layers", ff[0].rule_pos,
                          "drop the rule line, or the recurrent synapse (a feed-forward layer)")
    roles = {"W_in": ff[0].name, "W_rec": rec.name, "bias": ff[0].bias}
    for role, name in roles.items():
        if name in roles and name != role:
            pos = rec.pos if name == rec.name else ff[0].pos
            raise layer.error(f"`{name}` names the layer's {role} here, but `{name}` is what the module calls another "
                              "of its weights", pos, "rename it (W_in: the input's weights, W_rec: the recurrent ones, "
                              "bias: the input's bias)")
    return rec, ff


def from_layer(neuron: NeuronModule, layer: CheckedLayer, lp: LayerPlan, masks: dict[str, Any], step_mode: str,
               backend: str, delays: Mapping[str, Any] | None = None, learning: Mapping[str, Any] | None = None
               ) -> RecurrentModule:
    """The `RecurrentModule` of a recurrent layer file: one dense synapse group from the layer's
    input and one from an output of the neuron into the same port (any names: the module also
    answers to `W_in`, `W_rec` and `bias`, the names `flexdsl.recurrent` gives them)."""
    rec, ff = recurrent_form(layer)
    extra = [k for k in masks if k != rec.name or rec.connect != "mask"]
    if extra:
        raise layer.error(f"a mask was given for `{extra[0]}`, which is not a `connect mask` synapse of this layer",
                          layer.ast.pos, f"masks={{'{rec.name}': m}} for `connect mask` recurrent synapses")
    if rec.connect == "mask" and rec.name not in masks:
        raise layer.error(f"synapses `{rec.name}` are `connect mask`, but no mask was given at load", rec.connect_pos,
                          f"pass masks={{'{rec.name}': m}}, m a 0/1 tensor of shape ({layer.size}, {layer.size})")
    conn = "one_to_one" if rec.connect == "one_to_one" else "all"
    return RecurrentModule(neuron, ff[0].pre_size, layer.size, conn, masks.get(rec.name), rec.pre, rec.port,
                           ff[0].bias is not None, step_mode, backend, layer.ast.source, (layer, lp), dict(delays or {}),
                           **dict(learning or {}))


def _no_eprop(learning: Any, readout: Any, feedback: Any, error) -> None:
    """A feed-forward layer learns by backpropagation: `learning="eprop"` (and its options) is a located error."""
    if learning == "bptt" and readout is None and isinstance(feedback, str) and feedback == "symmetric":
        return
    if learning not in ("bptt", "eprop"):
        raise error(f"learning must be 'bptt' or 'eprop', not {learning!r}", None)
    raise error("e-prop learns recurrent layers (a layer whose neurons feed back into them); this layer has no "
                "recurrent synapse", "its BPTT gradient has no recurrence to cut: train it with learning='bptt' "
                "(the default), or add a recurrent synapse group (flexdsl.recurrent)")


__all__ = ["FeedForwardModule", "describe", "feedforward", "from_layer", "load_layer", "recurrent", "recurrent_form"]
