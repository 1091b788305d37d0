"""`load`: a network of flexdsl neurons from a NIR graph: one flexdsl neuron per NIR neuron node
from generated `.neuron` text (kept as `module.neuron_text`), torch layers for the others,
run by `network.NIRNetwork`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import FlexDSLError, did_you_mean
from ..frontend.layer import MAX_DELAY
from ..runtime.delays import Delay
from ..runtime.module import NeuronModule
from ..runtime.options import OptionError, learnable_names, surrogate_text
from .network import NIRNetwork
from .primitives import (
    _POSITIVE,
    DEFAULT_SURROGATE,
    METHODS,
    PRIMITIVES,
    _check_dt,
    _nir,
    _surrogate,
    neuron_text,
)


def _read(graph_or_path: Any):
    nir = _nir()
    if isinstance(graph_or_path, str | Path):
        path = str(graph_or_path)
        if not Path(path).is_file():
            raise FlexDSLError(f"no such NIR file: `{path}`", path)
        try:
            return nir.read(path), path
        except Exception as e:  # h5py/nir raise many kinds of errors on a damaged file
            raise FlexDSLError(f"cannot read `{path}` as a NIR graph: {e}", path) from None
    if isinstance(graph_or_path, nir.NIRGraph):
        return graph_or_path, "<nir graph>"
    if isinstance(graph_or_path, nir.NIRNode) and not isinstance(graph_or_path, nir.Input | nir.Output):
        node = graph_or_path
        try:
            return nir.NIRGraph.from_list(node), "<nir graph>"
        except Exception as e:
            raise FlexDSLError(f"cannot make a graph of this {type(node).__name__} node: {e}", "<nir graph>") from None
    raise FlexDSLError(f"load takes a nir.NIRGraph, a NIR node or a path, not {type(graph_or_path).__name__}",
                       "<flexdsl.nir>")


@dataclass
class _Flat:
    nodes: dict[str, Any]  # path -> NIR node ("pass" for the Input/Output nodes of subgraphs)
    edges: list[tuple[str, str]]
    inputs: list[str]
    outputs: list[str]


def _flatten(graph, prefix: str = "") -> _Flat:
    """One flat graph: a subgraph's nodes are named `sub/node`; its Input and Output nodes pass
    their value through."""
    nir = _nir()
    flat = _Flat({}, [], [], [])
    entry: dict[str, list[str]] = {}
    exit_: dict[str, list[str]] = {}
    for name, node in graph.nodes.items():
        full = prefix + str(name)
        if isinstance(node, nir.NIRGraph):
            sub = _flatten(node, full + "/")
            flat.nodes.update(sub.nodes)
            flat.edges += sub.edges
            entry[str(name)], exit_[str(name)] = sub.inputs, sub.outputs
        else:
            if isinstance(node, nir.Input):
                flat.inputs.append(full)
            elif isinstance(node, nir.Output):
                flat.outputs.append(full)
            flat.nodes[full] = "pass" if prefix and isinstance(node, nir.Input | nir.Output) else node
            entry[str(name)] = exit_[str(name)] = [full]
    for a, b in graph.edges:
        a, b = str(a), str(b)
        for n in (a, b):
            if n not in entry:
                raise FlexDSLError(f"the edge ({a!r}, {b!r}) names `{n}`, which is not a node of the graph",
                                   "<nir graph>")
        flat.edges += [(s, d) for s in exit_[a] for d in entry[b]]
    return flat


def _np(a: Any, dtype: Any = np.float64) -> np.ndarray:
    """A NIR field as a numpy array of real numbers (other tools store torch tensors in their
    graphs too); TypeError for anything else: complex values (whose imaginary part a conversion
    would drop), text, objects (`None` would become NaN)."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    raw = np.asarray(a)
    if raw.dtype.kind not in "biuf":
        what = "complex" if raw.dtype.kind == "c" else f"of dtype {raw.dtype}"
        raise TypeError(f"its values are {what}, not real numbers")
    return np.array(raw, dtype=dtype)


