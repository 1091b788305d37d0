"""A feed-forward layer's sparse inputs (`sparse_input=True`): where a synapse group's input is
mostly zeros (spikes at a low rate), its product is taken from the nonzero entries only, so the
call's time falls with the rate.

At each call, for each dense or masked synapse group without delays, the backend that runs the
layer (`backends.sparse_kernel`: the Triton kernels on CUDA, or in Triton's interpreter) lists each
row's nonzero inputs and counts them. At or below `FLEXDSL_SPARSE_DENSITY` (default 0.05) nonzeros of
all entries (or always, `sparse_input="always"`: no count read) the product gathers the rows of
`W^T` at them; above it the layer's usual dense product runs. The count comes back to the host as
soon as it is made; meanwhile the call queues the path the group's last call took (a gather gated by
the count on the device, or the dense product), so the GPU does not wait for the host: a wrong guess
costs a launch (or the dense product's time), never a different result.

- No gradient wanted (inference), float32, one such group into a neuron of one input without
  random draws: the product and the neuron's steps run as one kernel (`SparseProgram`), the current
  never stored; the other groups and their biases come in as a held current (FLEXDSL_SPARSE_FUSED=0:
  not fused).
- Else the group's current is the product (`SparseLinear`: its backward the dense one, the input
  saved as bits) and the neuron runs on its own kernels.

Where no backend serves the input (the CPU's torch path) the layer's usual call runs. The gathered
sums are the dense float32 product's terms in another order: results equal within `n * eps` of the
terms' magnitudes, the same for the same input in every call. `m.sparse_report()` says what ran.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..backends import sparse_kernel
from ..backends.base import transformed
from ..backends.packed import first_derivative_only, linear_grads
from ..frontend.layer import CheckedLayer, CheckedSynapse
from ..settings import env_choice, env_fraction
from .bits import is_binary, mark_binary, pack, unpack


def density_limit() -> float:
    """`FLEXDSL_SPARSE_DENSITY` (a fraction in [0, 1]; default 0.05)."""
    return env_fraction("FLEXDSL_SPARSE_DENSITY")


class SparseLinear(torch.autograd.Function):
    """`x W^T + b` with the forward from `x`'s nonzero entries where they are few enough (a backend's
    `current` over its `compact` lists `c`, `wt` = W^T; else the dense product) and the dense backward
    of `bits.spike_linear` (the input saved as bits where it is 0/1); `owner` = (layer, group) keeps
    the guess of which the call takes."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, ops: Any, c: Any,
                wt: torch.Tensor, owner: tuple) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        layer, name = owner
        if c.always:
            out = ops.current(x2, c, wt, b)
        elif layer._predicted(name):  # (the gather queued before the count is back, gated by it)
            out = ops.current(x2, c, wt, b, gated=True)
            if not layer._chosen(name, c):
                out = torch.nn.functional.linear(x2, w, b)
        else:
            out = torch.nn.functional.linear(x2, w, b)
            if layer._chosen(name, c):
                out = ops.current(x2, c, wt, b)
        out = out.reshape(*x.shape[:-1], w.shape[0])
        ctx.shape, ctx.has_bias = x.shape, b is not None
        ctx.bits = ctx.needs_input_grad[1] and is_binary(x)
        keep = (pack(x) if ctx.bits else x) if ctx.needs_input_grad[1] else None
        ctx.save_for_backward(keep, w)
        return out

    @staticmethod
    @first_derivative_only  # (a second derivative through the saved bits would miss the input's part: an error)
    def backward(ctx, g: torch.Tensor):
        kept, w = ctx.saved_tensors
        x_of = (lambda dt: unpack(kept, ctx.shape, dt)) if ctx.bits else kept.to
        return (*linear_grads(g, w, x_of, ctx.shape, ctx.has_bias, ctx.needs_input_grad), None, None, None, None)


