"""The runtime's module: `NeuronModule`, the torch.nn.Module a model is loaded as.

It owns the params (Parameters, buffers or plain floats) and the states between calls, and
talks to the backends only through their interface (`backends.base`): it chooses a backend
from the registry, and passes inputs, states and params explicitly to its program.

What it guarantees to a caller: inputs are floating-point tensors on one device that agree
on T and broadcast to one step shape; a state kept from an earlier call must fit the new
input (else a clear error asks for `reset()`); every `where` constraint holds after any
assignment and after `load_state_dict`; non-learnable params travel in checkpoints (extra
state); the module pickles, deep-copies and `torch.compile`s like any torch module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import backends
from ..backends.base import Need
from ..errors import FlexDSLError, did_you_mean
from ..frontend import ast as A
from ..frontend.evaluate import evaluate
from . import bounds as bound_values
from . import display, programs
from .bits import mark_binary
from .callcheck import CallChecks
from .callcheck import register as register_check
from .calls import CallArgs, vmapped
from .checkpoints import Checkpoints
from .compiler import Compiled, compile_text, reset_detached
from .noise import NoiseSource, seed_ops
from .params import bits, broadcasts_to, common_shape, resolve_params
from .slots import ParamSlots

STEP_MODES = ("s", "m")


def _base_class() -> type[nn.Module]:
    """SpikingJelly's `MemoryModule` where SpikingJelly is installed (so that its
    `functional.reset_net`, `set_step_mode` and `detach_net` treat flexdsl neurons as their own,
    without warnings), else `nn.Module`. The states are the MemoryModule's memories."""
    import importlib.util

    if importlib.util.find_spec("spikingjelly") is None:
        return nn.Module
    try:
        from spikingjelly.activation_based.base import MemoryModule
    except Exception:  # a broken installation: flexdsl works without it
        return nn.Module
    return MemoryModule


_Base = _base_class()


# the attributes `NeuronModule.__init__` sets on an instance besides torch's own (which are set before the names
# are checked); tests/test_errors.py checks that a loaded module has no other
SET_IN_INIT = frozenset({"backend", "check_finite", "state_seqs", "store_state_seqs"})


def _check_names(m: NeuronModule) -> None:
    """Each param and state reads as itself: Python finds a class attribute (torch's, SpikingJelly's
    or flexdsl's own) or an attribute the module sets before `__getattr__` would return the model's
    value, so such a name is refused at load, whatever the checker's list of names (`catalog.
    MODULE_ATTRIBUTES`, which the docs print) holds."""
    import inspect

    ck = m._compiled.checked
    for decl, kind in [*((p, "a param") for p in ck.params), *((s, "a state") for s in ck.states)]:
        missing = object()
        if (decl.name in m.__dict__ or decl.name in SET_IN_INIT
                or inspect.getattr_static(type(m), decl.name, missing) is not missing):
            raise m._error(f"`{decl.name}` cannot name {kind}: the loaded torch module has an attribute "
                           f"`{decl.name}`", decl.pos, f"choose another name (e.g. `{decl.name}_`): params and "
                           "states are attributes of the module")


def _check_options(c: Compiled, step_mode: str, backend: str) -> None:
    """`step_mode` and `backend` as `NeuronModule` takes them (a backend that can run here)."""
    if step_mode not in STEP_MODES:
        raise FlexDSLError(f"step_mode must be 's' or 'm', not {step_mode!r}", c.filename)
    known = ["auto", *backends.names()]
    if backend not in known:
        raise FlexDSLError(f"backend must be one of {', '.join(known)}, not {backend!r}", c.filename,
                           hint=did_you_mean(str(backend), known))
    if backend != "auto" and not backends.get(backend).available():
        why = getattr(backends.get(backend), "why_unavailable", lambda: None)()
        raise FlexDSLError(f"backend={backend!r} cannot run here ({why or 'its libraries cannot be imported'})",
                           c.filename, hint=f"install them, or use backend='auto' or '{backends.REFERENCE}'")
    if backend != "auto" and c.checked.stochastic:
        why = backends.refusal(backend, Need(noise=True))
        if why is not None:
            raise FlexDSLError(why, c.filename, c.checked.noise_pos.line, c.checked.noise_pos.column, c.text,
                               hint="use backend='auto', or one of those named")


