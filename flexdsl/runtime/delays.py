"""Synaptic delays of a feed-forward layer (`delay` lines of a `.layer` file), fixed or learnable.

A synapse group with delays reads its presynaptic values `d` steps back: every connection the same
number (`delay 3`), one per presynaptic neuron (`delay axonal max D`: `W_delay [n_pre]`), one per
connection (`synaptic`: `[n_post, n_pre]`) or one per postsynaptic neuron (`dendritic`: `[n_post]`,
the current delayed). The layer keeps the last `D` steps (of the input; of the current for
dendritic delays) as a state: carried across calls, zeros after `reset()`, so chunked and
single-step calls equal one call. Everything runs before the neuron's time loop, as index
operations on `[D + T, *batch, n]` and products over all steps (synaptic: one product per distinct
delay), so autograd gives the weights' and inputs' gradients.

Learnable delays (`delay axonal|synaptic|dendritic max D learnable [gauss|linear]`) are real numbers
in [0, D] (the Parameter `<name>_delay`), relaxed over the whole steps k = 0..D: a value delayed by
`d` is `sum_k g_k(d) value[t - k]` with DCLS's normalized Gaussian of width `<name>_delay_width`
(`g_k ∝ exp(-(k - d)²/2σ²)`, Hammouamri et al. 2024) or the linear interpolation between the two
nearest steps (`g_k = max(0, 1 - |k - d|)`: DCLS's "v1"). Autograd gives the gradients of the
delays. Axonal and dendritic delays of the linear relaxation are two reads of the history; gauss
ones a depthwise convolution over time; synaptic ones one convolution with the kernel
`W[i, j] g_k(d[i, j])` (`[n_post, n_pre, D + 1]`, as DCLS builds it; in a backend's kernels, where it
has them, the kernel made and read in place: the Triton backend's `delay_gauss`). A width of 0 (or
`round_delays()`) runs the delays rounded to whole steps, exactly the fixed-delay path. The delays
stay in [0, D]: the layer clamps them before each call and after every optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..errors import FlexDSLError
from ..frontend.layer import CheckedLayer, CheckedSynapse


def delay_shape(layer: CheckedLayer, s: CheckedSynapse) -> tuple[int, ...]:
    if s.delay_kind == "synaptic" and s.connect == "one_to_one":
        return (layer.size,)
    return {"axonal": (s.pre_size,), "synaptic": (layer.size, s.pre_size), "dendritic": (layer.size,)}[s.delay_kind]


def initial_delays(layer: CheckedLayer, s: CheckedSynapse, given: Any) -> torch.Tensor:
    """The `<name>_delay` buffer of a per-neuron or per-connection delay: the values given at load
    (checked), else zeros."""
    shape = delay_shape(layer, s)
    if given is None:
        return torch.zeros(shape, dtype=torch.long)
    try:
        d = torch.as_tensor(given)
    except (TypeError, ValueError, RuntimeError):
        raise layer.error(f"the delays of `{s.name}` must be a tensor of whole numbers of steps, not "
                          f"{type(given).__name__}", s.delay_pos) from None
    if tuple(d.shape) != shape:
        raise layer.error(f"the delays of `{s.name}` have shape {tuple(d.shape)}; {s.delay_kind} delays of these "
                          f"synapses need {shape}", s.delay_pos)
    check(layer, s, d)
    return d.to(torch.long)


def check(layer: CheckedLayer, s: CheckedSynapse, d: torch.Tensor) -> None:
    """Whole numbers of steps from 0 to the synapse's maximum (a NaN, a negative or a larger delay:
    a located error)."""
    if d.is_complex() or d.dtype == torch.bool:
        raise layer.error(f"the delays of `{s.name}` must be whole numbers of steps, not {d.dtype}", s.delay_pos)
    if d.is_floating_point():
        bad = ~torch.isfinite(d) | (d != d.round())
        if bool(bad.any()):
            v = float(d[bad].flatten()[0])
            raise layer.error(f"a delay of `{s.name}` is {v}, not a whole number of steps", s.delay_pos)
    if d.numel() and (int(d.min()) < 0 or int(d.max()) > s.delay):
        v = int(d.min()) if int(d.min()) < 0 else int(d.max())
        raise layer.error(f"a delay of `{s.name}` is {v} steps, outside 0 to {s.delay} (its maximum)", s.delay_pos,
                          f"raise the maximum: `delay {s.delay_kind} max {max(v, 0)}`" if v > s.delay else None)


def history(layer: CheckedLayer, s: CheckedSynapse, kept: torch.Tensor | None, x: torch.Tensor
            ) -> torch.Tensor:
    """The last `D` kept steps followed by `x` (`[D + T, *batch, n]`; zeros before the first call)."""
    D = s.delay
    if kept is None:
        kept = x.new_zeros((D, *x.shape[1:]))
    elif kept.shape[1:] != x.shape[1:] or kept.device != x.device:
        raise layer.error(f"the {D} steps `{s.name}` kept from the last call have shape {tuple(kept.shape[1:])} on "
                          f"{kept.device}, but this call's are {tuple(x.shape[1:])} on {x.device}", s.delay_pos,
                          "call m.reset() before a batch of another size")
    elif kept.dtype != x.dtype:
        kept = kept.to(x.dtype)
    return torch.cat([kept, x]) if D else x


def read(hist: torch.Tensor, D: int, T: int, d: torch.Tensor) -> torch.Tensor:
    """`out[t, ..., k] = hist[D + t - d[k], ..., k]` (d: one delay per last-dim element)."""
    idx = torch.arange(T, device=hist.device).unsqueeze(1) + (D - d.to(hist.device)).unsqueeze(0)  # [T, n]
    idx = idx.view(T, *([1] * (hist.dim() - 2)), hist.shape[-1]).expand(T, *hist.shape[1:])
    return hist.gather(0, idx)


def delayed_current(layer: CheckedLayer, s: CheckedSynapse, x: torch.Tensor, product: Callable, w: torch.Tensor,
                    b: torch.Tensor | None, d: torch.Tensor | None, kept: torch.Tensor | None,
                    kernel: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the synapse group's current `[T, *batch, n_post]`, the steps to keep for the next call);
    `product(x, w, b)` is the group's current of undelayed values; `kernel`: a backend's sparse-delay
    product (`backends.delay_kernel`) for synaptic delays, None: torch's."""
    T, D = x.shape[0], s.delay
    if s.delay_kind == "dendritic":
        cur = product(x, w, b)
        hist = history(layer, s, kept, cur)
        return read(hist, D, T, d), hist[hist.shape[0] - D:]
    hist = history(layer, s, kept, x)
    if s.delay_kind == "uniform":
        out = product(hist[:T], w, b)
    elif s.delay_kind == "axonal" or s.connect == "one_to_one":  # (one to one: a connection per neuron)
        out = product(read(hist, D, T, d), w, b)
    elif kernel is not None:  # synaptic, in a backend's kernels: a gather per connection, no [I, J, D] kernel
        out = kernel(hist, d.to(w.device), w, None, D)
        out = out + b.to(out.dtype) if b is not None else out
    else:  # synaptic: one product per distinct delay
        dd = d.to(w.device)
        out = None
        for k in torch.unique(dd).tolist():
            part = product(hist[D - k:D - k + T], w * (dd == k).to(w.dtype), None)
            out = part if out is None else out + part
        out = out + b.to(out.dtype) if b is not None else out  # (the products' dtype: autocast's, as F.linear's)
    return out, hist[hist.shape[0] - D:]


