"""`export`: a `nir.NIRGraph` of a network of torch layers and flexdsl neurons. torch.fx traces the
network, forward hooks record the layer shapes; each flexdsl neuron is matched to its primitive
from its equations (`fit.match`)."""

from __future__ import annotations

import copy
import operator
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..errors import FlexDSLError, did_you_mean
from ..runtime.delays import Delay
from ..runtime.layer import FeedForwardModule
from ..runtime.module import NeuronModule
from ..runtime.recurrent import RecurrentModule
from .fit import Exported, _show, match
from .importer import _Scale
from .linear import analyse, classify
from .network import NIRNetwork
from .primitives import _INITIAL, _NETWORK, METHODS, PRIMITIVES, _check_dt, _nir

if TYPE_CHECKING:
    import nir as nir_t


# ============================================================================ export
_SKIP = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Flatten, nn.AvgPool2d, Delay)
_EXPORTABLE = ("flexdsl neurons and recurrent layers, torch.nn.Linear, Conv1d, Conv2d, Flatten, AvgPool2d, "
               "Identity and Dropout, and `+` of two branches")


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (NeuronModule, RecurrentModule, *_LAYERS, *_SKIP)) or super().is_leaf_module(m, qualname)


def _net_error(msg: str, hint: str | None = None) -> FlexDSLError:
    return FlexDSLError(msg, _NETWORK, hint=hint)


def export(net: nn.Module, sample_input: torch.Tensor, dt: float | None = None, *, method: str = "auto",
           path: str | Path | None = None) -> nir_t.NIRGraph:
    """A `nir.NIRGraph` of a network of torch layers and flexdsl neurons (or of one neuron).

    `sample_input` is one input of the network (`[T, batch, *shape]`, or `[batch, *shape]`
    when the neurons use step_mode "s"); it gives the layers' shapes (the network runs once on it
    from its initial states); the graph is made from the params and weights alone, and the states
    earlier calls left (of any batch size) are neither used nor changed. `dt` is the length of one step in NIR's (continuous) time unit.
    `method` is the discretisation the neurons' steps are read as: "euler", "exact", or "auto"
    (a neuron's own ODE method where it has one, else euler; the other where that does not
    fit). With `path`, the graph is also written there (`nir.write`).
    """
    nir = _nir()
    if dt is None:
        raise FlexDSLError("dt is needed: NIR is continuous time", "<flexdsl.nir>",
                           hint="pass dt=..., the length of one flexdsl step in NIR's time unit (e.g. dt=1e-3 for "
                           "1 ms steps in seconds)")
    dt = _check_dt(dt)
    if method not in ("auto", *METHODS):
        raise FlexDSLError(f"method must be 'auto', 'euler' or 'exact', not {method!r}", "<flexdsl.nir>",
                           hint=did_you_mean(str(method), ["auto", *METHODS]))
    if not isinstance(net, nn.Module):
        raise _net_error(f"export takes a torch.nn.Module, not {type(net).__name__}")
    if not isinstance(sample_input, torch.Tensor):
        raise _net_error(f"sample_input must be a tensor, not {type(sample_input).__name__}")
    if isinstance(net, NIRNetwork):
        return _export_network(nir, net, sample_input, dt, method, path)
    net = _expand_layers(net)
    root = net
    if isinstance(net, (NeuronModule, RecurrentModule, *_LAYERS)):
        name = (net.compiled.name.lower() if isinstance(net, NeuronModule) else
                net.neuron.compiled.name.lower() if isinstance(net, RecurrentModule) else type(net).__name__.lower())
        root = nn.Sequential(OrderedDict([(name, net)]))
    inner = {id(m.neuron) for m in root.modules() if isinstance(m, RecurrentModule)}
    modes = {m.step_mode for m in root.modules() if isinstance(m, NeuronModule | RecurrentModule) and id(m) not in inner}
    if len(modes) > 1:
        raise _net_error("the network mixes step modes 's' and 'm'", "give every flexdsl neuron the same step_mode")
    lead = (1 if modes == {"s"} else 2) if modes else min(2, sample_input.dim() - 1)
    if sample_input.dim() <= lead:
        raise _net_error(f"sample_input has shape {tuple(sample_input.shape)}, but the network takes "
                         + ("[T, batch, *shape]" if lead == 2 else "[batch, *shape]"),
                         "add the batch dimension (and the time dimension in step_mode 'm')")
    for qual, m in root.named_modules():  # a model without NIR equivalent: its located error first
        if isinstance(m, NeuronModule):
            try:
                classify(analyse(m.compiled))
            except FlexDSLError as e:
                raise _in_layer(e, qual, m) from None
    try:
        graph = _Tracer().trace(root)
    except Exception as e:  # fx cannot follow data-dependent Python in forward
        raise _net_error(f"cannot trace the network's forward with torch.fx: {e}",
                         "export a torch.nn.Sequential, or a module whose forward only calls layers and adds "
                         "branches") from None
    nodes, edges = _graph(nir, root, graph, sample_input, lead, dt, method)
    g = nir.NIRGraph(nodes=nodes, edges=edges, metadata={"flexdsl_dt": dt, "source": "flexdsl"})
    if path is not None:
        _write(nir, path, g)
    return g


