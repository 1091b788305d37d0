"""Recurrent layers: `flexdsl.recurrent(model, in_features, hidden)` and `RecurrentModule`.

A layer of `hidden` neurons of any model whose input port receives, at every step,

    W_in x[t] + W_rec s[t-1] (+ bias)

where `s` is one of the layer's own outputs (the source: the spike by default) and `W_rec`
is all-to-all (`[hidden, hidden]`, optionally times a fixed 0/1 mask) or one-to-one (`[hidden]`,
a weight per neuron). `W_in x` is one matrix product over all steps before the loop; the loop
runs on a backend's recurrent scan (`backends/recurrent.py`: the first preferred backend whose
capabilities say layer scans on the input's device and dtype: the Triton kernels on CUDA, the CPU
kernels on float32 and float64 CPU tensors, the torch backend elsewhere), and its backward is
backpropagation through time with the model's derived backward, `dW_rec` one matrix product over all steps.

The neuron itself is a `NeuronModule` (`m.neuron`): its params and states are its own, read and
written here through `_NeuronView`, the one place this module touches its internals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .. import backends
from ..backends import recurrent as scans
from ..backends.base import Need, any_transformed
from ..errors import FlexDSLError, did_you_mean
from ..frontend import ast as A
from ..frontend.layer import CheckedLayer
from ..ir.layer import LayerPlan
from . import programs
from .bits import known_binary, mark_binary
from .eprop_layer import EPropLearning
from .layertext import LayerAttrs, allocate, model_ref, plan, recurrent_text
from .module import STEP_MODES, NeuronModule, _Base
from .recurrent_delays import DelayedRecurrence

CONNECTIVITY = ("all", "one_to_one")
_CONNECTIVITY_ALIASES = {"all_to_all": "all", "dense": "all", "one-to-one": "one_to_one", "1to1": "one_to_one",
                         "elementwise": "one_to_one"}
_AUTOCASTABLE = (torch.float32, torch.float16, torch.bfloat16)  # (what autocast converts)


class _NeuronView:
    """What the recurrent layer reads and writes of its `NeuronModule` (its model, params and
    kept states)."""

    def __init__(self, neuron: NeuronModule) -> None:
        self.m = neuron

    @property
    def compiled(self):
        return self.m.__dict__["_compiled"]  # (NeuronModule.compiled, without its property call)

    def error(self, msg: str, pos: A.Pos | None = None, hint: str | None = None) -> FlexDSLError:
        return self.m._error(msg, pos, hint)

    def params(self, prog: Any, like: torch.Tensor, step_shape: torch.Size, flat: int) -> list[Any]:
        """Every param's value for a call on `[flat, hidden]` lanes (the layer's batch dims
        flattened) run by `prog` on tensors like `like`, derived params included: floats, or
        tensors broadcasting to `[flat, hidden]` (the neuron module's rule, `params.step_param`);
        checked as the neuron's own call checks them (`runtime/callcheck.py`: also under
        torch.compile, and after in-place changes), a bounded one inside its bounds in the call's
        dtype and the one it computes in."""
        m = self.m
        values = m._call_params(prog, like)
        values = m._check_param_shapes(values, like, step_shape, "the layer's step shape ([*batch, hidden])",
                                       "a value per neuron has shape (hidden,): param_shapes={'<name>': (hidden,)}")
        out = [v.expand(step_shape).reshape(flat, step_shape[-1]) if isinstance(v, torch.Tensor) and v.dim() > 1
               else v for v in values]
        return m.compiled.with_derived(out)

    def states(self, like: torch.Tensor, step_shape: torch.Size, flat: int) -> list[Any]:
        """The kept (or initial) states for a call, as floats or `[flat, hidden]` tensors."""
        vals = self.m._states_for(like, step_shape, None)
        return [v.expand(step_shape).reshape(flat, step_shape[-1]) if isinstance(v, torch.Tensor) and v.dim() > 0
                else (float(v) if not isinstance(v, torch.Tensor) else v.reshape(()).expand(flat, step_shape[-1]))
                for v in vals]

    def keep(self, finals: Sequence[torch.Tensor], step_shape: torch.Size) -> None:
        for name, v in zip(self.m._state_names, finals):
            self.m._states[name] = v.reshape(step_shape)

    def refuse_unsupported(self) -> None:
        """The neuron's call options a layer has no way to honour: a located error, never ignored."""
        for name in ("check_finite", "store_state_seqs"):
            if getattr(self.m, name, False):
                raise self.error(f"the neuron has `{name}` on, which recurrent layers do not support", None,
                                 f"turn it off (m.neuron.{name} = False), or run the neuron module on its own")

    def initial_states_floats(self) -> bool:
        return all(v is None for v in self.m._states.values())