def _array(node: Any, field: str, where: str, kind: str) -> np.ndarray:
    try:
        a = _np(getattr(node, field))
    except (TypeError, ValueError, AttributeError) as e:
        raise FlexDSLError(f"NIR node `{where}` ({kind}): `{field}` is not numeric ({e})", "<nir graph>") from None
    bad = ~np.isfinite(a) | ((a <= 0) if field in _POSITIVE else False)
    if bool(np.any(bad)):
        i = int(np.flatnonzero(bad)[0])
        want = "positive and finite" if field in _POSITIVE else "finite"
        raise FlexDSLError(f"NIR node `{where}` ({kind}): `{field}` must be {want}, got {float(a.flat[i])!r} at "
                           f"flat index {i}",
                           "<nir graph>")
    return a


def _neuron_module(kind: str, node: Any, where: str, dt: float, method: str, learnable: set[str],
                   surrogate: str, backend: str, detach_reset: bool, chosen: str | None = None
                   ) -> tuple[NeuronModule, tuple[int, ...]]:
    """The neuron of a NIR node and the shape its params give it (a sample's values must have it,
    up to dimensions of size 1 in the params)."""
    from ..api import loads

    p = PRIMITIVES[kind]
    arrays = {f: _array(node, f, where, kind) for f in p.params}
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
    except ValueError:
        raise FlexDSLError(f"NIR node `{where}` ({kind}): its params have shapes that do not broadcast: "
                           + ", ".join(f"{f} {a.shape}" for f, a in arrays.items()), "<nir graph>") from None
    scalars: dict[str, float] = {}
    channels: dict[str, np.ndarray] = {}
    for f, a in arrays.items():
        uniform = a.size > 0 and bool(np.all(a == a.flat[0]))
        if uniform and f not in learnable:
            scalars[f] = float(a.flat[0])
        else:
            channels[f] = np.broadcast_to(a, shape).copy() if f in learnable else a
            scalars[f] = float(a.flat[0]) if a.size else 0.0
    if method == "euler" and kind not in ("IF", "I", "Threshold"):
        taus = [arrays[f] for f in ("tau", "tau_mem", "tau_syn") if f in arrays]
        if any(bool(np.any(t < dt)) for t in taus):
            warnings.warn(f"NIR node `{where}` ({kind}): a time constant is shorter than dt={dt:g}; forward Euler "
                          "overshoots there (method='exact' does not)", stacklevel=3)
    text = neuron_text(kind, scalars, dt, method, surrogate=surrogate, learnable=learnable & set(p.params),
                       shapes={f: a.shape for f, a in channels.items()})
    return loads(text, backend=backend, detach_reset=detach_reset, surrogate=chosen,
                 **{f: torch.from_numpy(a) for f, a in channels.items()}), tuple(shape)


class _Scale(nn.Module):
    def __init__(self, scale: np.ndarray) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.from_numpy(_np(scale)).to(torch.get_default_dtype()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def _layer_module(node: Any, where: str, dt: float) -> tuple[nn.Module, str]:
    """A NIR layer as a torch module and how it is applied: "vector" (on the last dimension or
    elementwise), "spatial" (on [N, C, ...]), "flatten", "delay" (on [T, batch, n]: NIR's `Delay`,
    in steps of `dt`). Its fields are checked first, so that a malformed node is an error here, not
    at the first call."""
    try:
        _check_layer(node)
        if type(node).__name__ == "Delay":
            return _delay_module(node, where, dt), "delay"
        return _make_layer(node, where)
    except FlexDSLError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, AttributeError, OverflowError) as e:
        raise FlexDSLError(f"NIR node `{where}` ({type(node).__name__}) is malformed: {e}", "<nir graph>") from None


# a layer's integer fields: (the least value, whether "same"/"valid" text is allowed)
_INTS = {"stride": (1, False), "dilation": (1, False), "groups": (1, False), "padding": (0, True),
         "kernel_size": (1, False), "start_dim": (None, False), "end_dim": (None, False)}