def _graph(nir, root: nn.Module, graph: torch.fx.Graph, sample_input: torch.Tensor, lead: int, dt: float,
           method: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The NIR nodes and edges of a traced network: a node per layer call (shapes recorded by
    running it once), edges from the layers' inputs; `+` of two branches sums their edges."""
    records, out_shape = _shapes(root, sample_input, lead)
    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str]] = []
    values: dict[torch.fx.Node, list[str]] = {}
    used: set[str] = set()

    def unique(base: str) -> str:
        name, k = base, 1
        while name in used or name in ("input", "output"):
            name = f"{base}_{k}"
            k += 1
        used.add(name)
        return name

    def sources(arg: Any, where: str) -> list[str]:
        if isinstance(arg, torch.fx.Node) and arg in values and values[arg] is not None:
            return values[arg]
        raise _net_error(f"{where} takes something other than the output of a layer ({arg!r})", _EXPORTABLE)

    placeholders = 0
    for n in graph.nodes:
        if n.op == "placeholder":
            placeholders += 1
            values[n] = ["input"] if placeholders == 1 else None  # type: ignore[assignment]
            if placeholders == 1:
                nodes["input"] = nir.Input(input_type=np.array(sample_input.shape[lead:]))
        elif n.op == "call_module":
            mod = root.get_submodule(n.target)
            if len(n.args) != 1 or n.kwargs:
                raise _net_error(f"`{n.target}` is called with {len(n.args)} arguments; NIR layers take one")
            src = sources(n.args[0], f"`{n.target}`")
            if isinstance(mod, _SKIP):
                values[n] = src
                continue
            if isinstance(mod, RecurrentModule):
                if not records[mod]:
                    raise _net_error(f"`{n.target}` was not called when the network ran on sample_input")
                records[mod].pop(0)
                rec_nodes, rec_edges, entry, exit_ = _recurrent_nodes(nir, mod, str(n.target), unique, lead, dt,
                                                                      method)
                nodes.update(rec_nodes)
                edges += [(s, entry) for s in src] + rec_edges
                values[n] = [exit_]
                continue
            if not isinstance(mod, (NeuronModule, *_LAYERS)):
                raise _net_error(f"cannot export `{n.target}` ({type(mod).__module__}.{type(mod).__qualname__}): "
                                 "NIR has no such layer", "exportable: " + _EXPORTABLE)
            if not records[mod]:
                raise _net_error(f"`{n.target}` was not called when the network ran on sample_input")
            shape_in, shape_out = records[mod].pop(0)
            name = unique(str(n.target))
            nodes[name] = _node(nir, mod, name, tuple(shape_in[lead:]), tuple(shape_out[lead:]), lead, dt, method)
            edges += [(s, name) for s in src]
            values[n] = [name]
        elif (n.op == "call_function" and n.target in (operator.add, torch.add)) or \
                (n.op == "call_method" and n.target == "add"):
            if len(n.args) != 2 or n.kwargs:
                raise _net_error("only `a + b` of two layer outputs can be exported")
            a, b = (sources(arg, "`+`") for arg in n.args)
            if set(a) & set(b):
                raise _net_error("a branch is added to itself; NIR sums distinct edges only")
            values[n] = a + b
        elif n.op == "output":
            src = sources(n.args[0], "the network's output")
            nodes["output"] = nir.Output(output_type=np.array(out_shape))
            edges += [(s, "output") for s in src]
        else:
            what = getattr(n.target, "__name__", str(n.target))
            raise _net_error(f"the network's forward calls `{what}` ({n.op}); NIR has no such operation",
                             "use layers (e.g. torch.nn.Flatten instead of x.flatten()); exportable: " + _EXPORTABLE)
    return nodes, edges



