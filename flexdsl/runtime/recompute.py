"""What a rewritten network's forward keeps for its backward (`flexdsl.save_spikes_as_bits(net,
recompute=...)`): during the network's forward, every tensor autograd saves passes through
`torch.autograd.graph.saved_tensors_hooks`, and

- a tensor known to hold only 0 and 1 (a neuron's spikes, marked by `packed.mark_binary`), saved by
  any operation (a max-pool, a product left as it is, SpikingJelly's own functions), is kept packed,
  1 bit a value, and unpacked exactly when the backward reads it;
- with `recompute="norm"`: a batch normalization's output (a neuron's input: the neuron's backward
  reads it again) is not kept; the backward runs the normalization again from its input, which the
  normalization keeps for its own backward anyway (one extra normalization pass per layer). Only
  torch's batch norms and SpikingJelly's wrappers of them, called without hooks other than flexdsl's
  (asked at each call), are made again: any other forward, or a hook, may do what a second run would
  not repeat (random draws, another buffer's update, a changed input or output); and a
  product whose input is kept anyway (not as bits: an image) and that costs at most `CHEAP_MACS`
  multiply-adds an output value (a first layer on 3 channels: SEW-ResNet's 7x7 convolution, 147) is
  made again too, its output (a network's largest activation) not kept;
- with `recompute="product"`, also: the output of a product whose 0/1 input is kept as bits (a
  `Linear`/`Conv` before a normalization or a neuron) is not kept; the backward computes the product
  again from the bits (one extra product per layer, the memory of the layer's input in bits).

A recomputed tensor is made by the same operations on the same values as in the forward, so it is
the forward's tensor bit for bit, and the gradients are those of the network as it was. What a
recomputation reads is checked when it runs: a weight, bias or normalization statistic changed in
place between the forward and the backward is an error (as autograd's own check), never a silently
different gradient. Outside the network's forward (and under torch.compile or autocast'ed products,
which save what they need themselves) nothing changes.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..backends import packed
from .saved import (
    _POOLS,
    Report,
    _Bits,
    _Flags,
    _Handle,
    _Indices,
    _Kept,
    _Outer,
    _Pending,
    _Recipe,
    unpack_hook,
)

MODES = (None, "norm", "product")
_MIN_BITS = 1 << 14  # (values: a smaller 0/1 tensor is kept as it is, not worth two launches)
CHEAP_MACS = 256  # ("norm": a product of an input kept anyway, at most this many multiply-adds a value, is made again)


class Session:
    """One forward of a rewritten network: the recipes of the tensors it may leave out, what was
    kept and left out (`Report`)."""

    def __init__(self, mode: str | None, outer: Any = None, net: nn.Module | None = None) -> None:
        self.mode = mode
        self.net = net  # (whose parameters' memory is resident anyway: what shares it is not counted)
        self.param_storages: set[int] | None = None
        self.outer = outer  # (pack, unpack) of a saved-tensor hooks context around the network (save_on_cpu...)
        self.recipes: dict[int, _Recipe] = {}
        self.bits: dict[int, tuple[Any, int, _Bits]] = {}  # id -> (weak tensor, version, its bits): packed once
        self.pool: dict | None = None  # a max-pool running: its module and the last input its op saved
        self.pending: list[_Pending] = []  # products' inputs whose 0/1 check runs on the device
        self.checked: dict[int, _Pending] = {}  # every check of this forward, settled or not
        self.norm_in: dict[int, tuple[Any, dict]] = {}  # a normalization running: its input's source, state
        self.report = Report()

    # recording -------------------------------------------------------------------------------
    def _add(self, out: torch.Tensor, make: Callable[[], torch.Tensor], reads: Sequence[Any],
             source: Any = None) -> _Recipe:
        r = _Recipe(out, make, reads, source)
        self.recipes[r.ptr] = r
        return r

    def find(self, t: torch.Tensor) -> _Recipe | None:
        if not self.recipes or not isinstance(t, torch.Tensor) or t.is_sparse:
            return None
        r = self.recipes.get(t.untyped_storage().data_ptr())
        return r if r is not None and r.matches(t) else None

    def product(self, out: torch.Tensor, bits: torch.Tensor, redo: Callable[[torch.Tensor], torch.Tensor],
                shape: Sequence[int], dtype: torch.dtype, reads: Sequence[Any]) -> None:
        """`out` = `redo(x)` for the 0/1 `x` kept as `bits`: left out of what is saved."""
        if self.mode == "product":
            self._add(out, lambda: redo(packed.unpack(bits, torch.Size(shape), dtype)), reads)

    def product_kept(self, out: torch.Tensor, x: torch.Tensor, redo: Callable[[torch.Tensor], torch.Tensor],
                     reads: Sequence[Any]) -> None:
        """`out` = `redo(x)` from an input `x` autograd keeps anyway (a real-valued input: an image,
        a sum of spikes; or one whose 0/1 check is pending, then read back as it ends up kept): left
        out of what is saved."""
        if not isinstance(out, torch.Tensor) or self.find(x):
            return  # (a left-out input: holding it would cost)
        if self.mode != "product" and not (self.mode == "norm" and _cheap(reads)):
            return
        p = self.checked.get(id(x))
        if p is not None and p.ref() is x:  # (read back through its handle: as bits once the check said 0/1)
            self._add(out, lambda: redo(p.value()), reads)
            return
        if packed.known_binary(x):
            return  # (kept as bits by whoever saves it: holding it would cost)
        self._add(out, lambda: redo(x), [*reads, x])

    def check_later(self, x: torch.Tensor, owner: dict | None) -> bool:
        """Queue a check that `x` (a product's input, not known to be 0/1) is all 0/1 (on a GPU: on the
        device, read back without waiting): until it is known, `x` is saved as it is; then as bits (or
        as it is). False where no pinned flag is free (the caller checks now)."""
        p = self.checked.get(id(x))
        if p is not None and p.ref() is x and p.version == x._version:  # (checked already in this forward)
            return True
        slot = -1
        if x.is_cuda:
            slot = _Flags.take()
            if slot is None:
                return False
        p = _Pending(x, owner, slot)
        self.pending.append(p)
        self.checked[id(x)] = p
        return True

    def poll(self) -> None:
        """Settle the checks the device has finished (no waiting)."""
        left = []
        for p in self.pending:
            if not p.settle(self.report, self.outer):
                left.append(p)
        self.pending = left

    def norm_input(self, module: nn.Module, x: torch.Tensor) -> Any:
        """What a normalization's recomputation will read for `x`: a handle on a product's recipe, or `x`."""
        r = self.find(x)
        return _Handle(r, x) if r is not None else x

    def norm(self, module: nn.Module, source: Any, out: Any, state: dict) -> None:
        """`out` = `module(source)` in the state the forward ran in: left out of what is saved."""
        if not isinstance(out, torch.Tensor):
            return
        reads = [p for p in (getattr(module, "weight", None), getattr(module, "bias", None)) if p is not None]
        if not state["training"]:
            reads += [b for b in (getattr(module, "running_mean", None), getattr(module, "running_var", None))
                      if b is not None]

        def make() -> torch.Tensor:
            x = source.value() if isinstance(source, _Handle) else source
            return _rerun(module, x, state)
        self._add(out, make, reads, source)

    def end(self) -> None:
        """After the forward: a recomputation nobody saved does not hold its source's cache; checks
        not finished yet leave their inputs as they are."""
        self.poll()
        for p in self.pending:
            p.give_up(self.report, self.outer)
        self.pending, self.checked = [], {}
        for r in self.recipes.values():
            if r.pending <= 0 and isinstance(r.source, _Handle):
                r.source.recipe.pending -= 1
        self.recipes = {}
        self.bits = {}

    # the hooks -------------------------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> Any:
        held = self._pack(t)
        pool = self.pool
        if pool is not None:
            if t.is_floating_point():
                pool["input"] = (held, tuple(t.shape))
            elif t.dtype == torch.int64 and pool["input"] is not None:
                idx = _Indices.of(pool["module"], *pool["input"], t)
                if idx is not None:
                    if isinstance(pool["input"][0], _Bits):
                        pool["input"][0].shared = True  # (the op and the indices' recomputation read it)
                    self.report.kept_bytes -= t.numel() * t.element_size()
                    self.report.n_kept -= 1
                    self.report.left_out(t)
                    pool["input"] = None
                    return idx
        return held

    def _pack(self, t: torch.Tensor) -> Any:
        if self._of_parameter(t):  # (resident anyway, not counted)
            return self._keep(t)
        if self.checked:
            if self.pending:
                self.poll()
            p = self.checked.get(id(t))
            if p is not None and p.ref() is t and p.version == t._version:
                return p
        if t.dtype == torch.uint8 and packed.is_packed(t):  # (a product's input it packed itself)
            self.report.packed_by_product(t)
            return self._keep(t)
        if not self.recipes and t.numel() < _MIN_BITS:  # (nothing to gain: kept, with autograd's check)
            return self._count_keep(t)
        r = self.find(t)
        if r is not None:
            self.report.left_out(t)
            return _Handle(r, t)
        if packed.ENABLED and t.numel() >= _MIN_BITS and t.is_floating_point() and t.is_contiguous() and \
                packed.known_binary(t):
            seen = self.bits.get(id(t))
            if seen is not None and seen[0]() is t and seen[1] == t._version:
                return seen[2]
            b = _Bits(t, self.outer)
            self.bits[id(t)] = (weakref.ref(t), t._version, b)
            self.report.packed(t)
            return b
        self.report.kept(t)
        return self._keep(t)

    def _of_parameter(self, t: torch.Tensor) -> bool:
        """Whether `t` is a parameter or shares one's memory (a view: `weight.t()`, which a Linear of a
        3-D input saves), so that keeping it costs nothing."""
        if t.requires_grad and t.is_leaf:
            return True
        if isinstance(t._base, nn.Parameter):
            return True
        if self.net is None or t.is_sparse:
            return False
        if self.param_storages is None:
            self.param_storages = {p.untyped_storage().data_ptr() for p in self.net.parameters()}
        return t.untyped_storage().data_ptr() in self.param_storages

    def _count_keep(self, t: torch.Tensor) -> Any:
        self.report.kept(t)
        return self._keep(t)

    def _keep(self, t: torch.Tensor) -> Any:
        return _Outer(self.outer, self.outer[0](t)) if self.outer is not None else _Kept(t)


def _cheap(reads: Sequence[Any]) -> bool:
    """Whether a product (its weight `reads[0]`) costs at most `CHEAP_MACS` multiply-adds an output
    value: a network's first layer on its image (SEW-ResNet's 7x7 convolution of 3 channels: 147)."""
    w = reads[0] if reads else None
    return isinstance(w, torch.Tensor) and w.dim() >= 2 and w[0].numel() <= CHEAP_MACS


def _rerun(module: nn.Module, x: torch.Tensor, state: dict) -> torch.Tensor:
    """`module`'s output again as its forward made it (see `_batch_norm`), under the autocast then."""
    if state["autocast"]:
        with torch.autocast(x.device.type, dtype=state["autocast_dtype"]):
            return _batch_norm(module, x, state["training"])
    return _batch_norm(module, x, state["training"])