def _check_layer(node: Any) -> None:
    """A layer's fields as torch will take them: weights, biases and scales real and finite, integer
    fields integers in range (ValueError or TypeError naming the field otherwise)."""
    for field in ("weight", "bias", "scale"):
        if hasattr(node, field):
            try:
                a = _np(getattr(node, field))
            except (TypeError, ValueError) as e:
                raise TypeError(f"`{field}`: {e}") from None
            if not bool(np.all(np.isfinite(a))):
                raise ValueError(f"`{field}` has a value that is not finite (NaN or inf)")
    for field, (least, text) in _INTS.items():
        if not hasattr(node, field) or (text and isinstance(getattr(node, field), str)):
            continue
        vals = _integers(getattr(node, field), field)
        if least is not None and any(v < least for v in vals):
            raise ValueError(f"`{field}` must be at least {least}, not {min(vals)}")
    if hasattr(node, "kernel_size") and hasattr(node, "padding"):  # (torch's pooling: a pad of at most half a kernel)
        k, pad = _integers(node.kernel_size, "kernel_size"), _integers(node.padding, "padding")
        if max(pad) > min(k) // 2:
            raise ValueError(f"`padding` {max(pad)} is more than half the kernel ({min(k)})")
    if hasattr(node, "start_dim"):
        _check_flatten(node)