def initial_learnable(layer: CheckedLayer, s: CheckedSynapse, given: Any) -> torch.Tensor:
    """The `<name>_delay` Parameter's value of learnable delays: the values given at load (real
    numbers in [0, max], checked), else drawn uniformly from [0, max] (as DCLS-delays initializes)."""
    shape = delay_shape(layer, s)
    if given is None:
        return torch.rand(shape) * s.delay
    try:
        d = torch.as_tensor(given)
    except (TypeError, ValueError, RuntimeError):
        raise layer.error(f"the delays of `{s.name}` must be a tensor of steps, not {type(given).__name__}",
                          s.delay_pos) from None
    if tuple(d.shape) != shape:
        raise layer.error(f"the delays of `{s.name}` have shape {tuple(d.shape)}; {s.delay_kind} delays of these "
                          f"synapses need {shape}", s.delay_pos)
    check_learnable(layer, s, d)
    return d.to(torch.get_default_dtype()).clone()


def check_learnable(layer: CheckedLayer, s: CheckedSynapse, d: torch.Tensor) -> None:
    """Real numbers of steps from 0 to the maximum (NaN, infinite, negative or larger: a located error)."""
    if d.is_complex() or d.dtype == torch.bool:
        raise layer.error(f"the delays of `{s.name}` must be numbers of steps, not {d.dtype}", s.delay_pos)
    dd = d.detach().double()
    bad = ~torch.isfinite(dd) | (dd < 0) | (dd > s.delay)
    if bool(bad.any()):
        v = float(dd[bad].flatten()[0])
        raise layer.error(f"a delay of `{s.name}` is {v:g} steps, outside 0 to {s.delay} (its maximum)", s.delay_pos,
                          f"raise the maximum: `delay {s.delay_kind} max {math.ceil(v)} learnable`"
                          if math.isfinite(v) and v > s.delay else None)