class RecurrentModule(LayerAttrs, DelayedRecurrence, EPropLearning, _Base):  # type: ignore[valid-type,misc]
    """A recurrent layer of `hidden` neurons of one model (see `flexdsl.recurrent`).

    `m(x)`: `x` is `[T, *batch, in_features]` (step_mode "m") or `[*batch, in_features]` ("s");
    returns the model's output (or a tuple, in `output` order), `[T, *batch, hidden]`. A model
    with several inputs takes the others after `x`, each broadcasting to `[T, *batch, hidden]`.
    Parameters: `W_in` `[hidden, in_features]`, `W_rec` (`[hidden, hidden]` or `[hidden]`),
    `bias` `[hidden]` and the neuron's own (`m.neuron`). States: the neuron's (`m.neuron.v`...)
    and `m.feedback`, the source's value of the last step (zeros before the first);
    `m.reset()` (or SpikingJelly's `functional.reset_net`) clears them all.
    """

    def __init__(self, neuron: NeuronModule, in_features: int | None, hidden: int, connectivity: str = "all",
                 mask: Any = None, source: str | None = None, port: str | None = None, bias: bool = True,
                 step_mode: str = "m", backend: str = "auto", layer_text: str | None = None,
                 layer_plan: tuple[CheckedLayer, LayerPlan] | None = None, delays: dict[str, Any] | None = None,
                 learning: str = "bptt", readout: Any = None, feedback: Any = "symmetric") -> None:
        super().__init__()
        view = _NeuronView(neuron)
        view.refuse_unsupported()
        c = neuron.compiled
        ck = c.checked
        where = ck.ast.pos
        hidden = _positive_int(view, "hidden", hidden, where)
        if in_features is not None:
            in_features = _positive_int(view, "in_features", in_features, where)
        conn = _CONNECTIVITY_ALIASES.get(connectivity, connectivity) if isinstance(connectivity, str) else None
        if conn not in CONNECTIVITY:
            raise view.error(f"connectivity must be 'all' or 'one_to_one', not {connectivity!r}", where,
                             did_you_mean(str(connectivity), CONNECTIVITY) or
                             "'all': W_rec [hidden, hidden]; 'one_to_one': a weight per neuron, W_rec [hidden]")
        if step_mode not in STEP_MODES:
            raise view.error(f"step_mode must be 's' or 'm', not {step_mode!r}", where)
        if backend != "auto" and backend in backends.names():  # (a backend without layer scans: who has them)
            why = backends.refusal(backend, Need(scans=True))
            if why is not None:
                raise view.error(why, where, "use backend='auto' (the scan that fits the input), or one of those named")
        known = ["auto", *backends.able(Need(scans=True))]
        if backend not in known:
            raise view.error(f"backend must be one of {', '.join(known)}, not {backend!r}", where,
                             did_you_mean(str(backend), known))
        port, source = _port_and_source(view, port, source)
        inputs = [i.name for i in ck.inputs]
        shape = (hidden, hidden) if conn == "all" else (hidden,)
        if mask is not None:
            mask = _mask(view, mask, shape, conn, hidden, where)
        d = self.__dict__
        # the layer this is (`m.layer_text`), through the layer level: checked, planned; the scan is
        # made from the plan's `scan` (port, source, connectivity)
        taken = [*inputs, *(p.name for p in ck.params), *(st.name for st in ck.states)]
        connect = "dense" if conn == "all" else "one_to_one"
        d["layer_text"] = layer_text or recurrent_text(model_ref(neuron), taken,
                                                       in_features, hidden, connect, source, port, bias)
        d["_layer"], d["_plan"] = layer_plan or plan(d["layer_text"], "<flexdsl.recurrent>", neuron)
        d["_view"] = view
        d["_states"] = {"feedback": None}
        if _Base is not nn.Module:  # SpikingJelly's MemoryModule: `feedback` is a memory
            d["_memories"] = d["_states"]
            d["_memories_rv"] = {"feedback": None}
        self.neuron = neuron
        self.in_features = in_features
        self.hidden = hidden
        self.connectivity = conn
        self.port = port
        self.source = source
        self.step_mode = step_mode
        self.backend = backend
        names = _names(d["_plan"])
        d["_alias"] = {k: v for k, v in names.items() if k != v}  # W_in, W_rec, bias -> the layer file's names
        lay = d["_layer"]
        w_in = allocate(lay, (hidden, in_features), "the input weights") if in_features is not None else None
        self.register_parameter(names["W_in"], nn.Parameter(w_in) if w_in is not None else None)
        self.register_parameter(names["W_rec"], nn.Parameter(allocate(lay, shape, "the recurrent weights")))
        self.register_parameter(names["bias"], nn.Parameter(allocate(lay, (hidden,), "the bias")) if bias else None)
        self.register_buffer("mask", mask)
        d["_kept"] = {}  # the delayed input synapses' last steps (their state)
        d["_in_delay"] = next((s for s in d["_layer"].synapses if s.delay_kind is not None and not s.recurrent), None)
        d["_rec_delay"] = next((s for s in d["_layer"].synapses if s.delay_kind is not None and s.recurrent), None)
        self._register_delays(dict(delays or {}))
        self._setup_learning(learning, readout, feedback)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """`nn.Linear`'s initialisation: W_in and bias uniform in ±1/sqrt(in_features) (bias: ±1/sqrt(hidden)
        without W_in), W_rec in ±1/sqrt(fan-in) (hidden for 'all', 1 for 'one_to_one'); masked entries 0."""
        with torch.no_grad():
            if self.W_in is not None:
                nn.init.kaiming_uniform_(self.W_in, a=math.sqrt(5))
            fan = self.hidden if self.connectivity == "all" else 1
            self.W_rec.uniform_(-1 / math.sqrt(fan), 1 / math.sqrt(fan))
            if self.mask is not None:
                self.W_rec.mul_(self.mask.to(self.W_rec.dtype))
            if self.bias is not None:
                b = 1 / math.sqrt(self.in_features if self.in_features is not None else self.hidden)
                self.bias.uniform_(-b, b)

    def _layer_error(self, msg: str, hint: str | None = None) -> FlexDSLError:
        return self._view.error(msg, None, hint)

    # ------------------------------------------------------------------ states
    def __getattr__(self, name: str) -> Any:
        st = self.__dict__.get("_states")
        if st is not None and name in st:
            return st[name]
        alias = self.__dict__.get("_alias")
        if alias and name in alias:  # (W_in, W_rec, bias of a layer file that names them otherwise)
            name = alias[name]
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        st = self.__dict__.get("_states")
        if st is not None and name in st:
            if value is not None and (not isinstance(value, torch.Tensor) or not value.is_floating_point()):
                what = type(value).__name__ if not isinstance(value, torch.Tensor) else f"a {value.dtype} tensor"
                raise self._view.error(f"`{name}` takes a floating-point tensor [*batch, hidden] or None, not {what}",
                                       self._source_pos(), "e.g. m.feedback = torch.zeros(batch, hidden)")
            st[name] = value
            return
        if name in ("sparse_input", "plastic", "modulators"):  # (a feed-forward layer's, set on this one)
            raise self._layer_error(f"`{name}` is a feed-forward layer's option", "use flexdsl.feedforward for it")
        alias = self.__dict__.get("_alias") or {}
        if alias:  # (the layer file's names and W_in, W_rec, bias are one parameter each)
            name = alias.get(name, name)
        canon = next((k for k, v in alias.items() if v == name), name)
        if name == "mask" and "mask" in self.__dict__.get("_buffers", {}):
            value = self._new_mask(value)
        elif value is None and (canon == "W_rec" or (canon == "W_in" and self.__dict__.get("in_features") is not None)):
            raise self._view.error(f"`{canon}` cannot be None: this layer (in_features={self.in_features}, "
                                   f"hidden={self.hidden}) multiplies by it at every step", self._source_pos(),
                                   f"assign a tensor of its shape, e.g. m.{canon}.data.zero_() for no weights")
        super().__setattr__(name, value)

    def _new_mask(self, value: Any) -> torch.Tensor | None:
        """A mask assigned after construction, checked like the one given to it (kept as bool)."""
        if value is None:
            return None
        shape = (self.hidden, self.hidden) if self.connectivity == "all" else (self.hidden,)
        return _mask(self._view, value, shape, self.connectivity, self.hidden, self._view.compiled.checked.ast.pos)

    def reset(self) -> None:
        """Back to the initial states: the neuron's, and zeros for `feedback`."""
        self._states["feedback"] = None
        self._kept.clear()
        self.neuron.reset()

    def detach(self) -> None:
        """Cut the kept states from the graph of earlier calls (truncated BPTT)."""
        v = self._states["feedback"]
        if isinstance(v, torch.Tensor):
            self._states["feedback"] = v.detach()
        for k, v in self._kept.items():
            self._kept[k] = v.detach()
        self.neuron.detach()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_decided", None)  # (a loaded program: decided again after unpickling)
        state.pop("_steppers", None)  # (e-prop's step functions: made again)
        state["_states"] = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self._states.items()}
        state["_kept"] = {k: v.detach() for k, v in self._kept.items()}
        if "_memories" in state:
            state["_memories"] = state["_states"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        nn.Module.__setstate__(self, state)
        if _Base is not nn.Module:
            self.__dict__["_memories"] = self._states
            self.__dict__["_memories_rv"] = {"feedback": None}
            self.__dict__.setdefault("_step_mode", state.get("step_mode", "m"))

    # ------------------------------------------------------------------ compute
    def _source_pos(self) -> A.Pos:
        """Where the fed-back output is declared (the `output` line): what `feedback` holds."""
        ck = self._view.compiled.checked
        return next((p for n, p in ck.outputs if n == self.source), ck.outputs[0][1])

    def _input_error(self, msg: str, hint: str | None = None) -> FlexDSLError:
        ck = self._view.compiled.checked
        decl = next(i for i in ck.inputs if i.name == self.port)
        return self._view.error(msg, decl.pos, hint)

    def forward(self, x: Any, *others: Any, seed: Any = None, generator: Any = None):
        """`seed=`/`generator=`: where a noisy model's draws of this call come from (as for the neuron's
        own module: the layer's [*batch, hidden] elements are the neuron's)."""
        view = self._view
        view.refuse_unsupported()
        ck = view.compiled.checked
        names = [i.name for i in ck.inputs]
        if len(others) != len(names) - 1:
            rest = [n for n in names if n != self.port]
            raise TypeError(f"this recurrent {ck.name} layer takes {len(rest) + 1} input"
                            f"{'s' if rest else ''}: x (into W_in, for `{self.port}`)"
                            + "".join(f", `{n}`" for n in rest) + f"; got {1 + len(others)}")
        single = self.step_mode == "s"
        xs = self._check_input(x, single)
        if not torch.compiler.is_compiling() and any_transformed((xs, *others, *self.parameters())):
            raise self._input_error("torch.func transforms (grad, vmap, jacrev, functional_call under grad) are not "
                                    "available on recurrent layers: their time loop is one autograd Function",
                                    "differentiate with loss.backward() / torch.autograd.grad; torch.func works on a "
                                    "neuron module (flexdsl.load) with the torch backend")
        dev = xs.device
        dtype = self._check_weights(xs)
        T, batch, H = xs.shape[0], xs.shape[1:-1], self.hidden
        flat = math.prod(batch)
        step_shape = torch.Size((*batch, H))
        wts = self._weights()
        w_in, bias = wts["W_in"], wts["bias"]
        if self.__dict__["_in_delay"] is not None:
            xs, w_in, bias = self._delayed_input(xs, w_in, bias)
        x3 = xs.reshape(T, flat, xs.shape[-1]).contiguous()
        if x3 is not xs and known_binary(xs):
            mark_binary(x3)  # (the same 0/1 values: kept as bits for the backward)
        w_rec, mask = wts["W_rec"], wts["mask"]
        w = (w_rec if mask is None else w_rec * mask.to(w_rec.dtype)).to(dtype)
        inputs = self._other_inputs(others, names, single, (T, flat, H), step_shape, dtype, dev)
        s0_zero = self._states["feedback"] is None  # (zeros made here: exact, nothing to check)
        s0 = self._initial_feedback(step_shape, flat, dtype, dev)
        if self.__dict__["_rec_delay"] is not None:
            res = self._delayed_loop(x3, w_in, bias, w, s0, inputs, step_shape, seed, generator)
            res = [r[0] for r in res] if single else res
            return res[0] if len(res) == 1 else tuple(res)
        like = torch.empty((), dtype=dtype, device=dev)
        outputs = [n for n, _ in ck.outputs]
        scan = self._plan.scan  # (the layer's loop, as its plan has it)
        dense, port, source = scan.dense, scan.port, scan.source
        # (under torch.compile the scan is chosen and loaded at trace time, before anything reads
        # the model's lazily computed fields; eagerly, the choice is checked first)
        eprop = self.__dict__["_eprop"] is not None and self.training  # (e-prop: runtime/eprop_layer.py)
        if not eprop:  # (a plain call moves the states: an eligibility kept from before no longer fits them)
            self.__dict__["_kept"].pop("eligibility", None)
        prog = self._scan_for(like, port, source, dense) if not eprop or self._eprop_scans(like) else None
        params = view.params(prog, like, step_shape, flat)
        states = view.states(like, step_shape, flat)
        if eprop:
            outs, fins, last = self._eprop_call(x3, w_in, bias, w, s0, inputs, states, params, (prog, dense, s0_zero))
            if T:
                view.keep(fins, step_shape)
                self._states["feedback"] = last.detach().reshape(step_shape).clone()  # (e-prop: no graph across calls)
            res = [o.reshape(T, *step_shape) for o in outs]
            res = [r[0] for r in res] if single else res
            return res[0] if len(res) == 1 else tuple(res)
        noise = view.m._noise_key(T, seed, generator, False)
        outs, fins = scans.scan(prog, x3, w_in, bias, w, s0, inputs, states, params, dense, noise, s0_zero=s0_zero)
        view.m._noise_advance(noise, T)
        if T:
            view.keep(fins, step_shape)
            # (a copy: the returned output and the kept feedback never share memory)
            self._states["feedback"] = outs[outputs.index(self.source)][-1].reshape(step_shape).clone()
        res = [o.reshape(T, *step_shape) for o in outs]
        if single:
            res = [r[0] for r in res]
        return res[0] if len(res) == 1 else tuple(res)

    def _check_input(self, x: Any, single: bool) -> torch.Tensor:
        """The layer's input as [T, *batch, features], or a located error."""
        if not isinstance(x, torch.Tensor):
            raise self._input_error(f"the layer's input must be a torch.Tensor, not {type(x).__name__}",
                                    "e.g. torch.as_tensor(values, dtype=torch.float32)")
        if not x.is_floating_point():
            raise self._input_error(f"the layer's input has dtype {x.dtype}; it must be floating point",
                                    "pass x.float()")
        if x.dim() < (1 if single else 2):
            raise self._input_error(f"the layer's input must be {'[*batch, features]' if single else '[T, *batch, features]'}"
                                    f" in step_mode {self.step_mode!r}, got shape {tuple(x.shape)}",
                                    "use step_mode='s' for one step at a time" if not single else None)
        feat = self.in_features if self.in_features is not None else self.hidden
        if x.shape[-1] != feat:
            what = f"in_features={feat}" if self.in_features is not None else f"hidden={feat} (no W_in)"
            raise self._input_error(f"the layer's input has {x.shape[-1]} features in its last dim, but the layer "
                                    f"was built with {what}", "the input is [T, *batch, in_features]")
        return x.unsqueeze(0) if single else x

    def _check_weights(self, xs: torch.Tensor) -> torch.dtype:
        """The weights' shapes, device and dtype against the layer's and the input's (a weight
        replaced by one of another shape would broadcast, or be read out of bounds by a kernel);
        the dtype the neurons run in (the input's, or autocast's, which the input product runs in)."""
        dev = xs.device
        H, conn = self.hidden, self.connectivity
        want = {"W_in": (H, self.in_features), "W_rec": (H, H) if conn == "all" else (H,), "bias": (H,),
                "mask": (H, H) if conn == "all" else (H,)}
        named = list(self._weights().items())
        for name, p in named:
            if p is None:
                if name == "W_rec" or (name == "W_in" and self.in_features is not None):
                    raise self._input_error(f"`{name}` is None, but this layer (in_features={self.in_features}, "
                                            f"hidden={H}) multiplies by it at every step",
                                            f"register a Parameter of shape {want[name]} as m.{name}")
                continue
            if not isinstance(p, torch.Tensor) or tuple(p.shape) != want[name]:
                got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
                raise self._input_error(f"`{name}` is {got}, but this layer (in_features={self.in_features}, hidden={H}, "
                                        f"connectivity={conn!r}) needs {want[name]}",
                                        "assign a tensor of that shape (or build a new layer for another size)")
        if named[3][1] is not None:
            self._check_mask_values()
        weights = [p for n, p in named if p is not None and n != "mask"]
        for p in weights:
            if p.device != dev:
                raise self._input_error(f"the input is on {dev} but the layer's weights are on {p.device}",
                                        "move the layer: m.to(device)")
        autocast = torch.is_autocast_enabled(dev.type) if dev.type in ("cuda", "cpu") else False
        if autocast and named[0][1] is not None:  # (the input product runs in autocast's dtype, W_rec cast to it)
            for p in (xs, *weights):
                if p.dtype not in _AUTOCASTABLE:
                    what = "the input is" if p is xs else "the layer's weights are"
                    raise self._input_error(f"{what} {p.dtype}, which autocast does not convert (float32, float16 "
                                            "and bfloat16 only)", "convert the layer and the input: m.float(), "
                                            "x.float()")
            return torch.get_autocast_dtype(dev.type)
        for p in weights:
            if p.dtype != xs.dtype:
                raise self._input_error(f"the input is {xs.dtype} but the layer's weights are {p.dtype}",
                                        f"convert one of them: m.to({xs.dtype}) or x.to({p.dtype})"
                                        + (" (or run under torch.autocast)" if self.W_in is not None else ""))
        return xs.dtype

    def _weights(self) -> dict[str, Any]:
        """W_in, W_rec, bias and mask, read from the module's dicts (no `__getattr__` per name: the
        layer's call stays as light as a neuron's)."""
        P, B, D = self._parameters, self._buffers, self.__dict__
        a = D.get("_alias") or _NO_ALIAS
        return {n: P[m] if m in P else B[m] if m in B else D.get(m)
                for n, m in [(n, a.get(n, n)) for n in ("W_in", "W_rec", "bias", "mask")]}

    def _check_mask_values(self) -> None:
        """The mask holds 0/1 values (checked when it changed: a new tensor, or written in place)."""
        m = self.mask
        if m.dtype == torch.bool or torch.compiler.is_compiling():
            return
        seen = (m.data_ptr(), m._version, m.dtype, m.device)
        if self.__dict__.get("_mask_seen") == seen:
            return
        if not _zeros_and_ones(m):
            raise self._input_error("`mask` must hold 0/1 (or bool) values", _MASK_HINT)
        self.__dict__["_mask_seen"] = seen

    def _other_inputs(self, others, names, single, shape3, step_shape, dtype, dev) -> list[Any]:
        """The model's inputs other than the port, as [T, B, H] tensors (None at the port)."""
        ck = self._view.compiled.checked
        T, flat, H = shape3
        inputs: list[Any] = []
        it = iter(others)
        for n in names:
            if n == self.port:
                inputs.append(None)
                continue
            o = next(it)
            decl = next(i for i in ck.inputs if i.name == n)
            if not isinstance(o, torch.Tensor) or not o.is_floating_point():
                raise self._view.error(f"input `{n}` must be a floating-point torch.Tensor", decl.pos)
            o = o.unsqueeze(0) if single else o
            try:
                o = o.to(device=dev, dtype=dtype).expand(T, *step_shape)
            except RuntimeError:
                raise self._view.error(f"input `{n}` has shape {tuple(o.shape)}, which does not broadcast to "
                                       f"{(T, *step_shape)} ([T, *batch, hidden])", decl.pos) from None
            inputs.append(o.reshape(T, flat, H))
        return inputs

    def _initial_feedback(self, step_shape, flat, dtype, dev) -> torch.Tensor:
        """The source's value before this call's first step: kept, given, or zeros."""
        fb = self._states["feedback"]
        if fb is None:
            return torch.zeros((flat, self.hidden), dtype=dtype, device=dev)
        if not fb.is_floating_point():  # (complex: its imaginary part would be dropped)
            raise self._view.error(f"`feedback` is a {fb.dtype} tensor; it must be floating point", self._source_pos(),
                                   "assign a real tensor (or None: zeros), e.g. m.feedback = torch.zeros(batch, hidden)")
        if fb.shape != step_shape or fb.device != dev:
            raise self._view.error(f"`feedback` has shape {tuple(fb.shape)} on {fb.device} (from an earlier call, or "
                                   f"as given), but this input's step shape is {tuple(step_shape)} on {dev}",
                                   self._source_pos(),
                                   "call m.reset() (or spikingjelly's functional.reset_net) before a batch of "
                                   "another size")
        return fb.reshape(flat, self.hidden).to(dtype)

    def _scan_for(self, like: torch.Tensor, port: int, source: int, dense: bool) -> Any:
        """The call's scan, decided once per call signature (the neuron's compiled model, backend,
        device, dtype, port, source, connectivity) and kept by the module; under torch.compile
        resolved at trace time (`programs.recurrent_for`)."""
        view = self._view
        c = view.compiled
        if torch.compiler.is_compiling():
            return programs.recurrent_for(c, view.m._compiled_name, self.backend, like, port, source, dense)
        key = (self.backend, like.device, like.dtype, port, source, dense)
        hit = self.__dict__.get("_decided")
        if hit is not None and hit[0] is c and hit[1] == key:
            if not hit[3]:  # (the scan's backend declares no backward)
                self._refuse_training()
            return hit[2]
        backend = self._backend_for(like)
        prog = programs.recurrent_for(c, view.m._compiled_name, backend, like, port, source, dense)
        self.__dict__["_decided"] = (c, key, prog, backends.capabilities(backends.get(backend)).training)
        return prog

    def _refuse_training(self) -> None:
        """A located error where the call needs gradients from a scan that declares no backward."""
        if self.backend == "auto" or not torch.is_grad_enabled():
            return
        if not backends.capabilities(backends.get(self.backend)).training and \
                any(p.requires_grad for p in self.parameters()):
            raise self._input_error(backends.refusal(self.backend, Need(training=True)) or "",
                                    "use backend='auto', or one of those named")

    def _backend_for(self, ix: torch.Tensor) -> str:
        """The scan of a call on tensors like `ix`: the one asked for (a located error where it has
        not declared what the call needs), or for "auto" the first that fits."""
        need = Need.of(ix, scans=True, noise=self._view.compiled.checked.stochastic)
        if self.backend != "auto":
            b = backends.get(self.backend)
            why = backends.refusal(self.backend, need)
            own = getattr(b, "refusal", None)
            detail = own(ix) if own is not None else None
            if why is not None:
                raise self._input_error(why, detail[1] if detail is not None else
                                        "use backend='auto' (the scan that fits the input), or one of those named")
            if detail is not None:
                raise self._input_error(*detail)
            self._refuse_training()
            return self.backend
        return scans.choose("auto", ix, need)

    def extra_repr(self) -> str:
        c = self._view.compiled
        return (f"{c.name}, in_features={self.in_features}, hidden={self.hidden}, connectivity={self.connectivity!r}, "
                f"source={self.source!r}, port={self.port!r}, bias={self.bias is not None}, "
                f"mask={self.mask is not None}, step_mode={self.step_mode!r}, backend={self.backend!r}")


_NO_ALIAS: dict[str, str] = {}


def _names(plan: LayerPlan) -> dict[str, str]:
    """The names of W_in, W_rec and bias in the layer (a layer file names its synapses)."""
    names = {"W_in": "W_in", "W_rec": "W_rec", "bias": "bias"}
    for s in plan.synapses:
        names["W_rec" if s.recurrent else "W_in"] = s.name
        if s.bias is not None:
            names["bias"] = s.bias
    return names


def _port_and_source(view: _NeuronView, port: str | None, source: str | None) -> tuple[str, str]:
    """The input that receives the recurrent current and the output fed back (defaults: the first
    input; the spike, else the first output), or located errors."""
    ck = view.compiled.checked
    where = ck.ast.pos
    inputs = [i.name for i in ck.inputs]
    if not inputs:
        raise view.error(f"`{ck.name}` has no input, so nothing can receive the recurrent current", where,
                         "declare one: `input x`")
    if port is None:
        port = inputs[0]
    if not isinstance(port, str) or port not in inputs:
        raise view.error(f"`{ck.name}` has no input `{port}` to receive the recurrent current", ck.inputs[0].pos,
                         did_you_mean(str(port), inputs) or f"its inputs: {', '.join(inputs)}")
    # the source: the output fed back
    outputs = [n for n, _ in ck.outputs]
    if source is None:
        source = "spike" if "spike" in outputs else outputs[0]
    if not isinstance(source, str) or source not in outputs:
        out_pos = ck.outputs[0][1]
        states = [s.name for s in ck.states]
        if source in states or source in ck.locals:
            raise view.error(f"the recurrent source must be an output of `{ck.name}`; `{source}` is not one",
                             out_pos, f"add it to the `output` line (output {', '.join([*outputs, source])}), "
                                      f"or feed back one of: {', '.join(outputs)}")
        raise view.error(f"`{ck.name}` has no output `{source}` to feed back", out_pos,
                         did_you_mean(str(source), outputs) or f"its outputs: {', '.join(outputs)}")
    return port, source


def _positive_int(view: _NeuronView, name: str, v: Any, where: A.Pos) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise view.error(f"{name} must be a positive int, not {v!r}", where,
                         "in_features=None feeds the input (of size hidden) to the neurons without W_in"
                         if name == "in_features" else None)
    return int(v)


_MASK_HINT = "it keeps (1) or removes (0) a recurrent weight; scale weights through W_rec"


def _zeros_and_ones(m: torch.Tensor) -> bool:
    return not m.is_complex() and bool(((m == 0) | (m == 1)).all())


def _mask(view: _NeuronView, mask: Any, shape: tuple[int, ...], conn: str, hidden: int, where: A.Pos) -> torch.Tensor:
    try:
        m = torch.as_tensor(mask)
    except (TypeError, ValueError, RuntimeError):
        raise view.error(f"`mask` must be a tensor of 0/1 (or bool) values, not {type(mask).__name__}", where) from None
    if tuple(m.shape) != shape:
        raise view.error(f"`mask` has shape {tuple(m.shape)}, but hidden={hidden} with connectivity={conn!r} needs "
                         f"{shape}", where, "mask[i, j] = 1 keeps the weight from neuron j to neuron i"
                         if conn == "all" else "one_to_one: a 0/1 value per neuron")
    if m.dtype != torch.bool and not _zeros_and_ones(m):
        raise view.error("`mask` must hold 0/1 (or bool) values", where, _MASK_HINT)
    return m.to(torch.bool)  # (kept as bool: no write into it, `.data` included, can make it rescale W_rec)


__all__ = ["RecurrentModule", "CONNECTIVITY"]