# SpikingJelly's batch norm wrappers' forward -> (the dims of one step's input, its class's `super_forward`)
_SJ_FORWARDS: dict[Any, tuple[int, Any]] = {}
_BATCH_NORMS = ((nn.BatchNorm1d, 3), (nn.BatchNorm2d, 4), (nn.BatchNorm3d, 5))
_SCRATCH: Any = weakref.WeakKeyDictionary()  # module -> running statistics for recomputations to update


def _sj_forwards() -> dict[Any, tuple[int, Any]]:
    if not _SJ_FORWARDS:
        _SJ_FORWARDS[None] = (0, None)  # (looked once)
        try:
            from spikingjelly.activation_based import layer as sj
            for name, d in (("BatchNorm1d", 3), ("BatchNorm2d", 4), ("BatchNorm3d", 5)):
                cls = getattr(sj, name)
                _SJ_FORWARDS[cls.forward] = (d, cls.super_forward)
        except (ImportError, AttributeError):
            pass
    return _SJ_FORWARDS


def _norm_dims(module: nn.Module) -> tuple[int, bool] | None:
    """(the dims of the input a batch norm normalizes, whether one more leading dim of steps is
    flattened first) where `module`'s forward is torch's batch norm (`nn.BatchNorm1d/2d/3d`) or
    SpikingJelly's step-mode wrapper of it, which `_batch_norm` computes again exactly; else None:
    any other forward (a subclass's own: it may draw random numbers or update buffers of its own,
    which a second run would repeat) is not run again."""
    forward = type(module).forward
    if forward is nn.modules.batchnorm._BatchNorm.forward:
        return next(((d, False) for cls, d in _BATCH_NORMS if isinstance(module, cls)), None)
    sj = _sj_forwards().get(forward)
    if sj is None or type(module).super_forward is not sj[1]:
        return None
    return sj[0], getattr(module, "step_mode", "s") == "m"