def check_width(layer: CheckedLayer, s: CheckedSynapse, width: float) -> None:
    """The relaxation's width: gauss any σ ≥ 0 steps (0: whole steps), linear 1 (or 0: whole steps)."""
    if not math.isfinite(width) or width < 0 or (s.delay_interp == "linear" and width not in (0.0, 1.0)):
        want = "a number of steps >= 0 (0: whole steps)" if s.delay_interp == "gauss" else "1, or 0 (whole steps)"
        raise layer.error(f"the width of the {s.delay_interp} delays of `{s.name}` is {width:g}; it must be {want}",
                          s.delay_pos, "m.round_delays() for whole steps" if s.delay_interp == "linear" else None)


def tap_weights(d: torch.Tensor, D: int, width: float, interp: str) -> torch.Tensor:
    """`g[..., k]`, k = 0..D, of delays `d[...]` (autograd to `d`): the softmax over the steps of
    `-(k - d)²/2σ²` (gauss, the normalized Gaussian), or `max(0, 1 - |k - d|)` (linear; its derivative
    at a whole d taken from above, at max from below: the two-step reads' own)."""
    x = torch.arange(D + 1, device=d.device, dtype=d.dtype) - d.unsqueeze(-1)
    if interp == "gauss":
        e = x.square()
        e = e - e.detach().amin(dim=-1, keepdim=True)
        return torch.softmax(e * -gauss_coef(width, D, d.dtype), dim=-1)
    # (linear: the two steps around d, `1 - f` and `f` with f = d - floor(d), as `_two_taps` reads them: at
    # a whole d (0, max, or a clamped one) the derivative of the step above's side, not the sum of both
    # sides that autograd takes of |k - d|)
    d0 = d.detach().floor().clamp(0, max(D - 1, 0))
    f = (d - d0).unsqueeze(-1)
    k = torch.arange(D + 1, device=d.device, dtype=d.dtype)
    lo = (k == d0.unsqueeze(-1)).to(d.dtype)
    hi = (k == d0.unsqueeze(-1) + 1).to(d.dtype)
    return lo * (1 - f) + hi * f


def gauss_coef(width: float, D: int, dtype: torch.dtype) -> float:
    """The gauss relaxation's 1/2σ², bounded so that the nearest step's exponent is 0 and the others'
    at most the dtype's largest value / 4: any width > 0, however small, gives the taps of its limit,
    never 0 * inf."""
    coef = 0.5 / (width * width) if width * width > 0 else math.inf
    return min(coef, torch.finfo(dtype).max / (4 * max(D, 1) ** 2))


def _spread(hist: torch.Tensor, g: torch.Tensor, T: int) -> torch.Tensor:
    """`out[t, ..., c] = sum_k g[c, k] hist[D + t - k, ..., c]` (a depthwise convolution over time)."""
    C, K = g.shape
    h = hist.reshape(hist.shape[0], -1, C).permute(1, 2, 0)  # [N, C, D + T]
    out = torch.nn.functional.conv1d(h, g.flip(-1).unsqueeze(1).to(h.dtype), groups=C)  # [N, C, T]
    return out.permute(2, 0, 1).reshape(T, *hist.shape[1:])


