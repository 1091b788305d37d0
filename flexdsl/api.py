"""The public functions: load, loads, recurrent, compile, library."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import FlexDSLError
from .library import is_layer_text, is_rule_text, library, not_a_model, resolve, rules
from .runtime.compiler import Compiled, compile_model
from .runtime.options import make as make_options

if TYPE_CHECKING:
    from .runtime.layer import FeedForwardModule
    from .runtime.module import NeuronModule
    from .runtime.recurrent import RecurrentModule
    from .runtime.rule import Rule


def compile(model: str | Path, detach_reset: bool = False, *, surrogate: Any = None,  # noqa: A001 - the API name
            learnable: Any = None) -> Compiled:
    """The compiled artefacts of a model (a path, a library stem, or model text), with the
    load-time options of `load` (`surrogate=`, `learnable=`); every error of the model, the
    lowering's included, is raised here."""
    c = compile_with(model, detach_reset, surrogate, learnable)
    c.step  # noqa: B018 - lower now, so that errors surface at compile time
    return c


def compile_with(model: str | Path, detach_reset: bool, surrogate: Any, learnable: Any,
                 surrogate_function: Any = None) -> Compiled:
    """The model compiled with its load-time options (`surrogate_function=` is SpikingJelly's
    name of `surrogate=`, which its model zoo passes to `spiking_neuron`)."""
    if surrogate_function is not None:
        if surrogate is not None:
            c = compile_model(model, detach_reset)
            raise FlexDSLError("both surrogate= and surrogate_function= were given (the same option)", c.filename,
                               hint="pass one of them")
        surrogate = surrogate_function
    opts = make_options(surrogate, learnable, lambda: compile_model(model, detach_reset))
    return compile_model(model, detach_reset, opts)


def load(
    model: str | Path,
    *,
    step_mode: str = "m",
    backend: str = "auto",
    detach_reset: bool = False,
    store_state_seqs: bool = False,
    param_shapes: Mapping[str, Sequence[int]] | None = None,
    check_finite: bool = False,
    surrogate: Any = None,
    learnable: Any = None,
    surrogate_function: Any = None,
    store_v_seq: bool | None = None,
    **params: Any,
) -> NeuronModule:
    """A trainable torch.nn.Module from a `.neuron` path or a library stem; keyword
    arguments other than the options override params (checked against `where`).
    `check_finite=True` (also `m.check_finite = True` later) raises a located error at the first
    NaN or inf of a call, naming the state, the step and the element.

    Shaping the model where it is used (the generated code and `flexdsl show` state the choice):
    `surrogate=` the spike's surrogate gradient, as text (`"atan(alpha=2.0)"`) or a SpikingJelly
    or snnTorch surrogate object (`surrogate_function=`, SpikingJelly's name, does the same);
    `learnable=` the params to train (a name, a list, or True/False for all/none), instead of the
    file's `learnable` flags. A learnable param with a `where` bound trains as the Parameter
    `raw_<name>` through a parametrization that keeps it inside (`tau > 1`: `1 + softplus(raw_tau)`).
    `store_v_seq=True` (SpikingJelly's name) is `store_state_seqs=True`.

    A plasticity rule (a `.rule` file or text, or a library rule such as `"stdp_additive"` given as
    `"stdp_additive.rule"`) loads as its `Rule` module (`flexdsl.load_rule` takes library names bare);
    the keywords are its params.

    A layer (a `.layer` file or text, or a library layer such as `"rlif.layer"`) loads as its module
    (`FeedForwardModule` or `RecurrentModule`); `hidden=`, `in_features=` (an int, or sizes by
    input name) and `masks=` give what the file leaves out, the other keywords shape its neuron."""
    from .runtime.module import NeuronModule

    if _is_rule(model):
        from .runtime.rule import load_rule

        return load_rule(model, learnable=learnable, **params)  # type: ignore[return-value]
    layer = _layer_text(model)
    if layer is not None:
        from .runtime.layer import load_layer

        if store_state_seqs or store_v_seq or check_finite or surrogate_function is not None:
            raise FlexDSLError("store_state_seqs, check_finite and surrogate_function are options of a neuron "
                               "module, not of a layer", layer[1], hint="load the neuron with flexdsl.load for them")
        return load_layer(*layer, step_mode=step_mode, backend=backend, detach_reset=detach_reset,
                          param_shapes=param_shapes, surrogate=surrogate, learnable=learnable, **params)

    c = compile_with(model, detach_reset, surrogate, learnable, surrogate_function)
    return NeuronModule(c, params, step_mode, backend, store_state_seqs or bool(store_v_seq), param_shapes,
                        check_finite)