@contextmanager
def _fresh_states(modules):
    """The flexdsl neurons and recurrent layers among `modules` start from their initial states
    (what a call kept, of any batch size, is not the graph's business), and get back what they
    had, states, state sequences, fed-back spikes and noise counters, afterwards."""
    mods = list(modules)
    neurons = [m for m in mods if isinstance(m, NeuronModule)]
    layers = [m for m in mods if isinstance(m, RecurrentModule)]
    saved = [(m, dict(m._states), dict(m.state_seqs), m.__dict__.get("_noise_state")) for m in neurons]
    feedback = [(m, m.feedback) for m in layers]
    try:
        for m in neurons:
            m._states.update(dict.fromkeys(m._states))
            if m.__dict__.get("_noise_state") is not None:
                m.__dict__["_noise_state"] = m.__dict__["_noise_state"].clone()
        for m in layers:
            m.feedback = None
        yield
    finally:
        for m, st, seqs, noise in saved:
            m._states.update(st)
            m.__dict__["state_seqs"] = seqs
            if noise is not None:
                m.__dict__["_noise_state"] = noise
        for m, fb in feedback:
            m.feedback = fb

def _write(nir, path: str | Path, g) -> None:
    try:
        nir.write(str(path), g)
    except OSError as e:
        raise FlexDSLError(f"cannot write the NIR graph: {e}", str(path)) from None