def _integers(v: Any, field: str) -> list[int]:
    a = np.asarray(v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
    if a.dtype.kind not in "iuf" or a.size == 0 or (a.dtype.kind == "f" and not bool(np.all(np.isfinite(a)))):
        raise TypeError(f"`{field}` is not an integer ({str(v)[:40]})")
    if a.dtype.kind == "f" and not bool(np.all(a == np.round(a))):
        raise ValueError(f"`{field}` is not an integer ({str(v)[:40]})")
    if bool(np.any(np.abs(a) >= 2**31)):
        raise ValueError(f"`{field}` is out of range ({str(v)[:40]})")
    return [int(t) for t in a.reshape(-1)]


def _check_flatten(node: Any) -> None:
    """Flatten's dims count the dimensions of a sample (from 0, or from the end where negative):
    within the rank of its declared input, and in order."""
    (start,), (end,) = _integers(node.start_dim, "start_dim")[:1], _integers(node.end_dim, "end_dim")[:1]
    shape = _declared_shape(node)
    if shape is None:
        return
    rank = len(shape)
    for field, d in (("start_dim", start), ("end_dim", end)):
        if not -rank <= d < rank:
            raise ValueError(f"`{field}` {d} is outside the {rank} dimensions of its input {shape}")
    if start % rank > end % rank:
        raise ValueError(f"`start_dim` {start} comes after `end_dim` {end}")


def _delay_module(node: Any, where: str, dt: float) -> Delay:
    """NIR's element-wise `Delay` (delays in the graph's time) as whole numbers of steps of `dt`."""
    d = _np(node.delay)
    if not bool(np.all(np.isfinite(d))) or bool(np.any(d < 0)):
        raise FlexDSLError(f"NIR node `{where}` (Delay) has a delay that is negative or not finite", "<nir graph>")
    steps = d / dt
    whole = np.round(steps)
    if bool(np.any(np.abs(steps - whole) > 1e-6 * np.maximum(whole, 1.0))):
        steps, d = steps.reshape(-1), d.reshape(-1)
        k = int(np.argmax(np.abs(steps - np.round(steps))))
        raise FlexDSLError(f"NIR node `{where}` (Delay): the delay {d[k]:g} is {steps[k]:g} steps of dt={dt:g}, not a "
                           "whole number of steps", "<nir graph>", hint="load with a dt that divides every delay")
    if whole.size and whole.max() > MAX_DELAY:
        raise FlexDSLError(f"NIR node `{where}` (Delay): {int(whole.max()):,} steps is over the {MAX_DELAY:,} a delay "
                           "may reach", "<nir graph>")
    return Delay(torch.from_numpy(whole.astype(np.int64)))


def _make_layer(node: Any, where: str) -> tuple[nn.Module, str]:
    nir = _nir()
    kind = type(node).__name__

    def tensor(a: Any) -> torch.Tensor:  # (torch's default dtype, as the modules made here: float64 under it)
        return torch.from_numpy(_np(a)).to(torch.get_default_dtype())

    if isinstance(node, nir.Affine | nir.Linear):
        w = tensor(node.weight)
        if w.dim() != 2:
            raise FlexDSLError(f"NIR node `{where}` ({kind}): weights of shape {tuple(w.shape)} are not a matrix",
                               "<nir graph>")
        has_bias = isinstance(node, nir.Affine)
        lin = nn.Linear(w.shape[1], w.shape[0], bias=has_bias)
        with torch.no_grad():
            lin.weight.copy_(w)
            if has_bias:
                lin.bias.copy_(tensor(node.bias).reshape(-1))
        return lin, "vector"
    if isinstance(node, nir.Scale):
        return _Scale(node.scale), "vector"
    if isinstance(node, nir.Conv1d | nir.Conv2d):
        w = tensor(node.weight)
        two = isinstance(node, nir.Conv2d)
        if w.dim() != (4 if two else 3):
            raise ValueError(f"weights of shape {tuple(w.shape)} are not those of a {kind} "
                             f"([out, in, {'kh, kw' if two else 'k'}])")
        cls = nn.Conv2d if two else nn.Conv1d

        def arg(v):
            if isinstance(v, str):
                return v
            a = np.asarray(v).astype(int).reshape(-1)
            return tuple(int(t) for t in a) if two and a.size == 2 else int(a[0])

        conv = cls(w.shape[1] * int(node.groups), w.shape[0], tuple(w.shape[2:]), stride=arg(node.stride),
                   padding=arg(node.padding), dilation=arg(node.dilation), groups=int(node.groups), bias=True)
        with torch.no_grad():
            conv.weight.copy_(w)
            conv.bias.copy_(tensor(node.bias).reshape(-1))
        return conv, "spatial"
    if isinstance(node, nir.AvgPool2d | nir.SumPool2d):
        def pair(v):
            a = np.asarray(v).astype(int).reshape(-1)
            return (int(a[0]), int(a[-1]))

        pool = nn.AvgPool2d(pair(node.kernel_size), pair(node.stride), pair(node.padding),
                            divisor_override=1 if isinstance(node, nir.SumPool2d) else None)
        return pool, "spatial"
    if isinstance(node, nir.Flatten):
        return nn.Flatten(_integers(node.start_dim, "start_dim")[0], _integers(node.end_dim, "end_dim")[0]), "flatten"
    raise FlexDSLError(f"NIR node `{where}` is a {kind}, which flexdsl cannot run", "<nir graph>",
                       hint="supported: " + ", ".join([*PRIMITIVES, "Affine", "Linear", "Scale", "Conv1d", "Conv2d",
                                                       "Flatten", "AvgPool2d", "SumPool2d", "Delay"]))


def load(graph_or_path: Any, dt: float | None = None, *, method: str = "auto", learnable: Any = (),
         surrogate: Any = None, backend: str = "auto", detach_reset: bool = False,
         step_mode: str = "m") -> NIRNetwork:
    """A `torch.nn.Module` (NIRNetwork) running a NIR graph (a `nir.NIRGraph`, a node, or a file
    path) with flexdsl neurons.

    `dt` is the length of one step in the graph's time unit (default: the dt that
    `flexdsl.nir.export` recorded in the graph). `method`: how NIR's ODEs are discretised,
    "euler", "exact" or "auto" (what export recorded for a node, else euler). `learnable`:
    NIR param names (e.g. "tau", "v_threshold"; one, a list, or True for all) that become trainable
    per-neuron Parameters (a bounded one, `tau > 0`, trains as `raw_tau`: see `flexdsl.load`).
    `surrogate`: the spikes' surrogate, as `flexdsl.load` takes it: text such as "atan(alpha=2.0)"
    or a SpikingJelly or snnTorch surrogate object (default: what export recorded, else
    sigmoid(alpha=4.0)). Inputs are `[T, batch, *shape]` (step_mode "m") or
    `[batch, *shape]` ("s", one step per call, states kept until `reset()`).
    """
    nir = _nir()
    graph, source = _read(graph_or_path)
    meta = graph.metadata if isinstance(graph.metadata, dict) else {}
    if dt is None:
        if "flexdsl_dt" not in meta:
            raise FlexDSLError("dt is needed: NIR is continuous time and this graph does not record a step",
                               source, hint="pass dt=..., the length of one step in the graph's time unit "
                               "(snnTorch exports with dt=1e-4, Norse with dt=1e-3)")
        dt = meta["flexdsl_dt"]
    dt = _check_dt(dt)
    if method not in ("auto", *METHODS):
        raise FlexDSLError(f"method must be 'auto', 'euler' or 'exact', not {method!r}", "<flexdsl.nir>",
                           hint=did_you_mean(str(method), ["auto", *METHODS]))
    if step_mode not in ("s", "m"):
        raise FlexDSLError(f"step_mode must be 's' or 'm', not {step_mode!r}", "<flexdsl.nir>")
    known = sorted({f for p in PRIMITIVES.values() for f in p.params})
    try:
        names = learnable_names(learnable)
        surrogate, _ = surrogate_text(surrogate)
    except OptionError as e:
        raise FlexDSLError(e.reason, "<flexdsl.nir>", hint=e.hint) from None
    learn = set(known) if names is True else set() if not names else set(names)
    for n in sorted(learn):
        if n not in known:
            raise FlexDSLError(f"`{n}` is not a param of a NIR neuron", "<flexdsl.nir>",
                               hint=did_you_mean(n, known) or "NIR neuron params: " + ", ".join(known))
    flat = _flatten(graph)
    if len(flat.inputs) != 1:
        raise FlexDSLError(f"the graph has {len(flat.inputs)} Input nodes; flexdsl runs graphs with one", source)
    if not flat.outputs:
        raise FlexDSLError("the graph has no Output node", source)
    modules: dict[str, nn.Module] = {}
    kinds: dict[str, str] = {}
    types: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, node in flat.nodes.items():
        types[name] = "subgraph Input/Output" if isinstance(node, str) else type(node).__name__
        if node == "pass" or isinstance(node, nir.Input | nir.Output):
            kinds[name] = "pass"
            continue
        kind = type(node).__name__
        if kind in PRIMITIVES:
            md = _flexdsl_metadata(node, name, kind)
            meth = method if method != "auto" else md.get("flexdsl_method", "euler")
            sur = md.get("flexdsl_surrogate") or DEFAULT_SURROGATE
            modules[name], shapes[name] = _neuron_module(kind, node, name, dt, meth, learn,
                                                         _surrogate(sur) or DEFAULT_SURROGATE, backend, detach_reset,
                                                         surrogate if PRIMITIVES[kind].spiking else None)
            kinds[name] = "neuron"
        else:
            modules[name], kinds[name] = _layer_module(node, name, dt)
    edges = _fuse_recurrent(modules, kinds, types, flat.edges, backend)
    net = NIRNetwork(modules, kinds, edges, flat.inputs[0], flat.outputs, dt, step_mode, types, shapes)
    try:
        shape = _declared_shape(flat.nodes[flat.inputs[0]])
    except ValueError as e:
        raise FlexDSLError(f"NIR node `{flat.inputs[0]}` (Input) is malformed: {e}", "<nir graph>") from None
    if shape is not None:  # layers whose shapes do not fit are found now, not at the first call
        net.check(shape)
    return net


def _fuse_recurrent(modules: dict[str, nn.Module], kinds: dict[str, str], types: dict[str, str],
                    edges: list[tuple[str, str]], backend: str) -> list[tuple[str, str]]:
    """Each neuron fed back through a weight node that only it reads and only it feeds (a Linear
    or Affine of a square matrix: all-to-all; a Scale of one weight per neuron: one-to-one) becomes
    one compiled recurrent layer (`flexdsl.recurrent`, no W_in: its input is the sum of the neuron's
    other inputs), replacing the two nodes and their cycle; the weight node's bias is the layer's
    (added every step, as the cycle adds it from the first step). The remaining edges."""
    from ..runtime.recurrent import RecurrentModule

    for n in [k for k, v in kinds.items() if v == "neuron"]:
        for r in {b for a, b in edges if a == n}:
            if r not in modules or kinds[r] != "vector" or r == n:
                continue
            if {a for a, b in edges if b == r} != {n} or {b for a, b in edges if a == r} != {n}:
                continue
            m = modules[r]
            if isinstance(m, nn.Linear) and m.in_features == m.out_features:
                hidden, conn, w, b = m.in_features, "all", m.weight, m.bias
            elif isinstance(m, _Scale) and m.scale.dim() == 1 and m.scale.numel() > 1:
                hidden, conn, w, b = m.scale.numel(), "one_to_one", m.scale, None
            else:
                continue
            layer = RecurrentModule(modules[n], None, hidden, conn, bias=b is not None, backend=backend)
            with torch.no_grad():
                layer.W_rec.copy_(w)
                if b is not None:
                    layer.bias.copy_(b)
            modules[n], kinds[n] = layer, "recurrent"
            types[n] = f"{types[n]}, recurrent through `{r}` (one compiled layer)"
            del modules[r], kinds[r], types[r]
            edges = [(a, b) for a, b in edges if r not in (a, b)]
            break
    return edges


def _flexdsl_metadata(node: Any, where: str, kind: str) -> dict[str, str]:
    """What flexdsl's export recorded on a neuron node (`flexdsl_method`, `flexdsl_surrogate`),
    checked: a recorded value that is not one flexdsl writes is an error, never ignored."""
    md = node.metadata if isinstance(node.metadata, dict) else {}
    out = {}
    if "flexdsl_method" in md:
        m = md["flexdsl_method"]
        if not isinstance(m, str) or m not in METHODS:
            raise FlexDSLError(f"NIR node `{where}` ({kind}): its metadata flexdsl_method is {m!r}, not one of "
                               f"{', '.join(METHODS)}", "<nir graph>")
        out["flexdsl_method"] = m
    if "flexdsl_surrogate" in md:
        s = _surrogate(md["flexdsl_surrogate"])
        if s is None:
            raise FlexDSLError(f"NIR node `{where}` ({kind}): its metadata flexdsl_surrogate is "
                               f"{str(md['flexdsl_surrogate'])[:80]!r}, not a built-in surrogate with finite keywords",
                               "<nir graph>", hint="e.g. 'atan(alpha=2.0)'")
        out["flexdsl_surrogate"] = s
    return out


def _declared_shape(node: Any) -> tuple[int, ...] | None:
    """The per-sample shape an Input (or Flatten) node declares, where it declares one (small
    enough for a trial run); a negative size is a malformed node (ValueError)."""
    types = getattr(node, "input_type", None)
    if not isinstance(types, dict) or len(types) != 1:
        return None
    try:
        a = np.asarray(next(iter(types.values())))
        shape = tuple(int(v) for v in a.reshape(-1)) if a.dtype.kind in "iu" else None
    except (TypeError, ValueError, OverflowError):
        return None
    if shape and any(n < 0 for n in shape):
        raise ValueError(f"its input type {shape} has a negative size")
    if not shape or any(n < 1 for n in shape) or int(np.prod(shape)) > 1 << 20:
        return None
    return shape