class SparseInputs:
    """The mixin of `FeedForwardModule` that takes sparse inputs' products from their nonzero
    entries (see the module docstring). `m.sparse_input` turns it on and off;
    `m.sparse_report()` says what the last call did."""

    @property
    def sparse_input(self) -> bool | str:
        """True: products of sparse inputs from their nonzero entries, chosen per call by their count
        (on the device); "always": from their nonzero entries whatever the count; False: dense."""
        return self.__dict__.get("_sparse_input", False)

    @sparse_input.setter
    def sparse_input(self, value: Any) -> None:
        self._check_sparse(value)
        self.__dict__["_sparse_input"] = value

    def sparse_report(self) -> dict[str, tuple[str, float]]:
        """What the last call did with each synapse group it could take sparse, by name: ("sparse
        fused" | "sparse" | "dense fused" | "dense", the fraction of nonzero inputs). Reads the counts
        back from the device (waits for the call): for looking, not for the call path."""
        return {name: (("sparse" if c.sparse() else "dense") + (" fused" if fused else ""), c.density())
                for name, (c, fused) in self.__dict__.get("_sparse_seen", {}).items()}

    def _check_sparse(self, value: Any) -> None:
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        if not isinstance(value, bool) and value != "always":
            raise layer.error(f"sparse_input={value!r}: give True, False or \"always\"", layer.ast.pos,
                              "True chooses per call by the count of nonzero inputs; \"always\" takes them sparse")
        if value is False:
            return
        if any(s.rule is not None for s in layer.synapses):
            s = next(s for s in layer.synapses if s.rule is not None)
            raise layer.error(f"sparse_input on layer `{layer.name}`, whose synapses `{s.name}` have a plasticity "
                              "rule: their products run with the rule, not from nonzero entries", s.pos,
                              "drop sparse_input, or the rule")
        if not self._sparse_groups():
            raise layer.error(f"sparse_input on layer `{layer.name}`, which has no dense or masked synapse group "
                              "without delays (the products sparse inputs can take)", layer.ast.pos,
                              "sparse_input applies to `connect dense`/`connect mask` synapses without `delay`")

    def _sparse_groups(self) -> list[CheckedSynapse]:
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        return [s for s in layer.synapses if s.connect in ("dense", "mask") and s.delay_kind is None]

    def _sparse_forward(self, xs: list, direct: list, seed: Any, generator: Any) -> Any:
        """The call with products from the nonzero entries where the inputs are sparse enough, or
        None (the layer's usual call)."""
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        neuron = self.neuron  # type: ignore[attr-defined]
        self.__dict__["_sparse_seen"] = {}
        if torch.compiler.is_compiling() or any(transformed(t) for t in xs if isinstance(t, torch.Tensor)):
            return None
        xs_in = [self._check_input(x, name, size, pos)  # type: ignore[attr-defined]
                 for x, (name, size, pos) in zip(xs, layer.inputs)]
        single = self.step_mode == "s"  # type: ignore[attr-defined]
        if single:
            xs_in = [x.unsqueeze(0) for x in xs_in]
        if (self.sparse_input != "always" and any(x.is_cuda for x in xs_in)
                and torch.cuda.is_current_stream_capturing()):
            return None  # (a CUDA graph cannot read the count back: the dense call; "always" needs no count)
        limit = 1.0 if self.sparse_input == "always" else density_limit()
        groups: dict[str, tuple[Any, torch.Tensor, Any]] = {}
        for s in self._sparse_groups():
            x = xs_in[s.pre_index]
            ops = self._sparse_ops(x)
            if ops is None or x.dtype != getattr(self, s.name).dtype or torch.is_autocast_enabled(x.device.type):
                continue
            xc = x.contiguous()
            ws = self.__dict__.setdefault("_sparse_ws", {})
            if not isinstance(ws.get(s.name), ops.Workspace):
                ws[s.name] = ops.Workspace()
            groups[s.name] = (ops, xc, ops.compact(xc.reshape(-1, xc.shape[-1]), limit, ws[s.name]))
        if not groups:
            return None
        fused = self._fused_args(xs_in, direct, groups)
        for name, (_, _, c) in groups.items():
            self._sparse_seen[name] = (c, fused is not None)
        if fused is not None:
            (name, (ops, xc, c)), = groups.items()
            s = next(g for g in layer.synapses if g.name == name)
            prog, call = fused["prog"], fused["call"]

            def wt() -> torch.Tensor:  # (W^T only where a gather runs: a dense call makes none)
                return self._transposed(s)
            T, B, NI = fused["shape"]

            def dense() -> torch.Tensor:
                return torch.nn.functional.linear(xc.reshape(T * B, NI), self._sparse_weight(s).detach())
            if c.always:
                outs, fins = prog.launch(call, c, wt())
            elif self._predicted(name):  # (queued before the count is back: the kernel reads it)
                outs, fins = prog.launch(call, c, wt(), gated=True)
                if not self._chosen(name, c):
                    outs, fins = prog.launch(call, c, cur=dense())
            else:
                cur = dense()
                outs, fins = prog.launch(call, c, wt()) if self._chosen(name, c) else prog.launch(call, c, cur=cur)
            return self._fused_result(outs, fins, fused["batch"], single)
        ports: dict[int, torch.Tensor] = {}
        for s in layer.synapses:
            if s.name in groups:
                ops, xc, c = groups[s.name]
                cur = SparseLinear.apply(xc, self._sparse_weight(s), self._bias_of(s), ops, c, self._transposed(s),
                                         (self, s.name))
            else:
                cur = self._current(s, xs_in[s.pre_index])  # type: ignore[attr-defined]
            ports[s.port_index] = cur if s.port_index not in ports else ports[s.port_index] + cur
        if single:
            ports = {k: v[0] for k, v in ports.items()}
        it = iter(direct)
        args = [ports[k] if k in ports else next(it) for k in range(len(layer.neuron.inputs))]
        return neuron(*args, seed=seed, generator=generator)

    def _predicted(self, name: str) -> bool:
        """Whether group `name`'s last call was sparse (so this one is queued as sparse before its count
        is back; a wrong guess costs a launch, never a different result)."""
        return self.__dict__.setdefault("_sparse_pred", {}).get(name, True)

    def _chosen(self, name: str, c: Any) -> bool:
        """This call's choice for group `name` (its count read back: waits for the compaction alone),
        kept as the next call's guess."""
        sparse = c.sparse()
        self.__dict__.setdefault("_sparse_pred", {})[name] = sparse
        return sparse

    def _sparse_ops(self, x: torch.Tensor) -> Any:
        """The backend's sparse operations for inputs like `x` (`backends.sparse_kernel`), looked up
        once per backend name, device and dtype."""
        key = (self.neuron.backend, x.device, x.dtype)  # type: ignore[attr-defined]
        kept = self.__dict__.setdefault("_sparse_ops_of", {})
        if key not in kept:
            kept[key] = sparse_kernel(key[0], x)
        return kept[key]

    def _sparse_weight(self, s: CheckedSynapse) -> torch.Tensor:
        w = getattr(self, s.name)
        if s.connect == "mask":
            w = w * getattr(self, s.name + "_mask").to(w.dtype)
        return w

    def _transposed(self, s: CheckedSynapse) -> torch.Tensor:
        """W^T contiguous (masked), the gathers' layout: made at each call (one pass over the weight,
        little beside the call's product). Not kept between calls: a write through `.data`
        (`p.data -= lr * p.grad`, weight clipping) changes no version a cache could key on."""
        return self._sparse_weight(s).detach().t().contiguous()

    def _bias_of(self, s: CheckedSynapse) -> torch.Tensor | None:
        return getattr(self, s.bias) if s.bias is not None else None

    def _fused_args(self, xs: list, direct: list, groups: dict) -> dict[str, Any] | None:
        """What the call as one kernel (product and neuron) takes, where it serves; else None."""
        layer: CheckedLayer = self._layer  # type: ignore[attr-defined]
        neuron = self.neuron  # type: ignore[attr-defined]
        c = neuron._compiled
        kept = self.__dict__.get("_sparse_model")
        if kept is None or kept[0] is not c:  # (what the model allows, once per compiled model)
            kept = self.__dict__["_sparse_model"] = (c, len(c.checked.inputs) == 1 and not c.checked.stochastic)
        if (len(groups) != 1 or direct or not kept[1] or env_choice("FLEXDSL_SPARSE_FUSED") == "0"
                or neuron.check_finite or neuron.store_state_seqs):
            return None
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*xs, *self.parameters())):  # type: ignore[attr-defined]
            return None
        (name, (ops, xc, _)), = groups.items()
        s = next(g for g in layer.synapses if g.name == name)
        w = getattr(self, s.name)
        if xc.dtype != torch.float32 or w.dtype != torch.float32:
            return None
        T = xc.shape[0]
        batch = xc.shape[1:-1]
        B = math.prod(batch)
        H = w.shape[0]
        ext = None
        for g in layer.synapses:  # (the other groups and their biases: a held current)
            if g is s:
                continue
            cur = self._current(g, xs[g.pre_index])  # type: ignore[attr-defined]
            ext = cur if ext is None else ext + cur
        if ext is not None:
            ext = ext.detach().to(torch.float32).reshape(T, B, H).contiguous()
        states, params = neuron._flat_call_args(batch, H, xc.dtype, xc.device)
        b = self._bias_of(s)
        kept = self.__dict__.get("_sparse_prog")
        if kept is None or kept[0] is not c or kept[1] is not ops:  # (one lookup per compiled model)
            kept = self.__dict__["_sparse_prog"] = (c, ops, ops.program(c, 0, 0))
        prog = kept[2]
        call = prog.prepare(xc.reshape(T, B, xc.shape[-1]), H, b.detach().contiguous() if b is not None else None,
                            ext, states, params)
        return {"prog": prog, "call": call, "shape": (T, B, xc.shape[-1]), "batch": batch}

    def _fused_result(self, outs: list, fins: list, batch: tuple, single: bool) -> Any:
        neuron = self.neuron  # type: ignore[attr-defined]
        for sname, v in zip(neuron._state_names, fins):
            neuron._states[sname] = v.reshape(*batch, v.shape[-1])
        outs = [o.reshape(o.shape[0], *batch, o.shape[-1]) for o in outs]
        if single:
            outs = [o[0] for o in outs]
        k = neuron._spike_out
        if k is not None:
            mark_binary(outs[k])
        return outs[0] if len(outs) == 1 else tuple(outs)


__all__ = ["SparseInputs", "SparseLinear", "density_limit"]
