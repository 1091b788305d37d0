"""A feed-forward layer's plastic synapses: a synapse group with `rule NAME [window|online]`.

The layer loads the rule (`runtime/rule.py`) as `m.rules[W]` and runs it on the group's
presynaptic input and the layer's spikes:

- `window` (the default): the call runs as a static layer (one product over all steps, then the
  neuron's own kernels), then the rule's change over the window is added to the weight (and the
  weight kept in its bounds): SpikingJelly's multi-step learners.
- `online`: the call runs one step at a time; after each step the rule's change is added, and the
  next step's current reads the new weight: Brian2's synapses.

A rule with an `output` (short-term plasticity) changes what the synapse carries: the current is
the weight times the rule's output instead of the presynaptic spikes.

The weight's change goes into the weight itself (under no_grad: plasticity, not a gradient step)
unless the rule has learnable constants: then the change is kept as state with its graph,
`m.plastic_change(W)`, added to the weight at every call and cleared by `reset()` (an episode), so
a loss after several plastic calls differentiates through the rule into its constants and into
the weight it started from (meta-learning a rule). `m.plastic = False` freezes every rule.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..backends import plastic_kernel
from ..backends.base import transformed
from ..backends.exact import exact_in_tf32
from ..errors import FlexDSLError
from ..frontend.layer import CheckedLayer, CheckedSynapse
from ..frontend.rule import POST
from ..settings import env_choice
from . import ruleparams as rp
from .bits import synapse_product as _product
from .rule import Rule, compile_rule
from .rulesteps import on_device


class PlasticSynapses:
    """The mixin of `FeedForwardModule` that runs plasticity rules (see the module docstring)."""

    def _register_rules(self, layer: CheckedLayer, rule_params: Mapping[str, Any] | None) -> None:
        rules = [s for s in layer.synapses if s.rule is not None]
        self.__dict__["_changes"] = {}  # learnable rules' kept change, by synapse
        self.__dict__["_last_dw"] = {}
        self.plastic = True
        if not rules:
            if rule_params:  # (params for no rule: a typo'd layer, or a rule line forgotten)
                raise layer.error(f"rule_params given, and no synapses of layer `{layer.name}` have a rule", None,
                                  "add `rule NAME` to a synapse group, or leave rule_params out")
            return
        if not isinstance(rule_params, Mapping | None):
            raise layer.error(f"rule_params={rule_params!r}: give a dict of the rule's params", None,
                              "rule_params={'A_plus': 0.02}, or by synapse name: {'W': {'A_plus': 0.02}}")
        given = dict(rule_params or {})
        learn = given.pop("learnable", None) if len(rules) == 1 else None
        by_syn = {s.name for s in rules}
        if given and not set(given) <= by_syn:
            if len(rules) == 1:
                given = {rules[0].name: given}  # one rule: its params directly
            else:
                raise layer.error(f"rule_params for several rules are given by synapse name ({', '.join(by_syn)})",
                                  None, "rule_params={'W': {'A_plus': 0.02}}")
        mods: dict[str, str] = {}
        md = nn.ModuleDict()
        for s in rules:
            ps = given.get(s.name, {})
            if not isinstance(ps, Mapping):
                raise layer.error(f"rule_params[{s.name!r}]={ps!r}: the params of synapses `{s.name}`'s rule are a dict",
                                  s.rule_pos, f"rule_params={{{s.name!r}: {{'A_plus': 0.02}}}}")
            ps = dict(ps)
            train = ps.pop("learnable", learn)
            rule = loaded_rule(layer, s, ps, train, self.neuron)  # type: ignore[attr-defined]
            for k in rule.modulators:
                if k not in rule.post_inputs:  # (post_<x>: the neuron's own <x>, not a keyword of the call)
                    mods.setdefault(k, s.name)
            md[s.name] = rule
        self.rules = md
        self.__dict__["_modulators"] = tuple(mods)

    @property
    def modulators(self) -> tuple[str, ...]:
        """The keyword inputs the layer's rules read at every call (e.g. `reward`)."""
        return self.__dict__.get("_modulators", ())

    def plastic_change(self, name: str) -> torch.Tensor | None:
        """The kept change of the weight `name` (a rule with learnable constants), None before a call."""
        return self._changes.get(name)

    def last_dw(self, name: str) -> torch.Tensor | None:
        """The weight change the rule of `name` made in the last call (summed over its steps); None
        before a call. A name that is not a plastic synapse group's is a located error."""
        if name not in getattr(self, "rules", {}):
            from ..errors import did_you_mean

            have = list(getattr(self, "rules", {}))
            raise self._layer.error(f"`{name}` is not a synapse group with a plasticity rule", None,  # type: ignore[attr-defined]
                                    did_you_mean(name, have) or f"plastic groups: {', '.join(have) or 'none'}")
        return self._last_dw.get(name)

    def _reset_rules(self) -> None:
        self._changes.clear()
        for r in getattr(self, "rules", {}).values():
            r.reset()

    def _detach_rules(self) -> None:
        for k, v in self._changes.items():
            self._changes[k] = v.detach()
        for r in getattr(self, "rules", {}).values():
            r.detach()

    def _has_rules(self) -> bool:
        return "rules" in self._modules and len(self.rules) > 0

    def _fast(self, s: CheckedSynapse) -> bool:
        return any(p.requires_grad for p in self.rules[s.name].parameters())

    def _weight(self, s: CheckedSynapse) -> torch.Tensor:
        """The weight a call reads: the parameter (a copy where a gradient may reach it: the rule then
        writes the parameter in place, and the products' backward reads the weights they used), plus the
        kept change of a rule with learnable constants."""
        w = getattr(self, s.name)
        d = self._changes.get(s.name)
        if d is not None:
            return w + d
        return w.clone() if self.plastic and torch.is_grad_enabled() and w.requires_grad else w

    def _plastic_forward(self, xs: tuple, direct: list, modulators: Mapping[str, Any], seed: Any, generator: Any):
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        extra = [k for k in modulators if k not in self.modulators]
        if extra:
            from ..errors import did_you_mean

            raise layer.error(f"layer `{layer.name}` has no modulator `{extra[0]}`", None,
                              did_you_mean(extra[0], list(self.modulators)) or
                              f"its rules read: {', '.join(self.modulators) or 'nothing'}")
        single = self.step_mode == "s"  # type: ignore[attr-defined]
        xs_in = [self._check_input(x, name, size, pos)  # type: ignore[attr-defined]
                 for x, (name, size, pos) in zip(xs, layer.inputs)]
        if single:
            xs_in = [x.unsqueeze(0) for x in xs_in]
            direct = [d.unsqueeze(0) for d in direct]
            modulators = {k: (v.unsqueeze(0) if isinstance(v, torch.Tensor) and v.dim() > 0 else v)
                          for k, v in modulators.items()}
        plastic = [s for s in layer.synapses if s.rule is not None]
        x0 = xs_in[0]
        for s in plastic:  # (the modulators' shapes, for either semantics, before anything runs)
            rule = self.rules[s.name]
            rp.dt_checked(self, layer, s, rule)
            rule._modulators(_mods_of(rule, modulators), x0.shape[0], math.prod(x0.shape[1:-1]), x0,
                             x0.shape[1:-1], later=rule.post_inputs)
        online = (self.plastic and any(s.rule_mode == "online" for s in plastic) and x0.shape[0] > 0
                  and math.prod(x0.shape[1:-1]) > 0)  # (an empty batch: no change, as the window's)
        if online:
            out = self._online(xs_in, direct, modulators, seed, generator)
        else:
            out = self._window(xs_in, direct, modulators, seed, generator)
        return out[0] if single and isinstance(out, torch.Tensor) else (
            tuple(o[0] for o in out) if single else out)

    # ---- the two semantics
    def _carried(self, s: CheckedSynapse, x: torch.Tensor, mods: Mapping[str, Any], advance: bool = True
                 ) -> torch.Tensor:
        """What synapse group `s` carries (its rule's `output`, else `x`); `advance=False` where the call's
        weight change runs the rule's presynaptic side again from the same states (it advances them once)."""
        rule = self.rules[s.name]
        if not rule.has_output:
            return x
        kept = dict(rule._states)
        out = rule.carry(x, **_mods_of(rule, mods))
        if not advance:
            rule._states.clear()
            rule._states.update(kept)
        return out

    def _post_values_needed(self) -> set[str]:
        """The neuron's states and outputs the rules read (`post_<x>` inputs), by name <x>."""
        return {k[len(POST):] for r in self.rules.values() for k in r.post_inputs} if self.plastic else set()

    def _post_values(self, out: Any, names: set[str], t: int | None = None) -> dict[str, torch.Tensor]:
        """`post_<x>` of the call (or of its step `t` of a one-step call): the neuron's <x> after each step."""
        if not names:
            return {}
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        outs = [o for o, _ in layer.neuron.outputs]
        got: dict[str, torch.Tensor] = {}
        for x in names:
            if x in outs:
                v = out if isinstance(out, torch.Tensor) else out[outs.index(x)]
            else:
                v = self.neuron.state_seqs[x]  # type: ignore[attr-defined]
            got[POST + x] = v if t is None else v[0]
        return got

    def _run_neuron(self, currents: dict[int, torch.Tensor], direct: list, seed: Any, generator: Any,
                    keep_seqs: bool = False):
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        it = iter(direct)
        args = [currents[k] if k in currents else next(it) for k in range(len(layer.neuron.inputs))]
        neuron = self.neuron  # type: ignore[attr-defined]
        mode, seqs = neuron.step_mode, neuron.store_state_seqs
        neuron.step_mode = "m"
        neuron.store_state_seqs = seqs or keep_seqs
        try:
            return neuron(*args, seed=seed, generator=generator)
        finally:
            neuron.step_mode = mode
            neuron.store_state_seqs = seqs

    def _spikes(self, out: Any) -> torch.Tensor:
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        names = [o for o, _ in layer.neuron.outputs]
        if "spike" not in names:  # (a neuron without spikes: its rule reads no `post`, checked at load)
            return torch.zeros_like(out if isinstance(out, torch.Tensor) else out[0])
        return out if isinstance(out, torch.Tensor) else out[names.index("spike")]

    def _window(self, xs: list, direct: list, mods: Mapping[str, Any], seed: Any, generator: Any):
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        ports: dict[int, torch.Tensor] = {}
        for s in layer.synapses:
            x = xs[s.pre_index]
            if s.rule is not None:
                x = self._carried(s, x, mods, advance=not (self.plastic and x.shape[0] and self._changes_weight(s)))
            w = self._weight(s) if s.rule is not None else getattr(self, s.name)
            if s.connect == "mask":
                w = w * getattr(self, s.name + "_mask").to(w.dtype)
            b = getattr(self, s.bias) if s.bias is not None else None
            cur = _product(x, w, b, s.connect == "one_to_one") if s.rule is not None or s.delay_kind is None else \
                self._current(s, x)  # type: ignore[attr-defined]
            ports[s.port_index] = cur if s.port_index not in ports else ports[s.port_index] + cur
        needs = self._post_values_needed()
        out = self._run_neuron(ports, direct, seed, generator, keep_seqs=bool(needs))
        if self.plastic and xs[0].shape[0]:  # (a call of no steps changes no weight: not even the bounds)
            held = [s for s in layer.synapses if s.rule is not None and self._changes_weight(s)]
            self._window_changes(held, xs, self._spikes(out), {**mods, **self._post_values(out, needs)})
        return out

    def _window_changes(self, held: list[CheckedSynapse], xs: list, post: torch.Tensor, mods: Mapping[str, Any]
                        ) -> None:
        """The window semantics' change of each group of `held` (its weights held over the call), added."""
        for s in held:
            rule = self.rules[s.name]
            fast = self._fast(s)
            with torch.set_grad_enabled(fast and torch.is_grad_enabled()):
                w_now = self._weight(s)
                pre = xs[s.pre_index]
                dw = rule.window(pre if fast else pre.detach(), post if fast else post.detach(),
                                 w_now if fast else w_now.detach(), **_mods_of(rule, mods))
                self._commit(s, rule, w_now, dw, fast)

    def _online(self, xs: list, direct: list, mods: Mapping[str, Any], seed: Any, generator: Any):
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        fused = self._fused_online(xs, direct, mods)
        if fused is not None:
            return fused
        T = xs[0].shape[0]
        rules = [s for s in layer.synapses if s.rule is not None]
        carried = {s.name: self._carried(s, xs[s.pre_index], mods, advance=not self._changes_weight(s)) for s in rules}
        weights = {s.name: self._weight(s) for s in rules}
        fast = {s.name: self._fast(s) for s in rules}
        start = dict(weights)
        steppers = {s.name: self._stepper(s, xs[s.pre_index], fast[s.name], mods) for s in rules
                    if self._changes_weight(s) and s.rule_mode == "online"}
        held = [s for s in rules if self._changes_weight(s) and s.rule_mode != "online"]  # (a window group's)
        step_mods = {s.name: self._step_modulators(s, xs[s.pre_index], mods) for s in rules if s.name in steppers}
        seen: list[dict[str, torch.Tensor]] = []
        neuron_step = self._neuron_stepper(xs[0], direct)
        needs = self._post_values_needed()
        outs = []
        for t in range(T):
            ports: dict[int, torch.Tensor] = {}
            for s in layer.synapses:
                x = (carried[s.name] if s.rule is not None else xs[s.pre_index])[t:t + 1]
                w = weights[s.name] if s.rule is not None else getattr(self, s.name)
                if s.rule is not None and not fast[s.name] and start[s.name].requires_grad:
                    # (the weights' gradient sums over every step's read; the rule's changes are constants)
                    w = start[s.name] + (w - start[s.name]).detach()
                if s.connect == "mask":
                    w = w * getattr(self, s.name + "_mask").to(w.dtype)
                b = getattr(self, s.bias) if s.bias is not None else None
                cur = _product(x, w, b, False)
                ports[s.port_index] = cur if s.port_index not in ports else ports[s.port_index] + cur
            if neuron_step is not None:
                out = neuron_step.step(ports, t)
                post_values = neuron_step.values(out, needs)
            else:
                out = self._run_neuron(ports, [d[t:t + 1] for d in direct], seed, generator, keep_seqs=bool(needs))
                post_values = {k: v[0] for k, v in self._post_values(out, needs).items()}
            outs.append(out)
            seen.append(post_values)
            post = self._spikes(out)
            for s in rules:
                if s.name not in steppers:
                    continue
                rule = self.rules[s.name]
                m_t = {k: (v[t] if isinstance(v, torch.Tensor) and v.dim() == 3 else v)
                       for k, v in step_mods[s.name].items()}
                m_t.update({k: v for k, v in post_values.items() if k in rule.post_inputs})
                f = fast[s.name]
                with torch.set_grad_enabled(f and torch.is_grad_enabled()):
                    weights[s.name] = steppers[s.name](xs[s.pre_index][t], post[0], weights[s.name], m_t)
        if neuron_step is not None:
            neuron_step.keep()
        for s in rules:
            if s.name in steppers:
                steppers[s.name].keep()
                self._commit(s, self.rules[s.name], start[s.name], weights[s.name] - start[s.name], fast[s.name],
                             bounded=True)
        whole = torch.cat(outs) if isinstance(outs[0], torch.Tensor) else \
            tuple(torch.cat([o[i] for o in outs]) for i in range(len(outs[0])))
        if held:  # (window groups beside online ones: their change from the call's spikes, weights held)
            values = {k: torch.stack([v[k] for v in seen]) for k in seen[0]}
            self._window_changes(held, xs, self._spikes(whole), {**mods, **values})
        return whole

    def _step_modulators(self, s: CheckedSynapse, x: torch.Tensor, mods: Mapping[str, Any]) -> dict[str, Any]:
        """The modulators of group `s`'s rule as its steps take them: numbers, or `[T, B, 1]` tensors in
        the call's dtype (a float64 reward of a float32 layer runs in float32, as `rule.online` runs it)."""
        rule = self.rules[s.name]
        return rule._modulators(_mods_of(rule, mods), x.shape[0], math.prod(x.shape[1:-1]), x, x.shape[1:-1],
                                later=rule.post_inputs)

    def _fused_online(self, xs: list, direct: list, mods: Mapping[str, Any]) -> Any:
        """The online call as one kernel of the layer's backend (`backends.plastic_kernel`) where one
        serves it: one plastic synapse group whose rule's change factors and reads only `pre`/`post`,
        float32, no gradient wanted, a neuron model without random draws fed only by the layer's
        synapses. Else None (the step-by-step loop). FLEXDSL_PLASTIC_FUSED=0 turns it off."""
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        neuron = self.neuron  # type: ignore[attr-defined]
        rules = [s for s in layer.synapses if s.rule is not None]
        if len(rules) != 1 or direct or env_choice("FLEXDSL_PLASTIC_FUSED") == "0":
            return None
        s = rules[0]
        rule = self.rules[s.name]
        x = xs[s.pre_index]
        c = neuron._compiled
        ck = c.checked
        if (not rule.changes_weight or not rule.separable or rule.modulators or rule.post_inputs or rule.has_output
                or s.connect != "dense" or x.dtype != torch.float32 or getattr(self, s.name).dtype != torch.float32
                or ck.stochastic or neuron.check_finite
                or neuron.store_state_seqs or len(ck.inputs) != 1 or "spike" not in [o for o, _ in ck.outputs]):
            return None
        if self._fast(s) or s.name in self._changes:
            return None  # (learnable constants: the change kept apart from W, with its graph)
        if torch.compiler.is_compiling() or any(transformed(t) for t in xs):
            return None  # (traced or under a torch.func transform: the loop's torch operations)
        make = plastic_kernel(neuron.backend, x)
        if make is None:
            return None
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*xs, *self.parameters())):
            if not self.__dict__.get("_told_loop"):  # (a gradient wanted: the step-by-step loop, under autograd)
                self.__dict__["_told_loop"] = True
                warnings.warn(f"layer `{layer.name}`: online plasticity runs step by step here because a gradient "
                              "may be wanted (autograd is on and the layer has tensors that require one); under "
                              "torch.no_grad() (or with its weights' requires_grad off) one kernel runs the whole "
                              "call, with the same results", stacklevel=4)
            return None
        T = x.shape[0]
        batch = x.shape[1:-1]
        B = math.prod(batch)
        n_in = x.shape[-1]
        W = getattr(self, s.name)
        H = W.shape[0]
        ext = self._held_currents(s, xs, H)
        if ext is not None:
            ext = ext.detach().to(torch.float32).reshape(T, B, H).contiguous()
        source = [o for o, _ in ck.outputs].index("spike")
        prog = make(c, rule.ir, rule.ir.cache_key("plastic"), 0, source)
        if prog is None:
            return None
        pre = x.detach().reshape(T, B, n_in).contiguous()
        ps = rule.product_stepper(pre, rule._modulators({}, T, B, x, batch, later=rule.post_inputs))
        b = [t if pre_k else t.to(torch.float32) for t, pre_k in zip(ps.b, prog.meta["b_is_pre"])]
        like = pre[0, :, :1].expand(B, H)
        rstates = [rule._state(n, (B, H) if rule.sides[n] == "post" else (B, 1), like) for n in prog.meta["rule_states"]]
        states, params = neuron._flat_call_args(batch, H, x.dtype, x.device)
        values = rule.param_values()
        lo, hi = rule.bounds()
        w = W.detach().to(torch.float32).contiguous().clone()
        outs, fins, rfins = prog.forward(pre, b, ext, w, states, rstates, params,
                                         {n: float(values[n]) for n in prog.meta["rule_params"]}, lo, hi, exact_in_tf32(x))
        for name, v in zip(neuron._state_names, fins):
            neuron._states[name] = v.reshape(*batch, H)
        ps.st = {n: (v if rule.sides[n] == "post" else v[:, :1]) for n, v in zip(prog.meta["rule_states"], rfins)}
        ps.keep()
        self._last_dw[s.name] = w - W.detach()  # (the kernel's weights are the call's result: no re-rounding)
        with torch.no_grad():
            W.copy_(w)
        outs = [o.reshape(T, *batch, H) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _held_currents(self, plastic: CheckedSynapse, xs: list, H: int) -> torch.Tensor | None:
        """The port's current from everything but the plastic group's product: the other groups and the
        biases, held over the call (one product each), `[T, *batch, H]`; None where there is none."""
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        x = xs[plastic.pre_index]
        ext = None
        for g in layer.synapses:
            cur = None
            if g is not plastic:
                cur = _product(xs[g.pre_index], getattr(self, g.name), None, False)
            if g.bias is not None:
                bias = getattr(self, g.bias)
                cur = bias.expand(x.shape[0], *x.shape[1:-1], H) if cur is None else cur + bias
            if cur is not None:
                ext = cur if ext is None else ext + cur
        return ext

    def _stepper(self, s: CheckedSynapse, x: torch.Tensor, fast: bool, mods: Mapping[str, Any]) -> Any:
        """One step of a synapse group's rule in the online loop: `(pre_t, post_t, w, mods_t) -> w`."""
        rule = self.rules[s.name]
        B = x[0].numel() // x.shape[-1]
        n_pre, n_post = x.shape[-1], getattr(self, s.name).shape[0]
        if rule.separable and B * n_pre * n_post > _PER_SYNAPSE:  # (big layers: rank-B updates)
            pre = x.reshape(x.shape[0], B, n_pre)
            pre = pre if fast else pre.detach()
            ps = rule.product_stepper(pre, rule._modulators(_mods_of(rule, mods), x.shape[0], B, x, x.shape[1:-1],
                                                            later=rule.post_inputs))

            def one(pre_t, post_t, w, m_t):
                return ps.step(post_t.reshape(B, n_post) if fast else post_t.reshape(B, n_post).detach(), w, m_t)
            one.keep = ps.keep  # type: ignore[attr-defined]
            return one
        st = rule.stepper(B, n_pre, n_post, x)

        def step(pre_t, post_t, w, m_t):
            pre_t = pre_t.reshape(B, n_pre)
            post_t = post_t.reshape(B, n_post)
            return st.bound(w + st.step(pre_t if fast else pre_t.detach(), post_t if fast else post_t.detach(),
                                        w if fast else w.detach(), m_t))
        step.keep = st.keep  # type: ignore[attr-defined]
        return step

    def _neuron_stepper(self, like: torch.Tensor, direct: list) -> _NeuronSteps | None:
        """The neuron's generated step called directly in the online loop (no module call per step),
        where that is the module's call: a model without random draws, no check_finite, no direct inputs."""
        n = self.neuron  # type: ignore[attr-defined]
        c = n._compiled
        if c.checked.stochastic or n.check_finite or direct or n.store_state_seqs:
            return None
        return _NeuronSteps(self, n, like)
    def _changes_weight(self, s: CheckedSynapse) -> bool:
        return self.rules[s.name].changes_weight

    def _commit(self, s: CheckedSynapse, rule: Rule, w_now: torch.Tensor, dw: torch.Tensor, fast: bool,
                bounded: bool = False) -> None:
        """The change `dw` added to the weight (then its bounds): into the parameter, or (a rule with
        learnable constants) into the kept change with its graph."""
        new = w_now + dw if bounded else rule.bound(w_now + dw)
        if s.connect == "mask":
            new = new * getattr(self, s.name + "_mask").to(new.dtype)
        self._last_dw[s.name] = (new - w_now).detach()
        param = getattr(self, s.name)
        if fast:
            self._changes[s.name] = new - param
        else:
            with torch.no_grad():
                param.copy_(new)


_PER_SYNAPSE = 1 << 20  # synapse-samples up to which an online step runs the rule's whole step per synapse


class _NeuronSteps:
    """The layer's neuron one step at a time through its generated `core` (the reference step:
    what every backend computes): its params once, its states kept here and given back at the end."""

    def __init__(self, layer: Any, neuron: Any, like: torch.Tensor) -> None:
        self.layer = layer
        self.neuron = neuron
        self.fn = neuron._compiled.reference_module.core
        self.params = neuron._core_params()
        self.n_out = len(neuron._compiled.checked.outputs)
        self.states: list[Any] | None = None

    def step(self, ports: dict[int, torch.Tensor], t: int) -> Any:
        cur = [ports[k][0] for k in sorted(ports)]
        x0 = cur[0]
        if self.states is None:
            self.states = self.neuron._states_for(x0, x0.shape, None, False)
        res = self.fn(*cur, *self.states, *self.params)
        res = [r if isinstance(r, torch.Tensor) and r.shape == x0.shape else torch.broadcast_to(
            on_device(r, x0), x0.shape) for r in res]
        self.states = res[self.n_out:]
        outs = [o[None] for o in res[:self.n_out]]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def values(self, out: Any, names: set[str]) -> dict[str, torch.Tensor]:
        """`post_<x>` of this step: the neuron's state or output <x> after it."""
        if not names:
            return {}
        outs = [o for o, _ in self.neuron._compiled.checked.outputs]
        got = {}
        for x in names:
            if x in outs:
                got[POST + x] = (out if isinstance(out, torch.Tensor) else out[outs.index(x)])[0]
            else:
                got[POST + x] = self.states[self.neuron._state_names.index(x)]
        return got

    def keep(self) -> None:
        if self.states is not None:
            for name, v in zip(self.neuron._state_names, self.states):
                self.neuron._states[name] = v


def _mods_of(rule: Rule, mods: Mapping[str, Any]) -> dict[str, Any]:
    return {k: mods[k] for k in rule.modulators if k in mods}


def loaded_rule(layer: CheckedLayer, s: CheckedSynapse, params: Mapping[str, Any], learnable: Any, neuron: Any
                ) -> Rule:
    """The rule of synapses `s`, loaded and checked against the layer's neuron (its `dt`, what it
    reads of the neuron): what a layer's load runs, and `flexdsl check` / `show` of a layer file."""
    rule = _load(layer, s, params, learnable)
    rp.check_dt(layer, s, rule, neuron)
    _check_post_inputs(layer, s, rule)
    return rule


def _load(layer: CheckedLayer, s: CheckedSynapse, params: Mapping[str, Any], learnable: Any) -> Rule:
    ref: str | Path = s.rule  # type: ignore[assignment]
    if s.rule_is_path and not Path(ref).is_absolute() and not layer.ast.filename.startswith("<"):
        ref = Path(layer.ast.filename).parent / ref
    try:
        ir = compile_rule(ref)
    except FlexDSLError as e:
        if e.filename == str(ref) and not e.line:  # the rule was not found: say where the layer names it
            raise layer.error(e.reason, s.rule_pos, e.hint) from None
        raise
    return Rule(ir, params, learnable)


def _check_post_inputs(layer: CheckedLayer, s: CheckedSynapse, rule: Rule) -> None:
    """A rule's `post_<x>` inputs name a state or an output of the layer's neuron; a rule that reads
    `post` (the postsynaptic spikes) needs a neuron that spikes."""
    from ..errors import did_you_mean

    if "post" in rule._gen[1]["input_reads"] and not any(o == "spike" for o, _ in layer.neuron.outputs):
        raise layer.error(f"rule `{rule.name}` reads the postsynaptic spikes `post`, and `{layer.neuron.name}` has no "
                          "spike output", s.rule_pos, "a spiking neuron model (with `output spike`), or a rule that "
                          "reads presynaptic values and `post_<state>` inputs only")
    have = [st.name for st in layer.neuron.states if not st.meta.get("hidden")] + [o for o, _ in layer.neuron.outputs]
    for k in rule.post_inputs:
        x = k[len(POST):]
        if x not in have:
            raise layer.error(f"rule `{rule.name}` reads `{k}`, the postsynaptic neuron's `{x}`, and `{layer.neuron.name}` "
                              f"has no state or output `{x}`", s.rule_pos,
                              did_you_mean(x, have) or f"its states and outputs: {', '.join(have)}")


__all__ = ["PlasticSynapses", "loaded_rule"]
