"""Plasticity rules at run time: a `.rule` file's module (`flexdsl.load("stdp.rule")`), run on its
own over given spike trains or by a layer on one of its synapse groups.

    rule = flexdsl.load("stdp")                      # a library rule (or a path, or the text)
    dW = rule.window(pre, post, W)                   # weights held over the window: the summed change
    W = rule.online(pre, post, W)                    # every step changes the weights the next one sees

Two semantics, both the rule's step (`frontend/rule.py`: equations, update, on pre, on post):

- *window* (SpikingJelly's multi-step learners): the weights are held over the call; each step's
  change is computed from them and the changes are summed over time and batch; the caller (or the
  layer) adds the sum once. Where the change factors (`ir/rule.py`), the traces run per neuron and
  the sum is one matrix product per term over all `T*batch` samples; otherwise the step runs per
  synapse and sample.
- *online* (Brian2's): after every step the weights take the step's change (summed over the batch:
  each sample's statements run on its own copy of the weight, the copies' changes are added), then
  the bounds; the next step reads the new weights.

The states (traces, eligibilities) are kept across calls, so a stream cut into calls equals one
call; `reset()` clears them. Params are the rule's (`rule.tau_pre`); `learnable` ones are
`nn.Parameter`s and the window's change (or the online weights) differentiate through the rule
(autograd over the generated step: meta-learning a rule's constants).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import FlexDSLError, did_you_mean
from ..frontend import ast as A
from ..frontend.evaluate import evaluate
from ..frontend.parse import normalize, parse_rule
from ..frontend.rule import CheckedRule, check_rule
from ..library import resolve_rule
from ..store.pipeline import unit_definition
from . import ruleparams as rp
from .compiler import Compiled
from .params import resolve_params
from .rulesteps import on_device

MODES = ("window", "online")


class RuleIR(Compiled):
    """A rule through the compiler: checked as a rule, lowered and emitted as the neuron model it is."""

    def __init__(self, text: str, filename: str, learnable: tuple[str, ...] | None = None) -> None:
        """(Not Compiled's: the text is a rule.) `learnable`: the params to train, in place of the
        file's `learnable` flags (None: as written): they are the IR's, so its derived backward and
        every cache key made from it have them."""
        from ..frontend.options import NONE, LoadOptions

        self.text = text
        self.filename = filename
        self.detach_reset = False
        self.options = NONE if learnable is None else LoadOptions(learnable=tuple(sorted(learnable)))
        ast = parse_rule(text, filename)
        if learnable is not None:
            ast = dataclasses.replace(ast, items=[dataclasses.replace(it, learnable=it.name in learnable)
                                                  if isinstance(it, A.Param) else it for it in ast.items])
        self.rule: CheckedRule = check_rule(ast, unit_definition)
        self.checked = self.rule.model
        self.checked.bounds = {}  # (a rule's learnable constants train as they are: no reparametrization)
        self._programs = {}
        import threading

        self._lock = threading.Lock()
        self._derived_cache = {}

    def with_learnable(self, names: set[str]) -> RuleIR:
        """This rule with exactly `names` learnable (itself where the file says so already)."""
        if names == {p.name for p in self.checked.params if p.learnable}:
            return self
        return RuleIR(self.text, self.filename, tuple(sorted(names)))

    @property
    def learnable_chosen(self) -> tuple[str, ...] | None:
        """The learnable params chosen at load (None: as the file says)."""
        learn = self.options.learnable
        return None if learn is None else tuple(learn)  # type: ignore[arg-type]

    def generated(self) -> tuple[Any, dict[str, Any]]:
        """The generated module of the rule and its meta (`backends/torch/rule.py`)."""
        from ..backends.rules import rule_module

        return rule_module(self, self.cache_key("torch-rule"))

    def source(self, backend: str | None = None) -> str:
        """The generated module's source (readable Python: `flexdsl show x.rule`); with a backend's
        name, that backend's module of the rule's step as a neuron model (`Compiled.source`: the
        reference step the derived backward, `core_backward`, goes with)."""
        if backend is not None:
            return super().source(backend)
        from ..backends.rules import rule_source

        return rule_source(self, self.cache_key("torch-rule"))


def _coupling(eqs: A.Equations) -> tuple[A.ODE | None, A.Name | None]:
    """The first ODE that reads another ODE's state (through the block's named expressions too), and
    the name it reads (None, None: none does)."""
    states = {ln.state for ln in eqs.lines if isinstance(ln, A.ODE)}
    named = {ln.name: ln.value for ln in eqs.lines if isinstance(ln, A.Subexpr)}
    for ode in (ln for ln in eqs.lines if isinstance(ln, A.ODE)):
        todo, seen = [ode.value], set()
        while todo:
            for n in A.names(todo.pop()):
                if n.id in states and n.id != ode.state:
                    return ode, n
                if n.id in named and n.id not in seen:
                    seen.add(n.id)
                    todo.append(named[n.id])
    return None, None


def compile_rule(model: str | Path, learnable: Any = None) -> RuleIR:
    """A rule through the compiler; `learnable=` the constants to train instead of the file's flags
    (a name, a list, True/False: as `load_rule`), which its derived backward then has."""
    text, filename = resolve_rule(model)
    ir = RuleIR(normalize(text), filename)
    return ir if learnable is None else ir.with_learnable(rp.chosen(ir, learnable))


class Rule(nn.Module):
    """A plasticity rule's module (see the module docstring). `m.window(pre, post, w, **modulators)`,
    `m.online(pre, post, w, **modulators)`, `m.carry(pre)` (a rule with an `output`: the values the
    synapse carries), `m.bounds()`, `m.reset()`."""

    def __init__(self, ir: RuleIR, params: Mapping[str, Any] | None = None, learnable: Any = None) -> None:
        super().__init__()
        self.__dict__["ir"] = ir
        self.__dict__["_gen"] = ir.generated()
        mod, meta = self._gen
        if ir.checked.params and len(meta["params"]) != len(ir.checked.params):
            ode, read = _coupling(ir.checked.equations)
            where = read.pos if read is not None else ir.checked.equations.pos
            couple = f" (`{ode.written}/dt` reads `{read.id}`)" if read is not None else ""
            raise ir.rule.error(f"this rule's equations couple states{couple}: a rule's traces are integrated one by "
                                "one, not as a system (a matrix exponential)", where,
                                "write each trace's ODE on its own, of its own state and the inputs")
        bad = [n for n in meta["output_reads"] if n == "post" or n.startswith("post_")
               or meta["sides"].get(n, "pre") != "pre"]
        if bad:
            out = ir.rule.ast.of(A.Output)[0]
            raise ir.rule.error(f"the rule's output `{ir.rule.output}` reads `{bad[0]}`, which is not a presynaptic "
                                "value: what a synapse carries is computed before its postsynaptic neuron steps",
                                out.pos, "compute the output from `pre` and presynaptic states only")
        values = resolve_params(ir, dict(params or {}))
        rp.one_number_each(ir, values)
        self.__dict__["_fixed"] = {}
        train = rp.chosen(ir, learnable, rp.reached(ir, meta))
        ir = ir.with_learnable(train)  # (the IR's own flags: its derived backward has the chosen params)
        self.__dict__["ir"] = ir
        self.__dict__["_gen"] = ir.generated()
        mod, meta = self._gen
        rp.refuse_unreached(ir, train, meta)
        self.__dict__["_derived"] = rp.derived_of(ir, train, set(params or {}))
        for p in ir.checked.params:
            v = values[p.name]
            if p.name in train:
                self.register_parameter(p.name, nn.Parameter(torch.as_tensor(v, dtype=torch.get_default_dtype())))
            else:
                self._fixed[p.name] = v
        self.__dict__["_states"] = {}
        self.bounds()  # (bounds that cannot hold: an error at load)

    # ------------------------------------------------------------------ params, states
    @property
    def name(self) -> str:
        return self.ir.rule.name

    @property
    def weight_name(self) -> str:
        return self.ir.rule.weight

    @property
    def modulators(self) -> tuple[str, ...]:
        """The inputs a call takes by keyword: modulators, and `post_<x>` values per postsynaptic neuron."""
        return self.ir.rule.modulators

    @property
    def post_inputs(self) -> tuple[str, ...]:
        return self.ir.rule.post_inputs

    @property
    def has_output(self) -> bool:
        return bool(self._gen[1]["output"])

    @property
    def _read_before(self) -> set[str]:
        args = self._gen[1]["args"]
        return set(args.get("terms_a", [])) | set(args.get("terms_b", []))

    @property
    def changes_weight(self) -> bool:
        """Whether the rule's statements change the weight (short-term plasticity does not)."""
        return bool(self._gen[1]["changes_weight"])

    @property
    def separable(self) -> bool:
        """Whether a window's change is products over time and batch (see `ir/rule.py`)."""
        return bool(self._gen[1]["separable"])

    @property
    def sides(self) -> dict[str, str]:
        """Where each state lives: `pre`, `post`, `global` (per sample) or `synapse`."""
        return dict(self._gen[1]["sides"])

    def __getattr__(self, name: str) -> Any:
        fixed = self.__dict__.get("_fixed", {})
        if name in fixed:  # (one computed from a learnable param: from its present value)
            return rp.values(self)[name] if name in self.__dict__.get("_derived", ()) else fixed[name]
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__.get("_fixed", {}):  # (a value given: no longer computed from others)
            derived = self.__dict__.get("_derived", ())
            self.__dict__["_derived"] = tuple(n for n in derived if n != name)
            vals = {k: v for k, v in self._fixed.items() if k not in derived}
            vals[name] = value
            new = resolve_params(self.ir, vals)
            rp.one_number_each(self.ir, {name: new[name]})
            self._fixed[name] = new[name]
            return
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its text (the compiled parts are rebuilt on load, from the disk cache)."""
        state = self.__dict__.copy()
        ir = state.pop("ir")
        state.pop("_gen")
        state["_rule_text"] = (ir.text, ir.filename, ir.learnable_chosen)
        state["_states"] = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self._states.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        text, filename, *learn = state.pop("_rule_text")
        ir = RuleIR(text, filename, learn[0] if learn else None)
        self.__dict__.update(state)
        self.__dict__["ir"] = ir
        self.__dict__["_gen"] = ir.generated()

    def get_extra_state(self) -> dict[str, Any]:
        """The fixed params' values (a `state_dict` saves them; learnable ones are Parameters)."""
        return {"params": {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                           for k, v in self._fixed.items() if k not in self.__dict__.get("_derived", ())}}

    def set_extra_state(self, state: Any) -> None:
        if isinstance(state, dict) and isinstance(state.get("params"), dict):
            for k, v in state["params"].items():
                if k in self._fixed:
                    setattr(self, k, v)

    def param_values(self) -> dict[str, Any]:
        """The params by name (a learnable one its Parameter; one computed from it, recomputed)."""
        return rp.values(self)

    def _apply(self, fn: Any, recurse: bool = True) -> Rule:
        """`.to(device)`, `.cuda()`... also move the kept states (their dtype follows each call's:
        `_state`, so a half-precision module's traces stay float32)."""
        out = super()._apply(fn, recurse)
        for k, v in self._states.items():
            if isinstance(v, torch.Tensor):
                try:
                    self._states[k] = v.to(fn(torch.empty(0, device=v.device)).device)
                except (RuntimeError, TypeError):
                    pass
        return out

    def reset(self) -> None:
        """Clear the states (traces, eligibilities): the next call starts from their initial values."""
        self._states.clear()

    def detach(self) -> None:
        """Cut the kept states from the graph of earlier calls (a stream trained in pieces)."""
        for k, v in self._states.items():
            self._states[k] = v.detach() if isinstance(v, torch.Tensor) else v

    def bounds(self) -> tuple[float | None, float | None]:
        """The weight's bounds (`weight w where LO <= w <= HI`), None where a side is open."""
        return rp.weight_bounds(self)

    def bound(self, w: torch.Tensor) -> torch.Tensor:
        """`w` within the weight's bounds (differentiable into a learnable param they read)."""
        return rp.clamp(w, *rp.clamp_bounds(self, w))

    # ------------------------------------------------------------------ calls
    def window(self, pre: torch.Tensor, post: torch.Tensor, w: torch.Tensor, **modulators: Any) -> torch.Tensor:
        """The weights' change over a window (`pre` `[T, *batch, n_pre]`, `post` `[T, *batch, n_post]`,
        `w` `[n_post, n_pre]` held over it): summed over time and batch, not applied. Half-precision
        weights: the traces and sums in float32, the change rounded once to the weight's dtype."""
        if isinstance(w, torch.Tensor) and w.dtype in _HALF:
            return self.window(_f32(pre), _f32(post), w.float(), **modulators).to(w.dtype)
        pre2, post2, mods = self._inputs(pre, post, w, modulators, "window")
        if not pre2.numel() or not post2.numel():  # (no steps, samples or neurons: no change, states kept)
            return torch.zeros_like(w)
        if self.separable:
            return self._window_products(pre2, post2, w, mods)
        return self._steps(pre2, post2, w, mods, online=False)

    def online(self, pre: torch.Tensor, post: torch.Tensor, w: torch.Tensor, **modulators: Any) -> torch.Tensor:
        """The weights after the steps, each step's change applied (then the bounds) before the next
        step reads them (post spikes given: the rule on recorded trains); half-precision weights as
        `window`'s (the steps in float32, the weights rounded once at the end)."""
        if isinstance(w, torch.Tensor) and w.dtype in _HALF:
            return self.online(_f32(pre), _f32(post), w.float(), **modulators).to(w.dtype)
        pre2, post2, mods = self._inputs(pre, post, w, modulators, "online")
        if not pre2.numel() or not post2.numel():
            return w.clone()
        if self.separable:
            return self._online_products(pre2, post2, w, mods)
        return self._steps(pre2, post2, w, mods, online=True)

    def carry(self, pre: torch.Tensor, **modulators: Any) -> torch.Tensor:
        """What a synapse with this rule carries instead of `pre` (a rule with an `output`, e.g.
        short-term plasticity's `u * x * pre`): `[T, *batch, n_pre]`. Advances the presynaptic states."""
        if not self.has_output:
            raise self.ir.rule.error(f"rule `{self.name}` has no `output`: its synapse carries `pre` itself", None,
                                     "add `output r` (a presynaptic value) to the rule to change what it carries")
        shape = pre.shape
        if not pre.numel():
            return pre.clone()
        pre2 = pre.reshape(shape[0], -1, shape[-1])
        mods = self._modulators(modulators, shape[0], pre2.shape[1], pre2, shape[1:-1])
        _, _, out = self._run_side("pre", pre2, mods, keep_traj=False)
        assert out is not None
        return out.reshape(shape)

    # ------------------------------------------------------------------ internals
    def _error(self, msg: str, hint: str | None = None) -> FlexDSLError:
        return self.ir.rule.error(msg, None, hint)

    def _inputs(self, pre: Any, post: Any, w: Any, modulators: Mapping[str, Any], what: str):
        for name, x in (("pre", pre), ("post", post), ("w", w)):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                raise self._error(f"{what}(): `{name}` must be a float tensor, not "
                                  f"{type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}",
                                  f"pass {name}=torch.as_tensor(values, dtype=torch.float32) (spikes as 0.0/1.0)")
        if w.dim() != 2:
            raise self._error(f"{what}(): the weight must be [n_post, n_pre], not {list(w.shape)}",
                              "pass the synapses' weight matrix, one row a postsynaptic neuron (nn.Linear's layout)")
        if pre.dim() < 2 or post.dim() != pre.dim() or pre.shape[:-1] != post.shape[:-1]:
            raise self._error(f"{what}(): `pre` [T, *batch, n_pre] and `post` [T, *batch, n_post] must share T and "
                              f"the batch, not {list(pre.shape)} and {list(post.shape)}",
                              "time first, then the batch dims, neurons last, the same T and batch on both sides")
        if pre.shape[-1] != w.shape[1] or post.shape[-1] != w.shape[0]:
            raise self._error(f"{what}(): a weight of shape {list(w.shape)} connects {w.shape[1]} presynaptic to "
                              f"{w.shape[0]} postsynaptic neurons; got pre {list(pre.shape)}, post {list(post.shape)}",
                              "the weight is [n_post, n_pre]: pre's last dim its columns, post's its rows")
        if pre.device != w.device or post.device != w.device:
            raise self._error(f"{what}(): `pre`, `post` and the weight must be on one device, not {pre.device}, "
                              f"{post.device} and {w.device}", f"move them: pre.to({str(w.device)!r}), ...")
        T, B = pre.shape[0], math.prod(pre.shape[1:-1])
        pre2 = pre.reshape(T, B, pre.shape[-1]).to(w.dtype)
        post2 = post.reshape(T, B, post.shape[-1]).to(w.dtype)
        return pre2, post2, self._modulators(modulators, T, pre2.shape[1], pre, pre.shape[1:-1], post.shape[-1])

    def _modulators(self, given: Mapping[str, Any], T: int, B: int, like: torch.Tensor,
                    batch: tuple[int, ...] | torch.Size | None = None, n_post: int | None = None,
                    later: tuple[str, ...] = ()) -> dict[str, Any]:
        """Each modulator as a number, or a `[T, B, 1]` tensor (given as a number, `[T]` or `[T, *batch]`);
        a `post_<x>` input a number or `[T, B, n_post]` (given as `[T, *batch, n_post]`)."""
        mods = self.modulators
        for k in given:
            if k not in mods:
                raise self._error(f"rule `{self.name}` has no modulator `{k}`",
                                  did_you_mean(k, list(mods)) or f"its modulators: {', '.join(mods) or 'none'}")
        out: dict[str, Any] = {}
        batch = tuple(batch if batch is not None else ())
        for k in mods:
            if k not in given and k in later:  # (given step by step: a layer's online loop)
                continue
            if k not in given:
                raise self._error(f"rule `{self.name}` reads the modulator `{k}` at every step; none was given",
                                  f"pass it: {k}=tensor of shape [T, *batch, n_post] (a value per postsynaptic "
                                  "neuron; in a layer, the neuron's own)" if k in self.post_inputs else
                                  f"pass it: {k}=tensor of shape [T] (one value a step) or [T, *batch]")
            v = given[k]
            if isinstance(v, bool) or not isinstance(v, (numbers.Real, torch.Tensor)) or (
                    isinstance(v, torch.Tensor) and v.is_complex()):  # (numbers.Real: NumPy's scalars too)
                raise self._error(f"modulator `{k}` must be a real number or tensor, not "
                                  f"{v.dtype if isinstance(v, torch.Tensor) else type(v).__name__}",
                                  f"pass a number, or a tensor: {k}=torch.as_tensor(values, dtype=torch.float32)")
            if isinstance(v, torch.Tensor) and v.dim() and v.device != like.device:
                raise self._error(f"modulator `{k}` is on {v.device}, the spikes on {like.device}",
                                  f"move it: {k}={k}.to({str(like.device)!r})")
            if not isinstance(v, torch.Tensor) or v.dim() == 0:
                out[k] = float(v) if not isinstance(v, torch.Tensor) else v.to(like.dtype)
                continue
            if k in self.post_inputs:
                if n_post is None or tuple(v.shape) != (T, *batch, n_post):
                    raise self._error(f"`{k}` has shape {list(v.shape)}; it is a value per postsynaptic neuron: "
                                      f"[T, *batch, n_post] = {[T, *batch, n_post] if n_post else '[T, *batch, n_post]'}",
                                      "e.g. the postsynaptic neurons' membrane potential at every step")
                out[k] = v.to(like.dtype).reshape(T, B, n_post)
                continue
            if tuple(v.shape) == (T,):
                out[k] = v.to(like.dtype).reshape(T, 1, 1).expand(T, B, 1)
            elif tuple(v.shape) == (T, *batch) and batch:
                out[k] = v.to(like.dtype).reshape(T, B, 1)
            else:
                raise self._error(f"modulator `{k}` has shape {list(v.shape)}; a call of {T} step(s) takes a number, "
                                  f"[T] = [{T}] or [T, *batch] = {[T, *batch]}",
                                  "one value per step (and per sample), the same for every synapse")
        return out

    def _state(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        v = self._states.get(name)
        if v is None:
            st = next(s for s in self.ir.checked.states if s.name == name)
            init = evaluate(st.init, {k: (float(x.detach()) if isinstance(x, torch.Tensor) and x.numel() == 1 else x)
                                      for k, x in self.param_values().items()})
            v = torch.full(shape, float(init), dtype=like.dtype, device=like.device)
        elif tuple(v.shape) != tuple(shape):
            raise self._error(f"the kept state `{name}` has shape {list(v.shape)}, this call needs {list(shape)} "
                              "(another batch size or layer size)", "call reset() between streams of other shapes")
        return v if v.dtype == like.dtype else v.to(like.dtype)  # (kept by a call of another dtype)

    def _call(self, fn: str, env: Mapping[str, Any]) -> dict[str, Any]:
        mod, meta = self._gen
        vals = getattr(mod, fn)(*[env[a] for a in meta["args"][fn]])
        return dict(zip(meta["returns"][fn], vals))

    def _env(self, like: torch.Tensor) -> dict[str, Any]:
        """The params as tensors of the call's dtype and device (a learnable one keeps its graph)."""
        self._check_learnable()
        return {k: on_device(v, like) for k, v in self.param_values().items()}

    def _check_learnable(self) -> None:
        rp.check_trained(self)

    def _run_side(self, side: str, seq: torch.Tensor, mods: Mapping[str, Any], keep_traj: bool = True):
        """A side's states over the call, one step at a time (`side_pre` / `side_post`): the states before
        and after each step (`keep_traj`), and the rule's output (the presynaptic side's)."""
        T, B, n = seq.shape
        names = [s for s, where in self.sides.items() if where == side or (side == "post" and where == "global")]
        st = {s: self._state(s, (B, 1) if self.sides[s] == "global" else (B, n), seq) for s in names}
        before: dict[str, list] = {s: [] for s in names}
        after: dict[str, list] = {s: [] for s in names}
        outs = []
        env = self._env(seq)
        for t in range(T):
            env[side] = seq[t]
            for k, v in mods.items():
                env[k] = v[t] if isinstance(v, torch.Tensor) and v.dim() == 3 else v
            env.update(st)
            r = self._call(f"side_{side}", env)
            for s in names:
                if keep_traj:
                    before[s].append(st[s])
                    after[s].append(r[s])
                st[s] = r[s]
            if "output" in r:
                outs.append(torch.broadcast_to(r["output"], seq[t].shape))
        self._states.update(st)
        return before, after, (torch.stack(outs) if outs else None)

    def _side_states(self, side: str, seq: torch.Tensor, mods: Mapping[str, Any]
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """A side's states before and after each step of the call, `[T, B, n]`: its linear traces by one
        kernel or product, any other side by the step-by-step loop."""
        if side in self._gen[1]["linear"]:
            return self._run_linear(side, seq, mods)
        bl, al, _ = self._run_side(side, seq, mods)
        return ({k: torch.stack(v) for k, v in bl.items() if v}, {k: torch.stack(v) for k, v in al.items() if v})

    def _run_linear(self, side: str, seq: torch.Tensor, mods: Mapping[str, Any]):
        """A side's states over the window when each is a linear trace, `x_t = a x_{t-1} + u_t`
        (`backends.rules.linear_scan`: one kernel, or one product per block of steps)."""
        from ..backends.rules import linear_scan

        T, B, n = seq.shape
        names = self._gen[1]["linear"][side]
        env = {**self._env(seq), side: seq}
        env.update({k: (v if isinstance(v, torch.Tensor) and v.dim() == 3 else v) for k, v in mods.items()})
        au = self._call(f"linear_{side}", env)
        before: dict[str, list] = {}
        after: dict[str, list] = {}
        for s_name in names:
            width = n if self.sides[s_name] != "global" else 1
            x0 = self._state(s_name, (B, width), seq)
            a = on_device(au[f"a_{s_name}"], seq)
            u = torch.broadcast_to(on_device(au[f"u_{s_name}"], seq),
                                   (T, B, width))
            X = linear_scan(a, u.reshape(T, -1), x0.reshape(-1)).reshape(T, B, width)
            after[s_name] = X
            if s_name in self._read_before:  # (the state before each step: only where a term reads it)
                before[s_name] = torch.cat([x0.reshape(1, B, width), X[:-1]])
            self._states[s_name] = X[-1]
        return before, after

    def _terms(self, pre: torch.Tensor, post: torch.Tensor, mods: Mapping[str, Any], like: torch.Tensor
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The factors a_k `[T, B, n_post]` and b_k `[T, B, n_pre]` of every term of the change over the
        call (the sides' states run first: a product per block of steps, or a loop)."""
        from ..ir.rule import NEXT

        T, B, n_pre = pre.shape
        n_post = post.shape[-1]
        pb, pa = self._side_states("pre", pre, mods)
        qb, qa = self._side_states("post", post, mods)
        env_b: dict[str, Any] = {**self._env(pre), "pre": pre}
        env_a: dict[str, Any] = {**self._env(pre), "post": post, **mods}
        for s in pa:
            env_b[s], env_b[NEXT + s] = pb.get(s), pa[s]
        for s in qa:
            env_a[s], env_a[NEXT + s] = qb.get(s), qa[s]
        a = self._call("terms_a", env_a)
        b = self._call("terms_b", env_b)
        k = self._gen[1]["terms"]

        def full(v: Any, n: int) -> torch.Tensor:
            return torch.broadcast_to(on_device(v, like), (T, B, n))
        return [full(a[f"a{i}"], n_post) for i in range(k)], [full(b[f"b{i}"], n_pre) for i in range(k)]

    def _c(self, w: torch.Tensor, like: torch.Tensor) -> list[Any]:
        c = self._call("terms_c", {**self._env(like), self.weight_name: w})
        return [c[f"c{i}"] for i in range(self._gen[1]["terms"])]

    def _window_products(self, pre: torch.Tensor, post: torch.Tensor, w: torch.Tensor, mods: Mapping[str, Any]
                         ) -> torch.Tensor:
        """The window's change as one sum of outer products per term over all `T * B` samples."""
        from ..backends.rules import outer_sum

        a, b = self._terms(pre, post, mods, w)
        dw = torch.zeros_like(w)
        for ai, bi, ci in zip(a, b, self._c(w, pre)):
            dw = dw + ci * outer_sum(ai.reshape(-1, ai.shape[-1]), bi.reshape(-1, bi.shape[-1]))
        return dw

    def _online_products(self, pre: torch.Tensor, post: torch.Tensor, w: torch.Tensor, mods: Mapping[str, Any]
                         ) -> torch.Tensor:
        """Online, where the change factors: each step's change is a sum over the batch of outer
        products per term (a rank-B update), with c(w) of the weight that step reads."""
        a, b = self._terms(pre, post, mods, w)
        cur = w
        for t in range(pre.shape[0]):
            dw = torch.zeros_like(w)
            for ai, bi, ci in zip(a, b, self._c(cur, pre)):
                dw = dw + ci * (ai[t].T @ bi[t])
            cur = self.bound(cur + dw)
        return cur

    def _steps(self, pre: torch.Tensor, post: torch.Tensor, w: torch.Tensor, mods: Mapping[str, Any],
               online: bool) -> torch.Tensor:
        """The rule's whole step, per synapse and sample, one step at a time."""
        T, B, n_pre = pre.shape
        stepper = self.stepper(B, n_pre, post.shape[-1], pre)
        dw = torch.zeros_like(w)
        cur = w
        for t in range(T):
            m_t = {k: (v[t] if isinstance(v, torch.Tensor) and v.dim() == 3 else v) for k, v in mods.items()}
            change = stepper.step(pre[t], post[t], cur, m_t)
            if online:
                cur = stepper.bound(cur + change)
            else:
                dw = dw + change
        stepper.keep()
        return cur if online else dw

    def product_stepper(self, pre: torch.Tensor, mods: Mapping[str, Any]) -> Any:
        """Online steps of a rule whose change factors, for a caller that gets the postsynaptic spikes
        one step at a time (a layer's online loop): the presynaptic side of the whole call at once,
        then per step the postsynaptic states and one product per term (a rank-B update)."""
        from .rulesteps import ProductSteps

        return ProductSteps(self, pre, mods)

    def stepper(self, B: int, n_pre: int, n_post: int, like: torch.Tensor) -> Any:
        """The rule's whole step for a caller that runs the steps itself (a layer's online loop):
        `s.step(pre_t [B, n_pre], post_t [B, n_post], w, modulators_t)` is the weight's change of the
        step summed over the batch (the states advance), `s.bound(w)` the bounds, `s.keep()` keeps the
        states in the rule."""
        from .rulesteps import Stepper

        return Stepper(self, B, n_pre, n_post, like)


_HALF = (torch.float16, torch.bfloat16)


def _f32(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in _HALF else x


def load_rule(model: str | Path, learnable: Any = None, **params: Any) -> Rule:
    """A rule's module: `model` a library rule's name (`stdp`), a `.rule` file's path or its text;
    `learnable=` the constants to train (a name, a list, True/False), instead of the file's flags."""
    return Rule(compile_rule(model), params, learnable)


__all__ = ["MODES", "Rule", "RuleIR", "compile_rule", "load_rule"]