def _export_network(nir, net: NIRNetwork, x: torch.Tensor, dt: float, method: str, path) -> nir_t.NIRGraph:
    """A graph of a network that `load` made (trained, perhaps): its nodes and edges, with the
    neurons matched again from their equations."""
    lead = 1 if net.step_mode == "s" else 2
    if x.dim() <= lead:
        raise _net_error(f"sample_input has shape {tuple(x.shape)}, but the network takes "
                         + ("[T, batch, *shape]" if lead == 2 else "[batch, *shape]"))
    prev = net._prev
    net._shapes, net._prev = {}, {}
    try:
        with _fresh_states(net.modules()), torch.no_grad():
            net(x)
    except FlexDSLError:
        raise
    except Exception as e:
        raise _net_error(f"the network fails on sample_input of shape {tuple(x.shape)}: {e}") from None
    finally:
        shapes, net._shapes, net._prev = net._shapes, None, prev
    # (a subgraph's nodes were loaded as `sub/node`: in a NIR file `/` nests HDF5 groups, so `sub.node`)
    inv: dict[str, str] = {}
    for n, k in net.names.items():
        name, j = n.replace("/", "."), 1
        while name in inv.values():
            name, j = f"{n.replace('/', '.')}_{j}", j + 1
        inv[k] = name
    nodes: dict[str, Any] = {}
    inner: list[tuple[str, str]] = []  # the edges inside recurrent layers
    entries: dict[str, str] = {}  # a recurrent layer's node -> the node its input edges go to
    taken = set(inv.values())

    def unique(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        return name

    for key in net.order:
        name, kind, m = inv[key], net.kinds[key], net.nodes[key] if key in net.nodes else None
        per_in, per_out = shapes.get(key, ((), ()))
        if key == net.entry:
            nodes[name] = nir.Input(input_type=np.array(x.shape[lead:]))
        elif key in net.exits:
            nodes[name] = nir.Output(output_type=np.array(per_out))
        elif kind == "neuron":
            nodes[name] = _neuron_node(nir, m, name, per_in, per_out, lead, dt, method)
        elif kind == "recurrent":
            taken.discard(name)
            rec_nodes, rec_edges, entries[name], _ = _recurrent_nodes(nir, m, name, unique, lead, dt, method)
            nodes.update(rec_nodes)
            inner += rec_edges
        elif kind == "flatten":
            nodes[name] = nir.Flatten(input_type={"input": np.array(per_in)}, start_dim=m.start_dim, end_dim=m.end_dim)
        elif isinstance(m, _Scale):
            nodes[name] = nir.Scale(scale=m.scale.detach().cpu().numpy())
        elif isinstance(m, nn.AvgPool2d) and m.divisor_override == 1:
            nodes[name] = nir.SumPool2d(kernel_size=np.array(m.kernel_size), stride=np.array(m.stride),
                                        padding=np.array(m.padding))
        elif m is not None:
            nodes[name] = _node(nir, m, name, per_in, per_out, lead, dt, method)

    def sources(key: str) -> list[str]:  # through the pass-through nodes of flattened subgraphs
        if key in nodes or inv[key] in nodes:
            return [key]
        return [s for p in net.preds[key] + net.back_preds[key] for s in sources(p)]

    edges = [(inv[s], entries.get(inv[key], inv[key])) for key in net.order if inv[key] in nodes
             for p in net.preds[key] + net.back_preds[key] for s in sources(p)] + inner
    g = nir.NIRGraph(nodes=nodes, edges=edges, metadata={"flexdsl_dt": dt, "source": "flexdsl"})
    if path is not None:
        _write(nir, path, g)
    return g


def _shapes(root: nn.Module, x: torch.Tensor, lead: int):
    """Run the network once on `x` (no grad, from the initial states; the states restored after):
    each layer's input and output shapes per call, and the network's per-sample output shape."""
    records: dict[nn.Module, list[tuple[tuple[int, ...], tuple[int, ...]]]] = defaultdict(list)
    handles = []
    for m in root.modules():
        if isinstance(m, (NeuronModule, RecurrentModule, *_LAYERS)):
            def hook(mod, args, out):
                o = out[0] if isinstance(out, tuple) else out
                records[mod].append((tuple(args[0].shape), tuple(o.shape)))

            handles.append(m.register_forward_hook(hook))
    training = [(m, m.training) for m in root.modules()]
    try:
        root.eval()
        with _fresh_states(root.modules()), torch.no_grad():
            out = root(x)
    except FlexDSLError:
        raise
    except Exception as e:
        raise _net_error(f"the network fails on sample_input of shape {tuple(x.shape)}: {e}") from None
    finally:
        for h in handles:
            h.remove()
        for m, t in training:
            m.training = t
    if not isinstance(out, torch.Tensor):
        raise _net_error(f"the network returns {type(out).__name__}; NIR graphs here have one output tensor")
    return records, tuple(out.shape[lead:])


def _node(nir, mod: nn.Module, name: str, per_in: tuple[int, ...], per_out: tuple[int, ...], lead: int,
          dt: float, method: str):
    make = next(f for t, f in _NODE_MAKERS.items() if isinstance(mod, t))
    return make(nir, mod, name, per_in, per_out, lead, dt, method)


def _expand_layers(net: nn.Module) -> nn.Module:
    """The network with every feed-forward layer (`FeedForwardModule`) as the `nn.Linear` of its
    synapses followed by its neuron (a copy; the network itself unchanged), which NIR writes as an
    `Affine` (or `Linear`) node into the neuron's node."""
    if not any(isinstance(m, FeedForwardModule) for m in net.modules()):
        return net
    net = copy.deepcopy(net)
    if isinstance(net, FeedForwardModule):
        return net.as_sequential()
    for m in list(net.modules()):
        for name, child in list(m.named_children()):
            if isinstance(child, FeedForwardModule):
                setattr(m, name, child.as_sequential())
    return net


def _in_layer(e: FlexDSLError, name: str, mod: NeuronModule) -> FlexDSLError:
    """A located error of a model, saying which layer of the network has it."""
    if not e.line:
        return e
    return FlexDSLError(f"layer `{name}`: {e.reason}", e.filename, e.line, e.column, mod.compiled.text, e.hint)


def _neuron_node(nir, mod: NeuronModule, name, per_in, per_out, lead, dt, method):
    shape = per_out
    try:
        ex = match(mod, dt, method)
    except FlexDSLError as e:
        raise _in_layer(e, name, mod) from None
    arrays = {}
    for k, v in ex.params.items():
        try:
            arrays[k] = np.broadcast_to(np.asarray(v, dtype=np.float64), shape).copy()
        except ValueError:
            raise _net_error(f"layer `{name}`: NIR param `{k}` has shape {np.shape(v)}, which does not broadcast "
                             f"to the layer's shape {shape}", "per-channel params must broadcast over one sample, "
                             "e.g. (C, 1, 1) for [C, H, W]") from None
    _warn_initial(mod, name, ex, arrays)
    meta = {"flexdsl_model": mod.compiled.name, "flexdsl_method": ex.method, "flexdsl_dt": dt}
    if ex.op is not None:
        meta["flexdsl_threshold"] = ex.op
    if ex.surrogate is not None:
        meta["flexdsl_surrogate"] = ex.surrogate
    cls = getattr(nir, ex.kind)
    if ex.kind == "Threshold":
        return cls(threshold=arrays["threshold"], metadata=meta)
    p = PRIMITIVES[ex.kind]
    return cls(**{k: arrays[k] for k in p.params}, metadata=meta)


def _recurrent_nodes(nir, mod: RecurrentModule, name: str, unique, lead: int, dt: float, method: str):
    """A recurrent layer as NIR nodes: its neuron (named `name`) fed back through a Linear of W_rec
    (times the mask; a Scale for one-to-one weights) named `name_rec`, and fed by an Affine of
    (W_in, bias) named `name_in` (a Linear without bias; the identity's Affine for a bias alone).
    (nodes, edges among them, the node the layer's input goes to, the node its output comes from)."""
    where = f"layer `{name}`"
    if mod.source != "spike":
        raise _net_error(f"{where} feeds back `{mod.source}`; NIR neurons output their spikes, so only a layer fed "
                         "back from its spikes has a NIR form")
    s = mod.__dict__.get("_rec_delay")
    if s is not None:
        raise mod._layer.error(f"{where} has delays on its recurrent synapses `{s.name}`: NIR's graph of a recurrent "
                               "layer (its neuron fed back through a Linear) has no place for them", s.delay_pos,
                               "export a layer whose delays are on its input synapses (axonal)")
    H = mod.hidden
    neuron = unique(name)
    nodes: dict[str, Any] = {neuron: _neuron_node(nir, mod.neuron, neuron, (H,), (H,), lead, dt, method)}
    w = mod.W_rec.detach() if mod.mask is None else (mod.W_rec * mod.mask.to(mod.W_rec.dtype)).detach()
    w = w.float().cpu().numpy()
    rec = unique(f"{name}_rec")
    nodes[rec] = nir.Linear(weight=w) if mod.connectivity == "all" else nir.Scale(scale=w)
    edges = [(neuron, rec), (rec, neuron)]
    entry = neuron
    b = None if mod.bias is None else mod.bias.detach().float().cpu().numpy()
    if mod.W_in is not None or b is not None:
        entry = unique(f"{name}_in")
        w_in = mod.W_in.detach().float().cpu().numpy() if mod.W_in is not None else np.eye(H, dtype=np.float32)
        nodes[entry] = nir.Affine(weight=w_in, bias=b) if b is not None else nir.Linear(weight=w_in)
        edges.append((entry, neuron))
    s = mod.__dict__.get("_in_delay")
    if s is not None:  # (axonal or uniform: a Delay of the layer's input; another kind a located error)
        delay = mod._axonal_delay(s)
        node = unique(f"{name}_delay")
        nodes[node] = _delay_node(nir, delay, node, (s.pre_size,), (s.pre_size,), lead, dt, method)
        edges.append((node, entry))
        entry = node
    return nodes, edges, entry, neuron


def _warn_initial(mod: NeuronModule, name: str, ex: Exported, arrays: Mapping[str, np.ndarray]) -> None:
    """NIR records no initial state; `load` starts v at v_leak (v_reset for IF, 0 for I) and
    the current at 0: warn where the model starts elsewhere."""
    if ex.kind == "Threshold":
        return
    ls = analyse(mod.compiled)
    _, roles = classify(ls)
    want = {"v": arrays[_INITIAL[ex.kind]] if _INITIAL[ex.kind] in arrays else np.zeros(1)}
    if "i" in roles:
        want["i"] = np.zeros(1)
    for role, w in want.items():
        state = roles[role]
        init = mod._initial_value(state)
        init = np.asarray(init.detach().cpu() if isinstance(init, torch.Tensor) else init, dtype=np.float64)
        if not np.allclose(np.broadcast_to(init, np.broadcast_shapes(init.shape, w.shape)), w, rtol=1e-9, atol=1e-12):
            warnings.warn(f"layer `{name}`: `{state}` starts at {_show(init)}, but NIR records no initial state and "
                          f"flexdsl.nir.load starts it at {_show(w)}", stacklevel=4)


def _linear_node(nir, mod: nn.Linear, name, per, per_out, lead, dt, method):
    if len(per) != 1:
        raise _net_error(f"`{name}` (Linear) gets inputs of shape {per} per sample; NIR's Affine takes vectors",
                         "flatten first (torch.nn.Flatten)")
    w = mod.weight.detach().cpu().numpy()
    if mod.bias is None:
        return nir.Linear(weight=w)
    return nir.Affine(weight=w, bias=mod.bias.detach().cpu().numpy())


def _conv_node(nir, mod, name, per, per_out, lead, dt, method):
    two = isinstance(mod, nn.Conv2d)
    if len(per) != (3 if two else 2):
        raise _net_error(f"`{name}` gets inputs of shape {per} per sample")
    if mod.padding_mode != "zeros":
        raise _net_error(f"`{name}` pads with `{mod.padding_mode}`; NIR convolutions pad with zeros")
    bias = mod.bias.detach().cpu().numpy() if mod.bias is not None else np.zeros(mod.out_channels, np.float32)
    pad = mod.padding if isinstance(mod.padding, str) else (tuple(mod.padding) if two else mod.padding[0])
    cls = nir.Conv2d if two else nir.Conv1d
    return cls(input_shape=tuple(per[1:]) if two else per[1], weight=mod.weight.detach().cpu().numpy(),
               stride=tuple(mod.stride) if two else mod.stride[0], padding=pad,
               dilation=tuple(mod.dilation) if two else mod.dilation[0], groups=mod.groups, bias=bias)


def _flatten_node(nir, mod: nn.Flatten, name, per, per_out, lead, dt, method):
    # SpikingJelly's multi-step layers (step_mode "m") apply their torch layer to [T*batch, ...]
    front = 1 if lead == 2 and getattr(mod, "step_mode", None) == "m" else lead
    nd = len(per) + front
    start = mod.start_dim % nd
    end = mod.end_dim % nd
    if start < front:
        raise _net_error(f"`{name}` (Flatten(start_dim={mod.start_dim})) merges the time or batch dimension",
                         f"use start_dim={front} for inputs [T, batch, ...]" if front == 2 else "use start_dim=1")
    return nir.Flatten(input_type={"input": np.array(per)}, start_dim=start - front,
                       end_dim=-1 if end == nd - 1 else end - front)


def _pool_node(nir, mod: nn.AvgPool2d, name, per, per_out, lead, dt, method):
    if mod.ceil_mode or mod.divisor_override is not None or not mod.count_include_pad:
        raise _net_error(f"`{name}`: only AvgPool2d with ceil_mode=False, count_include_pad=True and no "
                         "divisor_override has a NIR equivalent")

    def pair(v):
        return np.array(v if isinstance(v, tuple | list) else (v, v))

    return nir.AvgPool2d(kernel_size=pair(mod.kernel_size), stride=pair(mod.stride), padding=pair(mod.padding))


def _delay_node(nir, mod: Delay, name, per, per_out, lead, dt, method):
    """An axonal delay (`runtime/delays.Delay`) as NIR's element-wise `Delay`, in NIR's time: steps * dt."""
    d = mod.delay.detach().cpu().numpy().astype(np.float64)
    if d.size == 1 and per and int(np.prod(per)) != 1:
        d = np.full(int(np.prod(per)), float(d.reshape(-1)[0]))
    return nir.Delay(delay=(d * dt).reshape(per) if d.size == int(np.prod(per)) else d * dt)


_NODE_MAKERS = {NeuronModule: _neuron_node, nn.Linear: _linear_node, nn.Conv1d: _conv_node, nn.Conv2d: _conv_node,
                nn.Flatten: _flatten_node, nn.AvgPool2d: _pool_node, Delay: _delay_node}