def recomputable(module: nn.Module) -> bool:
    """Whether recompute="norm" may make `module`'s output again in the backward (`_norm_dims`)."""
    return _norm_dims(module) is not None


def _direct(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether `module` is `recomputable` and `x` an input its forward normalizes (as `_batch_norm`)."""
    nd = _norm_dims(module)
    if nd is None:
        return False
    dims = x.dim() - nd[1]
    return dims == nd[0] or nd[0] == 3 and dims == 2


_OWN_HOOKS: set[Any] = set()  # this module's hooks on a batch norm and on a rewritten network (filled below)


def _hooked(module: nn.Module) -> bool:
    """Whether a call of `module` runs forward hooks or pre-hooks other than flexdsl's (its own or
    global ones): they may change its input or output, which a recomputation would not repeat.
    Asked at each call: hooks may be added or removed any time."""
    g = nn.modules.module
    if g._global_forward_pre_hooks or g._global_forward_hooks:
        return True
    return any(h not in _OWN_HOOKS for h in (*module._forward_pre_hooks.values(), *module._forward_hooks.values()))


def _batch_norm(module: Any, x: torch.Tensor, training: bool) -> torch.Tensor:
    """What `module`'s forward computed from `x` (see `_direct`): `F.batch_norm` with the same
    input, affine, statistics' presence and mode; in training, scratch statistics take the update."""
    flat = x.flatten(0, 1) if _norm_dims(module)[1] else x  # type: ignore[index]
    rm, rv = module.running_mean, module.running_var
    if training:
        if module.track_running_stats and rm is not None:
            sc = _SCRATCH.get(module)
            if sc is None or sc[0].shape != rm.shape or sc[0].device != rm.device or sc[0].dtype != rm.dtype:
                sc = _SCRATCH[module] = (rm.clone(), rv.clone())
            rm, rv = sc
        else:
            rm = rv = None
    bn_training = training or (rm is None and rv is None)
    out = torch.nn.functional.batch_norm(flat, rm, rv, module.weight, module.bias, bn_training, 0.0, module.eps)
    return out.view(*x.shape[:2], *out.shape[1:]) if flat is not x else out