class NeuronModule(ParamSlots, Checkpoints, CallArgs, CallChecks, NoiseSource, _Base):  # type: ignore[valid-type,misc]
    """A neuron layer generated from a `.neuron` model.

    `m(*inputs)`: inputs are `[T, *shape]` (step_mode "m") or `[*shape]` ("s"); returns the
    single output or a tuple in `output` order. States are readable by name after a call.
    `m(*inputs, state)` and `m.step(*inputs, state=...)` are the functional form: they take
    and return the states as a dict and leave the module's own states alone.
    """

    def __init__(
        self,
        compiled: Compiled,
        params: Mapping[str, Any] | None = None,
        step_mode: str = "m",
        backend: str = "auto",
        store_state_seqs: bool = False,
        param_shapes: Mapping[str, Sequence[int]] | None = None,
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        c = compiled
        ck = c.checked
        d = self.__dict__
        d["_compiled"] = c
        d["_compiled_name"] = programs.register(c)
        _check_names(self)
        self._derive_fields()
        d["_fixed"] = {}
        d["_values"] = {}  # tensors that torch tools put in a learnable param's place (runtime/slots.py)
        # the float params again, as one float64 tensor (an entry per declared param): what a
        # torch.compile trace reads, so that their values are graph inputs, not guards
        d["_fixed_t"] = torch.zeros(len(self._param_decls), dtype=torch.float64)
        d["_states"] = dict.fromkeys(self._state_names)
        if _Base is not nn.Module:  # SpikingJelly's MemoryModule: the states are its memories
            d["_memories"] = d["_states"]
            d["_memories_rv"] = dict.fromkeys(self._state_names)
        d["state_seqs"] = {}
        _check_options(c, step_mode, backend)
        self.step_mode = step_mode
        self.backend = backend
        self.store_state_seqs = store_state_seqs
        self.check_finite = check_finite  # raise at the first NaN/inf of a call (runtime/finite.py)
        shapes = self._param_shapes(param_shapes)
        if params is not None and not isinstance(params, Mapping):
            raise self._error(f"params must be a dict of param values, not {type(params).__name__}")
        values = resolve_params(c, dict(params or {}))
        bounded = {}
        stored: dict[str, Any] = {}
        for p in ck.params:
            v = values[p.name]
            t: torch.Tensor | None = None
            if p.name in shapes:
                t = torch.as_tensor(v, dtype=torch.float64)
                if not broadcasts_to(t.shape, shapes[p.name]):
                    raise self._error(f"param_shapes gives `{p.name}` the shape {shapes[p.name]}, but its value has "
                                      f"shape {tuple(t.shape)}", p.pos, "a value broadcasts to the shape it is given")
                t = t.expand(shapes[p.name]).clone()
            elif isinstance(v, torch.Tensor):
                t = v.detach().to(torch.float64).clone()
            stored[p.name] = t if t is not None else v
            if t is not None:  # (a tensor joins: the shapes must still broadcast; numbers always do)
                common_shape(c, stored)
            if p.learnable:
                init = t if t is not None else torch.tensor(float(v), dtype=torch.float64)
                if p.name in ck.bounds:
                    bounded[p.name] = init
                else:
                    self.register_parameter(p.name, nn.Parameter(init.to(torch.get_default_dtype())))
            elif t is not None:
                self.register_buffer(p.name, t)
            else:
                d["_fixed"][p.name] = float(v)
        for name, init in bounded.items():  # (their bounds may use any param's value)
            b = ck.bounds[name]
            if not bound_values.inside(b, init, values):
                raise self._on_bound(name, init)
            # (float64, as per-channel values and derived params are: a value set reads back as set;
            # the param's shape, as any learnable param has)
            self.register_parameter(b.raw, nn.Parameter(self._raw_for(name, init, values, init)))
        self._sync_fixed()
        self._check_invariants()
        self._prepare(None)

    def _derive_fields(self) -> None:
        """Fields that follow from the compiled model (rebuilt after unpickling)."""
        d = self.__dict__
        ck = self._compiled.checked
        d["_param_decls"] = {p.name: p for p in ck.params}
        d["_state_names"] = [s.name for s in ck.states]
        outs = [n for n, _ in ck.outputs]  # (the spike output is 0/1: a product of it saves bits, bits.py)
        d["_spike_out"] = outs.index("spike") if ck.spike is not None and "spike" in outs else None
        d["_stochastic"] = ck.stochastic  # (the model draws random numbers: runtime/noise.py)
        if ck.stochastic:
            seed_ops()  # (defined here, outside any trace: a traced call draws its seed through them)
        d["_input_decls"] = list(ck.inputs)
        d["_init_cache"] = {}
        d["_dtypes_checked"] = set()  # (compute dtypes the params were checked in since they changed)
        d["_check_key"] = register_check(self)  # (where a compiled call's check finds it: runtime/callcheck.py)

    # ------------------------------------------------------------------ errors
    def _error(self, msg: str, pos: A.Pos | None = None, hint: str | None = None) -> FlexDSLError:
        c = self._compiled
        if pos is None:
            return FlexDSLError(msg, c.filename, hint=hint)
        return FlexDSLError(msg, c.filename, pos.line, pos.column, c.text, hint)

    # ------------------------------------------------------------------ attributes
    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name in d.get("_fixed", {}):
            return d["_fixed"][name]
        if name in d.get("_states", {}):
            v = d["_states"][name]
            return self._initial_value(name) if v is None else v
        decls = d.get("_param_decls", {})
        if name in decls and name not in self._parameters and name not in self._buffers:
            if name in d.get("_values", {}):
                return d["_values"][name]
            if name in self._bounds:
                return self._param_list()[list(decls).index(name)]
        if name.endswith("_seq") and name[:-4] in d.get("_states", {}) and name not in decls:
            return self._state_seq(name[:-4])
        return super().__getattr__(name)

    def __delattr__(self, name: str) -> None:
        values = self.__dict__.get("_values", {})
        if name in values:  # (a wrapper's tensor, removed with the wrapper)
            del values[name]
            self._params_changed()
            return
        super().__delattr__(name)

    def _state_seq(self, state: str) -> torch.Tensor:
        """`m.v_seq`: the sequence of state `v` over the last call (SpikingJelly's name), with
        store_state_seqs=True."""
        seqs = self.__dict__.get("state_seqs", {})
        if state in seqs:
            return seqs[state]
        if not self.store_state_seqs:
            raise AttributeError(f"`{state}_seq` (the sequence of state `{state}` over a call) is kept with "
                                 "store_state_seqs=True (SpikingJelly's store_v_seq)")
        raise AttributeError(f"`{state}_seq` is set by a call (store_state_seqs=True); this module has not "
                             "been called since it was created or reset")

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if name in d.get("_param_decls", {}):
            self._assign_param(name, value)
            return
        if name in d.get("_states", {}):
            d["_states"][name] = self._state_value(name, value, "assigned")
            return
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        # a copy keeps the states' values, not the autograd graph of the call that made them
        state = self.__dict__.copy()
        for k in ("_param_decls", "_state_names", "_input_decls", "_init_cache", "_dtypes_checked",
                  "_compiled_name", "_stochastic", "_check_key", "_checked_fp"):
            state.pop(k, None)
        state["_states"] = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self._states.items()}
        if "_memories" in state:
            state["_memories"] = state["_states"]
        state["state_seqs"] = {k: v.detach() for k, v in self.state_seqs.items()}
        state["_values"] = {k: v.detach() for k, v in self.__dict__.get("_values", {}).items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        nn.Module.__setstate__(self, state)
        if _Base is not nn.Module:  # (also for a module pickled where SpikingJelly was not installed)
            self.__dict__["_memories"] = self._states
            self.__dict__["_memories_rv"] = dict.fromkeys(self._states)
            self.__dict__.setdefault("_step_mode", state.get("step_mode", "m"))
        self._derive_fields()
        self.__dict__["_compiled_name"] = programs.register(self._compiled)  # (this process's name)
        self.__dict__.setdefault("_values", {})
        if "_fixed_t" not in self.__dict__:  # (pickled by a flexdsl without it)
            self.__dict__["_fixed_t"] = torch.zeros(len(self._param_decls), dtype=torch.float64)
        self._sync_fixed()

    # ------------------------------------------------------------------ states
    @property
    def state_names(self) -> list[str]:
        """The model's states, in declaration order."""
        return list(self._state_names)

    def _initial_value(self, name: str) -> Any:
        st = next(s for s in self._compiled.checked.states if s.name == name)
        try:
            return evaluate(st.init, self.param_values())
        except (ArithmeticError, ValueError) as e:
            raise self._error(f"the initial value of `{name}` cannot be evaluated with these params: {e}",
                              st.init.pos) from None

    def _initial_values(self) -> dict[str, Any]:
        """Initial values from the current params (cached while every param is a float; in a
        torch.compile trace, from the params as tensors, so that no float param is read)."""
        if torch.compiler.is_compiling():
            env = dict(zip(self._param_decls, self._traced_param_list()))
            return {s.name: evaluate(s.init, env) for s in self._compiled.checked.states}
        # (keyed by the floats' bits: 0.0 and -0.0 may start a state differently)
        key = bits(self._fixed.values()) if not self._parameters and not self._buffers else None
        hit = self._init_cache.get(key) if key is not None else None
        if hit is None:
            hit = {s: self._initial_value(s) for s in self._state_names}
            if key is not None and not torch.compiler.is_compiling():  # no side effects in a trace
                if len(self._init_cache) > 64:
                    self._init_cache.clear()
                self._init_cache[key] = hit
        return hit

    def initial_state(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every state at its initial value, shaped for these inputs (one step's shape, in the
        inputs' dtype and device): the `state` of the functional form `m(x, state)`."""
        xs, shape = self._check_inputs(inputs)
        x0 = xs[0]
        out = {}
        for name, v in self._initial_values().items():
            if isinstance(v, torch.Tensor):
                v = self._initial_shaped(name, v, shape).to(device=x0.device, dtype=x0.dtype)
            out[name] = torch.zeros(shape, dtype=x0.dtype, device=x0.device) + v
        return out

    def reset(self) -> None:
        """Restore the initial states (SpikingJelly's `functional.reset_net` calls this)."""
        for k in self._states:
            self._states[k] = None
        self.state_seqs = {}
        self._noise_reset()  # (a noisy model's next call draws a new seed)

    def detach(self) -> None:
        """Cut the kept states from the graph of earlier calls (truncated BPTT; SpikingJelly's
        `functional.detach_net` calls this)."""
        for k, v in self._states.items():
            if isinstance(v, torch.Tensor):
                self._states[k] = v.detach()
        self.state_seqs = {k: v.detach() for k, v in self.state_seqs.items()}

    def _apply(self, fn, recurse: bool = True):
        """`.to()`, `.cuda()`, `.half()`... also move the kept states, and prepare the kernels of
        the device the module moves to (so that a first call under torch.compile finds them)."""
        out = nn.Module._apply(self, fn, recurse)  # (MemoryModule._apply would move the states once more)
        self._dtypes_checked.clear()  # (.half() rounds the buffers: checked again at the next call)
        for k, v in self._states.items():  # in place: the dict is also SpikingJelly's memories
            if isinstance(v, torch.Tensor):
                self._states[k] = fn(v)
        self.__dict__["state_seqs"] = {k: fn(v) for k, v in self.state_seqs.items()}
        try:  # (where a tensor of the module goes: `.to(memory_format=...)` or `.half()` keep it where it is)
            device = fn(torch.empty(0, device=self._fixed_t.device)).device
        except (RuntimeError, TypeError):
            return out
        if device.type != "meta":  # (the float params stay float64: only their device follows)
            self.__dict__["_fixed_t"] = self._fixed_t.to(device)
        try:
            self._prepare(device)
        except (RuntimeError, TypeError):
            pass
        return out

    def _prepare(self, device: torch.device | None) -> None:
        """Load the programs a call will use, outside any torch.compile trace: the chosen backend,
        or for "auto" the kernels when a CUDA device is in sight."""
        c = self._compiled
        if self.backend != "auto":
            c.program(self.backend)
            return
        c.program(backends.REFERENCE)
        cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
        if cuda:
            for name in backends.auto_names():
                b = backends.get(name)
                if name != backends.REFERENCE and b.available():
                    c.program(b)

    # ------------------------------------------------------------------ compute
    @property
    def compiled(self) -> Compiled:
        return self._compiled

    @property
    def neuron_text(self) -> str:
        """The `.neuron` text this module was compiled from (`flexdsl.compile(text)` gives it back)."""
        return self._compiled.text

    @property
    def detach_reset(self) -> bool | tuple[str, ...]:
        """Whether the reset sees the spike detached from the graph (set at load; assigning it
        switches to the other compiled variant): True, False, or the names of the states whose
        reset does (`detach_reset="v"`)."""
        return self._compiled.detach_reset

    @detach_reset.setter
    def detach_reset(self, value: bool) -> None:
        c = self._compiled
        value = reset_detached(value, c.filename)
        if value != c.detach_reset:
            self.__dict__["_compiled"] = compile_text(c.text, c.filename, value, c.options)
            self.__dict__["_compiled_name"] = programs.register(self._compiled)
            self._params_changed()
            self._prepare(None)

    def _core_params(self, values: Sequence[Any] | None = None) -> list[Any]:
        """The params `core` takes: the declared ones (`values`, default the module's), then
        those derived from them."""
        if values is None:
            values = self._param_list()
        out = []
        for v in self._compiled.with_derived(values):
            out.append(torch.tensor(v, dtype=torch.float64) if isinstance(v, float) else v)
        return out

    @property
    def core(self):
        """The generated single-step function with the module's params (read at each call):
        core(*inputs, *states) -> (*outputs, *new_states)."""
        fn = self._compiled.reference_module.core
        if self._compiled.checked.stochastic:
            return self._noisy_core(fn)

        def core(*args):
            return fn(*args, *self._core_params())

        return core

    def _run(self, inputs: Sequence[Any], given: Mapping[str, Any] | None, store_seqs: bool, seed: Any = None,
             generator: Any = None):
        xs, shape = self._check_inputs(inputs)
        x0 = xs[0]
        noise = self._noise_key(x0.shape[0], seed, generator, given is not None)
        program = programs.program_for(self._compiled, self._compiled_name, self.backend, x0)
        if id(program) in programs.UNTRAINED:  # (gradients from a backend without a backward: a clear error)
            programs.refuse_training(self._compiled, self.backend, lambda: (*xs, *self.parameters()))
        params = self._call_params(program, x0)  # (checked: runtime/callcheck.py)
        if self._parameters or self._buffers:
            params = self._check_param_shapes(params, x0, shape)
        init = self._states_for(x0, shape, given, getattr(program, "reads_any_float", False))
        if self.check_finite:  # gradients too: a NaN or inf reaching an input, state or param (runtime/finite.py)
            from .finite import guard

            xs, init, params = guard(self._compiled, xs, init, params)
        params = self._compiled.with_derived(params)
        try:
            res = program.run(xs, init, params, store_seqs=store_seqs or bool(self.check_finite),
                              **({"noise": noise} if noise is not None else {}))
        except RuntimeError:
            escaped = [n for n, v in zip(self._state_names, init) if given is None and vmapped(v)]
            if escaped:  # (looked for only on failure: nothing on the path of a call)
                raise self._error(f"the kept state `{escaped[0]}` comes from a call inside torch.func.vmap, and "
                                  "cannot be used outside it", hint="call m.reset() after a vmapped call, or use "
                                  "the functional form out, state = m.step(x, state) inside vmap") from None
            raise
        if self.check_finite:
            from .finite import check

            check(self._compiled, xs, init, params, res)
            if not store_seqs:
                res.seqs = None
        if given is None:
            self._noise_advance(noise, x0.shape[0])
        outs = [o[0] for o in res.outputs] if self.step_mode == "s" else res.outputs
        return (outs[0] if len(outs) == 1 else tuple(outs)), res

    def forward(self, *inputs: Any, seed: Any = None, generator: Any = None):
        """`seed=`/`generator=`: where a noisy model's draws of this call come from (runtime/noise.py)."""
        if len(inputs) == len(self._input_decls) + 1 and (inputs[-1] is None or isinstance(inputs[-1], Mapping)):
            return self.step(*inputs[:-1], state=inputs[-1], seed=seed, generator=generator)
        out, res = self._run(inputs, None, bool(self.store_state_seqs), seed, generator)
        for name, s in zip(self._state_names, res.states):
            self._states[name] = s
        if res.seqs is not None:
            self.state_seqs = dict(zip(self._state_names, res.seqs))
        k = self._spike_out
        if k is not None:
            mark_binary(out if not isinstance(out, tuple) else out[k])
        return out

    def step(self, *inputs: Any, state: Mapping[str, Any] | None = None, seed: Any = None, generator: Any = None):
        """The functional form: `out, state = m.step(x, state)` runs the inputs from `state`
        (a dict of the model's states; None or empty: initial values) and returns the outputs
        and the new state, leaving the module's kept states untouched. Params are read live;
        on CUDA a multi-step input runs on the Triton kernels."""
        if len(inputs) == len(self._input_decls) + 1 and (inputs[-1] is None or isinstance(inputs[-1], Mapping)):
            inputs, state = inputs[:-1], inputs[-1]
        if state is not None and not isinstance(state, Mapping):
            raise self._error(f"`state` must be a dict of the model's states, not {type(state).__name__}",
                              hint=f"states: {', '.join(self._state_names)}; see m.initial_state(x)")
        if state:
            unknown = [k for k in state if k not in self._states]
            if unknown:
                raise self._error(f"`{unknown[0]}` is not a state of {self._compiled.name}",
                                  hint=did_you_mean(str(unknown[0]), self._state_names) or
                                  f"states: {', '.join(self._state_names)}")
            state = {k: self._state_value(k, v, "as given") for k, v in state.items()}
        out, res = self._run(inputs, dict(state) if state else {}, False, seed, generator)
        return out, dict(zip(self._state_names, res.states))

    def _repr_html_(self) -> str | None:
        """Notebooks: the model's documentation, with this module's param values."""
        return display.show("html", self)

    def _repr_latex_(self) -> str | None:
        return display.show("latex", self)

    def extra_repr(self) -> str:
        c = self._compiled
        fixed = ", ".join(f"{k}={v:g}" for k, v in self._fixed.items())
        opts = f", {c.options.python_args()}" if c.options else ""
        return (f"{c.name} from {c.filename}: step_mode={self.step_mode!r}, backend={self.backend!r}, "
                f"detach_reset={self.detach_reset}{opts}" + (f", {fixed}" if fixed else ""))