def _two_taps(hist: torch.Tensor, D: int, T: int, d: torch.Tensor) -> torch.Tensor:
    """The linear relaxation of per-element delays: `(1 - f) x[t - ⌊d⌋] + f x[t - ⌊d⌋ - 1]`."""
    d0 = d.detach().floor().clamp(0, D - 1)
    f = (d - d0).to(hist.dtype)
    lo = read(hist, D, T, d0.long())
    hi = read(hist, D, T, d0.long() + 1)
    return lo + f * (hi - lo)


def learned_current(layer: CheckedLayer, s: CheckedSynapse, x: torch.Tensor, product: Callable, w: torch.Tensor,
                    b: torch.Tensor | None, d: torch.Tensor, width: float, kept: torch.Tensor | None,
                    kernel: Callable | None = None, spread: Callable | None = None, gauss: Callable | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """`delayed_current` of learnable delays `d` (real, in [0, D]) under the synapse's relaxation
    (synaptic linear ones in `kernel` where given: two steps per connection; per-element gauss ones in
    `spread` where given, synaptic gauss ones in `gauss` where given: the history read as it lies)."""
    T, D = x.shape[0], s.delay
    if T == 0:  # (no steps: no current, the kept steps as they were)
        return product(x, w, b), kept
    interp = s.delay_interp or "gauss"
    dendritic = s.delay_kind == "dendritic"
    if gauss is not None and interp == "gauss" and s.delay_kind == "synaptic" and s.connect != "one_to_one":
        # (in the backend's kernels, the taps made there too; no zero steps before the first call: the
        # kernels read the steps before the history's first as 0)
        hist = x if kept is None else history(layer, s, kept, x)
        out = gauss(hist, w, d, gauss_coef(width, D, d.dtype), D, hist.shape[0] - T)
        out = out + b.to(out.dtype) if b is not None else out
        if hist.shape[0] < D:
            hist = torch.cat([hist.new_zeros((D - hist.shape[0], *hist.shape[1:])), hist])
        return out, hist[hist.shape[0] - D:]
    hist = history(layer, s, kept, product(x, w, b) if dendritic else x)
    per_element = dendritic or s.delay_kind == "axonal" or s.connect == "one_to_one"
    if per_element:
        if interp == "linear":
            xd = _two_taps(hist, D, T, d)
        else:
            taps = tap_weights(d, D, width, interp)
            xd = spread(hist, taps.to(hist.dtype)) if spread is not None else _spread(hist, taps, T)
        out = xd if dendritic else product(xd, w, b)
    elif kernel is not None and interp == "linear":  # two steps per connection, in the backend's kernels
        d0 = d.detach().floor().clamp(0, D - 1)
        f = (d - d0).to(w.dtype)
        out = kernel(hist, d0.long(), w * (1 - f), w * f, D)
        out = out + b.to(out.dtype) if b is not None else out
    else:  # synaptic: one convolution over time with the kernel w[i, j] g_k(d[i, j])
        weights = (w.unsqueeze(-1) * tap_weights(d, D, width, interp).to(w.dtype)).flip(-1)  # [n_post, n_pre, D + 1]
        h = hist.reshape(hist.shape[0], -1, hist.shape[-1]).permute(1, 2, 0)  # [N, n_pre, D + T]
        out = torch.nn.functional.conv1d(h, weights.to(h.dtype), b)  # [N, n_post, T]
        out = out.permute(2, 0, 1).reshape(T, *x.shape[1:-1], w.shape[0])
    return out, hist[hist.shape[0] - D:]


def recurrent_current(s: CheckedSynapse, hist: torch.Tensor, w: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """A delayed recurrent synapse group's current at one step (`[B, n_post]`) from the source's last
    `D + 1` values `hist` (`hist[-1]` the last step's, `hist[-1 - k]` k steps before it) and the weights
    over the steps back `taps` (`[D + 1]` uniform; `[n_pre, D + 1]` axonal or one to one;
    `[n_post, n_pre, D + 1]` synaptic; `[n_post, D + 1]` dendritic)."""
    back = hist.flip(0)  # back[k]: the source k + 1 steps ago
    one = s.connect == "one_to_one"
    if s.delay_kind == "uniform":
        pre = back[s.delay]
    elif s.delay_kind == "axonal" or one:
        pre = torch.einsum("kbj,jk->bj", back, taps.to(back.dtype))
    elif s.delay_kind == "dendritic":
        return torch.einsum("kbi,ik->bi", back @ w.T, taps.to(back.dtype))
    else:  # synaptic
        return torch.einsum("kbj,ijk->bi", back, w.unsqueeze(-1) * taps.to(w.dtype))
    return pre * w if one else pre @ w.T


MAX_KERNEL = 2**31  # values of a learnable synaptic delay's kernel over the steps ([n_post, n_pre, max + 1])
_BOUNDED: Any = None  # learnable delays -> their maximum (weakly), clamped after every optimizer step


def keep_bounded(p: torch.Tensor, D: int) -> None:
    """Clamp `p` into [0, D] after every optimizer step (one global hook of torch.optim, registered
    with the first learnable delay)."""
    global _BOUNDED
    if _BOUNDED is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _BOUNDED = WeakIdKeyDictionary()
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(_clamp_after_step)
    if p not in _BOUNDED:
        _BOUNDED[p] = D


def _clamp_after_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Every live learnable delay clamped into its bounds (a few tensors, whichever optimizer stepped:
    no walk over the optimizer's parameters; in place on `.data`, no version change)."""
    with torch.no_grad():
        for p, D in list(_BOUNDED.items()):
            p.data.clamp_(0, D)


class DelayedSynapses:
    """The delays of a layer module's synapses (a mixin of the feed-forward and recurrent layer
    modules, whose `_layer` is the checked layer and `_kept` the synapses' kept steps): their
    Parameters and buffers, a synapse group's delayed values at a call, the width and rounding of
    learnable ones."""

    def _register_delays(self, delays: dict[str, Any]) -> None:
        """`<name>_delay` (a buffer of whole steps, or the Parameter of learnable delays) and
        `<name>_delay_width` (learnable) of every delayed synapse; `delays`: the values given at
        load, by synapse (taken out of the dict)."""
        layer = self._layer
        for s in layer.synapses:
            if s.delay_learnable and s.delay_kind == "synaptic" and s.connect != "one_to_one":
                n = layer.size * s.pre_size * (s.delay + 1)  # (the relaxation's kernel over the steps)
                if n > MAX_KERNEL:
                    raise layer.error(f"the learnable synaptic delays of `{s.name}` need a kernel of {layer.size:,} x "
                                      f"{s.pre_size:,} x {s.delay + 1:,} = {n:,} values over the steps (the limit is "
                                      f"{MAX_KERNEL:,}: {MAX_KERNEL * 4 // 2**30} GiB in float32)", s.delay_pos,
                                      "a smaller maximum, or axonal/dendritic delays (one per neuron)")
            if s.delay_learnable:
                d = torch.nn.Parameter(initial_learnable(layer, s, delays.pop(s.name, None)))
                self.register_parameter(s.name + "_delay", d)
                width = s.delay / 2 if s.delay_interp == "gauss" else 1.0
                self.register_buffer(s.name + "_delay_width", torch.tensor(float(width)))
                keep_bounded(d, s.delay)
            elif s.delay_kind not in (None, "uniform"):
                self.register_buffer(s.name + "_delay", initial_delays(layer, s, delays.pop(s.name, None)))
        if delays:
            raise layer.error(f"delays were given for `{next(iter(delays))}`, which has no `delay axonal|synaptic|"
                              "dendritic` line in this layer", layer.ast.pos, "delays={name: tensor of steps}")

    def _delayed(self, s: CheckedSynapse, x: torch.Tensor, product: Callable, w: torch.Tensor,
                 b: torch.Tensor | None) -> torch.Tensor:
        """`product` (the group's current of undelayed values) of the delayed values of `x`
        (`[T, *batch, n_pre]`), the steps kept for the next call updated."""
        layer, kept = self._layer, self.__dict__["_kept"]
        d, width = self._delay_values(s)
        synaptic = s.delay_kind == "synaptic" and s.connect != "one_to_one"
        # (under autocast a synapse group's products are torch's, in autocast's dtype as F.linear's: the
        # synaptic kernels' current would be float32, and the layer's output with it)
        synaptic_kernels = synaptic and not torch.is_autocast_enabled(x.device.type)
        if not width:
            kernel = self._delay_kernel(x) if synaptic_kernels else None
            out, kept[s.name] = delayed_current(layer, s, x, product, w, b, d, kept.get(s.name), kernel)
            return out
        kernel = spread = gauss = None  # (only the backend kernel this relaxation and kind run: asked per call)
        if not synaptic:
            spread = self._delay_kernel(x, "spread")
        elif synaptic_kernels and (s.delay_interp or "gauss") == "linear":
            kernel = self._delay_kernel(x)
        elif synaptic_kernels:
            gauss = self._delay_kernel(x, "gauss")
        out, kept[s.name] = learned_current(layer, s, x, product, w, b, d, width, kept.get(s.name), kernel, spread,
                                            gauss)
        return out

    def _delay_kernel(self, x: torch.Tensor, op: str = "product") -> Callable | None:
        """The sparse-delay product (`op="product"`), the per-element relaxed delays (`"spread"`) or the
        gauss synaptic delays (`"gauss"`) of the backend this layer runs `x` on (decided once per device
        and dtype: `backends.delay_kernel`), None for torch's (and in a trace)."""
        if torch.compiler.is_compiling():  # (a trace: torch's operations, which Inductor compiles)
            return None
        name = getattr(self, "backend", None) or self.neuron.backend
        key = (name, x.device, x.dtype, op)
        known = self.__dict__.setdefault("_delay_kernels", {})
        hit = known.get(key, known)
        if hit is known:
            from .. import backends

            hit = known[key] = backends.delay_kernel(name, x, op)
        return hit

    def _delay_values(self, s: CheckedSynapse) -> tuple[torch.Tensor | None, float]:
        """(the synapse's delays, the relaxation's width) for a call: learnable ones clamped into
        [0, max] (the Parameter, width > 0; or rounded to whole steps, width 0), fixed ones checked
        when they changed (no host sync per call); None for a uniform delay."""
        if s.delay_learnable:
            d = getattr(self, s.name + "_delay")
            self._check_delay_tensor(s, d)
            width = self._delay_width(s)
            with torch.no_grad():
                d.data.clamp_(0, s.delay)  # (in place on .data: a graph of an earlier call keeps its values)
            keep_bounded(d, s.delay)
            return (d, width) if width else (d.detach().round().long(), 0.0)
        if s.delay_kind == "uniform":
            return None, 0.0
        d = getattr(self, s.name + "_delay")
        self._check_delay_tensor(s, d)
        return (d if not d.is_floating_point() else d.long()), 0.0  # (whole numbers assigned as floats: checked)

    def _check_delay_tensor(self, s: CheckedSynapse, d: Any) -> None:
        """A synapse's delays as a call reads them, checked when they changed (no host sync per call):
        a tensor of the synapse's shape (a replaced one too: never a broadcast); fixed ones whole steps
        in [0, max], learnable ones finite (the call clamps them into [0, max])."""
        layer, shape = self._layer, delay_shape(self._layer, s)
        if not isinstance(d, torch.Tensor) or tuple(d.shape) != shape:
            got = tuple(d.shape) if isinstance(d, torch.Tensor) else type(d).__name__
            raise layer.error(f"`{s.name}_delay` is {got}; the {s.delay_kind} delays of `{s.name}` need a tensor of "
                              f"shape {shape}", s.delay_pos, f"assign a tensor of shape {shape}")
        seen = (d.data_ptr(), d._version, d.dtype, d.device)
        if self.__dict__.setdefault("_delays_seen", {}).get(s.name) == seen:
            return
        if not s.delay_learnable:
            check(layer, s, d)
        elif not d.is_floating_point():
            raise layer.error(f"the learnable delays of `{s.name}` must be a floating-point tensor, not {d.dtype}",
                              s.delay_pos)
        elif not bool(torch.isfinite(d).all()):
            v = float(d.detach()[~torch.isfinite(d.detach())].flatten()[0])
            raise layer.error(f"a learnable delay of `{s.name}` is {v}", s.delay_pos,
                              "a NaN or infinite delay comes from an assignment or a non-finite gradient step; "
                              "reload or assign delays in [0, max]")
        self.__dict__["_delays_seen"][s.name] = seen

    def _taps(self, s: CheckedSynapse, dtype: torch.dtype) -> torch.Tensor:
        """The synapse's weights over the steps back, `[..., max + 1]`: one-hot for whole steps, the
        relaxation's for learnable delays (autograd to them); what `recurrent_current` takes."""
        d, width = self._delay_values(s)
        if d is None:
            return torch.nn.functional.one_hot(torch.tensor(s.delay), s.delay + 1).to(dtype)
        if width:
            return tap_weights(d, s.delay, width, s.delay_interp or "gauss")
        return torch.nn.functional.one_hot(d.long(), s.delay + 1).to(dtype)

    def _delay_width(self, s: CheckedSynapse) -> float:
        """The width of a learnable delay's relaxation (read, and checked, when it changed)."""
        wb = getattr(self, s.name + "_delay_width")
        seen = (wb.data_ptr(), wb._version, wb.device)
        known = self.__dict__.setdefault("_widths", {}).get(s.name)
        if known is None or known[0] != seen:
            v = float(wb)
            check_width(self._layer, s, v)
            self.__dict__["_widths"][s.name] = known = (seen, v)
        return known[1]

    def set_delay_width(self, width: float) -> Any:
        """The width (σ, in steps) of every gauss-relaxed learnable delay: anneal it towards 0 as
        training goes (DCLS-delays: from max/2 down to ~0.5 over the epochs); 0 runs whole steps."""
        gauss = [s for s in self._layer.synapses if s.delay_interp == "gauss"]
        if not gauss:
            raise self._layer.error(f"layer `{self._layer.name}` has no learnable delays of the gauss relaxation, "
                                    "whose width this sets", None, "`delay synaptic max 20 learnable` (gauss is the "
                                    "default; linear has no width)")
        try:
            width = float(width)
        except (TypeError, ValueError):
            raise self._layer.error(f"the width of gauss delays is a number of steps, not {width!r}", gauss[0].delay_pos,
                                    "m.set_delay_width(2.5)") from None
        for s in gauss:
            check_width(self._layer, s, width)
            getattr(self, s.name + "_delay_width").fill_(width)
        return self

    def _axonal_delay(self, s: CheckedSynapse) -> Delay:
        """The synapse's delays as a `Delay` of its inputs (NIR's element-wise Delay: uniform or axonal
        whole steps); other kinds, or learnable delays of real steps, a located error."""
        layer = self._layer
        if s.delay_kind in ("synaptic", "dendritic"):
            raise layer.error(f"layer `{layer.name}` has {s.delay_kind} delays (`{s.name}`), which NIR cannot express "
                              "(its Delay node delays each presynaptic value: axonal delays)", s.delay_pos,
                              "export axonal delays (`delay axonal max N`, or `delay N`)")
        if s.delay_kind == "uniform":
            return Delay(torch.full((s.pre_size,), s.delay), s.delay)
        d, width = self._delay_values(s)
        if width:
            raise layer.error(f"the learnable delays of `{s.name}` are real numbers of steps (width {width:g}); "
                              "NIR's Delay takes whole steps", s.delay_pos, "m.round_delays() first (what inference "
                              "runs then)")
        return Delay(d.detach().cpu().round().long(), s.delay)

    def round_delays(self) -> Any:
        """Every learnable delay rounded to whole steps, in place, and its width set to 0: the layer
        then runs integer delays (exactly the fixed-delay path), for inference and export."""
        with torch.no_grad():
            for s in self._layer.synapses:
                if s.delay_learnable:
                    getattr(self, s.name + "_delay").clamp_(0, s.delay).round_()
                    getattr(self, s.name + "_delay_width").fill_(0.0)
        return self


class Delay(torch.nn.Module):
    """Each feature of `[T, *batch, *shape]` delayed by its own whole number of steps (`delay`, a buffer
    of integers from 0 to `max_delay` of the per-sample `shape`, or one value for every feature): an
    axonal delay as a layer of its own, what NIR's element-wise `Delay` node is (a feed-forward layer's
    `as_sequential()` and `flexdsl.nir.load` make it). The last `max_delay` steps are kept between calls
    (zeros after `reset()`; a batch of another size without `reset()` is an error)."""

    def __init__(self, delay: Any, max_delay: int | None = None) -> None:
        super().__init__()
        d = torch.as_tensor(delay)
        if d.is_complex() or d.dtype == torch.bool or (d.is_floating_point() and not bool(
                (torch.isfinite(d) & (d == d.round())).all())):
            raise FlexDSLError(f"a Delay takes whole numbers of steps, not {d.dtype} values like "
                               f"{d.flatten()[:3].tolist()}", "<Delay>", hint="Delay(torch.tensor([0, 3, 1]))")
        d = d.to(torch.long).reshape(d.shape or (1,))
        self.max_delay = int(max_delay if max_delay is not None else (int(d.max()) if d.numel() else 0))
        self.register_buffer("delay", d)
        self.kept: torch.Tensor | None = None
        self._check(d)

    def _check(self, d: Any) -> None:
        if not isinstance(d, torch.Tensor) or d.is_floating_point() or d.is_complex() or d.dtype == torch.bool:
            raise FlexDSLError(f"a Delay's `delay` must be a tensor of whole steps, not "
                               f"{getattr(d, 'dtype', type(d).__name__)}", "<Delay>")
        if d.numel() and (int(d.min()) < 0 or int(d.max()) > self.max_delay):
            v = int(d.min()) if int(d.min()) < 0 else int(d.max())
            raise FlexDSLError(f"a Delay's delay is {v} steps, outside 0 to {self.max_delay} (its max_delay)",
                               "<Delay>", hint="delays of 0 to max_delay steps")
        self.__dict__["_seen"] = (d.data_ptr(), d._version, d.device, d.dtype)

    def reset(self) -> None:
        self.kept = None

    def detach(self) -> None:
        if self.kept is not None:
            self.kept = self.kept.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        D, d = self.max_delay, self.delay
        if not isinstance(d, torch.Tensor) or (d.data_ptr(), d._version, d.device, d.dtype) != self.__dict__.get("_seen"):
            self._check(d)  # (when it changed: no sync per call)
        per = tuple(d.shape) if d.numel() > 1 else tuple(x.shape[-1:])
        if x.dim() < len(per) + 1 or tuple(x.shape[x.dim() - len(per):]) != per:
            raise FlexDSLError(f"a Delay of {d.numel()} delays (per-sample shape {per}) got an input of shape "
                               f"{tuple(x.shape)}", "<Delay>", hint=f"an input [T, *batch, *{per}]")
        kept = self.kept
        if kept is not None and (kept.shape[1:] != x.shape[1:] or kept.device != x.device):
            raise FlexDSLError(f"the {D} steps a Delay kept from the last call have shape {tuple(kept.shape[1:])} on "
                               f"{kept.device}, but this call's are {tuple(x.shape[1:])} on {x.device}", "<Delay>",
                               hint="call reset() before a batch of another size")
        if kept is None:
            kept = x.new_zeros((D, *x.shape[1:]))
        hist = torch.cat([kept.to(x.dtype), x]) if D else x
        self.kept = hist[hist.shape[0] - D:]
        flat = hist.reshape(*hist.shape[:hist.dim() - len(per)], -1)
        out = read(flat, D, x.shape[0], d.reshape(-1).expand(flat.shape[-1]) if d.numel() == 1 else d.reshape(-1))
        return out.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{self.delay.numel()} delays, max_delay={self.max_delay}"


__all__ = ["Delay", "DelayedSynapses", "check", "check_learnable", "check_width", "delay_shape", "delayed_current", "history",
           "initial_delays", "initial_learnable", "keep_bounded", "learned_current", "read", "recurrent_current",
           "tap_weights"]