def _is_rule(model: Any) -> bool:
    return (isinstance(model, str) and is_rule_text(model)) or (
        isinstance(model, str | Path) and str(model).endswith(".rule"))


def load_rule(model: str | Path, *, learnable: Any = None, **params: Any) -> Rule:
    """A plasticity rule's module (`runtime/rule.py`): `model` a library rule's name (`"stdp_additive"`;
    `flexdsl.rules()` lists them), a `.rule` file's path or its text; keywords override its params.
    `rule.window(pre, post, W)` is the weight change of a window with `W` held (SpikingJelly's
    multi-step learners), `rule.online(pre, post, W)` the weight after each step's change applied
    (Brian2's synapses); `rule.reset()` clears its traces. `learnable=` names the constants to train
    (a name, a list, True: all): the change then differentiates into them (meta-learning a rule)."""
    from .runtime.rule import load_rule as make

    return make(model, learnable, **params)


def _layer_text(model: Any) -> tuple[str, str] | None:
    """(text, filename) where `model` is a layer (its text, a `.layer` path, a library layer)."""
    if isinstance(model, str) and is_layer_text(model):
        return model, "<string>"
    if isinstance(model, str | Path) and str(model).endswith(".layer"):
        return resolve(model)
    return None


def loads(text: str, **kwargs: Any) -> NeuronModule:
    """Like `load`, from model text."""
    if not isinstance(text, str):
        raise not_a_model(text, "text", text_only=True)
    if "\n" not in text:
        text = text + "\n"
    return load(text, **kwargs)


def recurrent(
    model: str | Path | NeuronModule,
    in_features: int | None,
    hidden: int,
    *,
    connectivity: str = "all",
    mask: Any = None,
    source: str | None = None,
    port: str | None = None,
    bias: bool = True,
    step_mode: str = "m",
    backend: str = "auto",
    detach_reset: bool = False,
    param_shapes: Mapping[str, Sequence[int]] | None = None,
    surrogate: Any = None,
    learnable: Any = None,
    learning: str = "bptt",
    readout: Any = None,
    feedback: Any = "symmetric",
    **params: Any,
) -> RecurrentModule:
    """A recurrent layer of `hidden` neurons of `model` (a path, a library stem, or a loaded
    module): at every step the model's input `port` (default: its first input) receives
    `W_in x[t] + W_rec s[t-1] + bias`, `s` being the output `source` (default: `spike`).
    `connectivity="all"` (W_rec [hidden, hidden], times `mask` if given) or `"one_to_one"`
    (W_rec [hidden]); `in_features=None` adds the input (of size hidden) without W_in. Keyword
    arguments other than the options override the model's params; `surrogate=` and `learnable=`
    shape the neuron as in `load`. The time loop is compiled: the Triton kernels on CUDA, the torch
    backend elsewhere.

    `learning="eprop"`: in training mode the layer learns by e-prop (Bellec et al. 2020) instead of
    backpropagation through time: eligibility traces derived from the model run forward with the
    steps and are kept across calls (a stream can be cut into calls, each with its own loss and
    backward, at memory independent of its length); the learning signal is the gradient reaching
    the layer's output. `readout=` (n_out, or an `nn.Linear(hidden, n_out)`) gives the layer
    `m.readout`; `feedback="random"` (or a fixed `[n_out, hidden]` tensor) sends the readout's
    error back through that matrix instead of its weights (random e-prop)."""
    from .runtime.layer import recurrent as make

    return make(model, in_features, hidden, connectivity=connectivity, mask=mask, source=source, port=port,
                bias=bias, step_mode=step_mode, backend=backend, detach_reset=detach_reset,
                param_shapes=param_shapes, surrogate=surrogate, learnable=learnable, learning=learning,
                readout=readout, feedback=feedback, **params)