# ---------------------------------------------------------------------------------------------
# sessions: entered by the rewritten network's forward pre-hook, left by its forward hook

_LOCAL = threading.local()  # .forwards: this thread's rewritten networks' forwards running, innermost last


def _forwards() -> list[tuple[nn.Module, Any]]:
    """(network, its session and saved-tensor hooks, or None) of each forward running in this thread."""
    try:
        return _LOCAL.forwards
    except AttributeError:
        _LOCAL.forwards = []
        return _LOCAL.forwards


def _begin(net: nn.Module, args: Any) -> None:
    if torch.compiler.is_compiling() or not _hooks_enabled() or torch._C._are_functorch_transforms_active():
        _forwards().append((net, None))  # (a trace, or torch.func's transforms: the network as it was written)
        return
    s = Session(net._flexdsl_recompute, _outer_hooks(), net)
    hooks = torch.autograd.graph.saved_tensors_hooks(s.pack, unpack_hook)
    hooks.__enter__()
    packed.sessions().append(s)
    _forwards().append((net, (s, hooks)))


def _hooks_enabled() -> bool:
    f = getattr(torch._C._autograd, "_saved_tensors_hooks_is_enabled", None)
    return True if f is None else bool(f())


def _outer_hooks() -> Any:
    """The saved-tensor hooks of a context the network runs in (None if none): the session keeps
    them working for what it keeps as it is."""
    f = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return f(False) if f is not None else None