def feedforward(model: str | Path | NeuronModule, in_features: int, hidden: int, *, connectivity: str = "dense",
                mask: Any = None, port: str | None = None, bias: bool = True, step_mode: str = "m",
                backend: str = "auto", detach_reset: bool = False, param_shapes: Mapping[str, Sequence[int]] | None = None,
                surrogate: Any = None, learnable: Any = None, delay: Any = None, max_delay: Any = None,
                learnable_delays: Any = False, delays: Any = None, rule: str | Path | None = None,
                plasticity: str = "window", rule_params: Mapping[str, Any] | None = None,
                sparse_input: bool = False, **params: Any) -> FeedForwardModule:
    """`Linear(in_features, hidden)` into `hidden` neurons of `model`, as one module: at every step the
    model's input `port` (default: its first input) receives `W x[t] + bias`. `connectivity="dense"`
    (W [hidden, in_features]), `"mask"` (times the 0/1 `mask`) or `"one_to_one"` (W [hidden], with
    in_features == hidden). The products run before the neuron's time loop (one over all steps), the
    neuron on its own kernels; keyword arguments shape the neuron as in `load`. Delays, as a layer
    file's `delay` line writes them: `delay=3` (every connection), `delay="synaptic"` (or "axonal",
    "dendritic") with `max_delay=20`, `learnable_delays=True` (gauss) or "linear", `delays=` their
    values (a tensor; `m.W_delay` after). Plasticity: `rule=` a rule (a library rule's name or a
    `.rule` path) that changes `W` at every call, `plasticity="window"` (W held over a call, the change
    added after it) or `"online"` (W changes every step), `rule_params=` the rule's params.
    `sparse_input=True`: where the input is mostly zeros (spikes at a low rate; at most
    `FLEXDSL_SPARSE_DENSITY`, default 5 %, of its entries nonzero), the product is taken from its
    nonzero entries on the GPU, fused with the neuron's steps where no gradient is wanted: the call's
    time falls with the spike rate (one count read back per call decides; denser inputs run dense)."""
    from .runtime.layer import feedforward as make

    return make(model, in_features, hidden, connectivity=connectivity, mask=mask, port=port, bias=bias,
                step_mode=step_mode, backend=backend, detach_reset=detach_reset, param_shapes=param_shapes,
                surrogate=surrogate, learnable=learnable, delay=delay, max_delay=max_delay,
                learnable_delays=learnable_delays, delays=delays, rule=rule, plasticity=plasticity,
                rule_params=rule_params, sparse_input=sparse_input, **params)


def conv_layer(model: Any, in_channels: int, out_channels: int, kernel_size: Any, **options: Any) -> Any:
    """`Conv2d(in_channels, out_channels, kernel_size) -> BatchNorm2d -> model` as one module for
    `[T, B, C, H, W]` inputs that keeps little for its backward: its 0/1 input as bits and, with
    `recompute="norm"` (default), the normalization's output made again in the backward (`"product"`:
    the convolution's output too; None: neither); gradients bit for bit those of the three modules.
    Options: `stride`, `padding`, `dilation`, `groups`, `bias` (False), `norm` (True), `eps`,
    `momentum`, `backend`, and the neuron's load options (`surrogate=`, `detach_reset=`, params...)."""
    from .runtime.convlayer import conv_layer as make

    return make(model, in_channels, out_channels, kernel_size, **options)


__all__ = ["compile", "conv_layer", "feedforward", "library", "load", "load_rule", "loads", "recurrent", "rules"]