def _end(net: nn.Module, args: Any, out: Any) -> None:
    running = _forwards()
    k = next((i for i in range(len(running) - 1, -1, -1) if running[i][0] is net), None)
    if k is None:
        return
    entry = running.pop(k)[1]
    if entry is None:
        return
    s, hooks = entry
    live = packed.sessions()
    if s in live:  # (wherever it is: a session ended is never left behind)
        live.remove(s)
    hooks.__exit__(None, None, None)
    s.end()
    net.__dict__["_flexdsl_keep_report"] = s.report


def _norm_pre(module: nn.Module, args: Any) -> None:
    s = packed.session()
    if (s is None or s.mode is None or not args or not isinstance(args[0], torch.Tensor)
            or not _direct(module, args[0]) or _hooked(module)):
        return  # (its output kept as it is)
    x = args[0]
    dev = x.device.type
    s.norm_in[id(module)] = (s.norm_input(module, x), {"training": module.training,
                                                        "autocast": torch.is_autocast_enabled(dev),
                                                        "autocast_dtype": torch.get_autocast_dtype(dev)})


def _norm_post(module: nn.Module, args: Any, out: Any) -> None:
    s = packed.session()
    entry = s.norm_in.pop(id(module), None) if s is not None else None
    if entry is not None and not _hooked(module):
        s.norm(module, entry[0], out, entry[1])


def _pool_pre(module: nn.Module, args: Any) -> None:
    s = packed.session()
    if s is not None and not module.return_indices:
        s.pool = {"module": module, "input": None}


def _pool_post(module: nn.Module, args: Any, out: Any) -> None:
    s = packed.session()
    if s is not None:
        s.pool = None


_OWN_HOOKS.update((_begin, _end, _norm_pre, _norm_post, _pool_pre, _pool_post))


def install(net: nn.Module, mode: str | None) -> int:
    """Make `net`'s forward a keep session with `mode` (see the module doc); returns the number of
    normalizations recomputed (torch's and SpikingJelly's batch norms; a call of one with hooks of
    its own keeps its output). Installing again changes the mode."""
    net.__dict__["_flexdsl_recompute"] = mode
    if not net.__dict__.get("_flexdsl_keep_hooks"):
        net.register_forward_pre_hook(_begin)
        net.register_forward_hook(_end, always_call=True)
        net.__dict__["_flexdsl_keep_hooks"] = True
    norms = 0
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            if mode is not None and not m.__dict__.get("_flexdsl_norm_hooks"):
                m.register_forward_pre_hook(_norm_pre)
                m.register_forward_hook(_norm_post, always_call=True)
                m.__dict__["_flexdsl_norm_hooks"] = True
            norms += mode is not None and recomputable(m)
        elif isinstance(m, tuple(_POOLS)) and not m.__dict__.get("_flexdsl_pool_hooks"):
            m.register_forward_pre_hook(_pool_pre)
            m.register_forward_hook(_pool_post, always_call=True)
            m.__dict__["_flexdsl_pool_hooks"] = True
    return norms


def report(net: nn.Module) -> Report | None:
    """What the last forward of a rewritten `net` saved (None before its first forward)."""
    return net.__dict__.get("_flexdsl_keep_report")


__all__ = ["MODES", "Report", "Session", "install", "report"]
