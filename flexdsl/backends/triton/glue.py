"""The Triton program's autograd and custom-op glue: one custom-op pair per model (built by `backends/ops.py`)
(so that `torch.compile(fullgraph=True)` and CUDA graphs see opaque ops with fake
implementations), their autograd formula, and the eager path (`Eager`: the same kernels without
the dispatcher's per-call cost). What a call is, besides its tensors, travels as one `Call`
record: from the forward to the backward on the autograd context, and through the backward op's
schema packed into four lists (`pack`/`unpack_bwd`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..base import NoiseKey, key_ints
from ..ops import Op, define
from .args import alloc, step_order, unpack
from .kernel import first_order, prod

TritonProgram = Any  # (launch.TritonProgram, which imports this module)


@dataclass
class Call:
    """One call of the kernels besides its tensors: the input's length `T`, one step's `shape`
    and the I/O `dtype`; each param's and state's value where it is a float (0.0 where it is a
    tensor, `*_is_t`); whether the forward stores the state sequences and whether training
    recomputes (else saves)."""

    T: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    param_vals: list[float]
    param_is_t: list[bool]
    state_vals: list[float]
    state_is_t: list[bool]
    store_seqs: bool = False
    recompute: bool = False
    order: tuple[int, ...] | None = None  # the layout of its steps in memory (args.step_order)
    seed: int = 0  # the key of a noisy model's draws (`base.NoiseKey`)
    t0: int = 0

    def key_values(self) -> dict[str, list[int]]:
        """The kernels' key arguments: the seed's low and high 31 bits, the first step's counter."""
        return {"seedlo": [self.seed & 0x7FFFFFFF], "seedhi": [self.seed >> 31], "tbase": [self.t0]}


@dataclass
class Grads:
    """The gradients a backward gets: of the outputs [T, *shape], of the state sequences and of
    the final states (None where none flows)."""

    outs: list[Any]
    seqs: list[Any]
    fins: list[Any]


def pack(call: Call, reread: list, saved: Any, params: list, states: list, grads: Grads, need: list[bool]
         ) -> tuple[list, list[int], list[float], list[bool], torch.dtype]:
    """A backward's arguments as the backward op's schema takes them: (tensors, sizes, floats,
    flags, dtype)."""
    tensors = [*reread, saved, *(p for p in params if p is not None), *(s for s in states if s is not None),
               *grads.outs, *grads.seqs, *grads.fins]
    sizes = [call.T, len(reread), len(grads.outs), len(grads.seqs), *call.shape,
             *(call.order if call.order is not None else range(len(call.shape)))]
    # (which params and states are passed as tensors: the backward gets the states only to recompute)
    flags = [*(p is not None for p in params), *(s is not None for s in states), *need, call.recompute,
             call.store_seqs]
    return tensors, sizes, [*call.param_vals, *call.state_vals], flags, call.dtype


def unpack_bwd(tm: TritonProgram, tensors: list, sizes: list[int], vals: list[float], flags: list[bool],
               dtype: torch.dtype) -> tuple[Call, list, Any, list, list, Grads, list[bool]]:
    """The inverse of `pack`: (call, reread, saved, params, states, grads, need)."""
    n_pr, n_st, n_in = len(tm.params), len(tm.states), len(tm.inputs)
    T, n_re, n_out, n_seq, *dims = sizes
    shape, order = dims[:len(dims) // 2], tuple(dims[len(dims) // 2:])
    p_is_t, s_is_t = list(flags[:n_pr]), list(flags[n_pr:n_pr + n_st])
    need = list(flags[n_pr + n_st:n_pr + n_st + n_in + n_st + len(tm.learnable)])
    recompute, store_seqs = bool(flags[-2]), bool(flags[-1])
    call = Call(T, tuple(shape), dtype, list(vals[:n_pr]), p_is_t, list(vals[n_pr:]), s_is_t, store_seqs, recompute,
                None if order == tuple(range(len(shape))) else order)
    reread, saved = list(tensors[:n_re]), tensors[n_re]
    rest = tensors[n_re + 1:]
    k_p, k_s = sum(p_is_t), sum(s_is_t)
    params = unpack(rest[:k_p], (), p_is_t)
    states = unpack(rest[k_p:k_p + k_s], (), s_is_t)
    g = rest[k_p + k_s:]
    grads = Grads(list(g[:n_out]), list(g[n_out:n_out + n_seq]), list(g[n_out + n_seq:]))
    return call, reread, saved, params, states, grads, need


# torch.library ops cannot be unregistered: one pair per model key and process (`ops.define`'s `once`),
# calling the newest program of that key (programs of one key are the same kernels), so that an
# evicted program is freed
_OWNER: dict[str, TritonProgram] = {}


class _Owner:
    """The program the ops of namespace `ns` run: the newest loaded."""

    def __init__(self, ns: str) -> None:
        self.ns = ns

    def __getattr__(self, name: str) -> Any:
        return getattr(_OWNER[self.ns], name)


_FWD_SCHEMA = ("fwd(Tensor[] inputs, Tensor[] states, Tensor[] params, float[] state_vals, float[] param_vals, "
               "bool[] is_tensor, bool store_seqs, bool save, bool recompute) -> Tensor[]")
_BWD_SCHEMA = "bwd(Tensor?[] tensors, int[] sizes, float[] vals, bool[] flags, ScalarType dtype) -> Tensor[]"


def _namespace(program: TritonProgram) -> str:
    """The ops' namespace: the model's name (ASCII letters and digits) and its key."""
    name = "".join(ch for ch in program.name.lower() if ch.isascii() and ch.isalnum())[:24]
    return f"flexdsl_{name}_{program.key[:16]}"


def register_ops(program: TritonProgram) -> tuple[Any, Any]:
    """The model's custom ops `fwd` and `bwd`, with fake implementations and autograd (once per
    model key and process; they run the newest program of the key).

    They are defined through a `torch.library.Library` (`ops.define(via="library")`: a schema, one
    Python kernel for every device, a fake, the autograd formula) rather than `custom_op`, whose wrapper
    checks aliasing and disables Dynamo on every call: a compiled graph calls these ops once per
    layer and step, and the wrapper would cost more than the launch itself (tens of µs a call)."""
    ns = _namespace(program)
    _OWNER[ns] = program
    tm: Any = _Owner(ns)
    n_out, n_st = len(program.outputs), len(program.states)
    # flexible layout: Inductor passes the ops their inputs in the layout it chose (channels_last next to
    # convolutions); the kernels run on any layout whose steps are dense in memory, and give outputs in it
    # a noisy model's ops take the key of its draws (an int64 tensor: seed, first step) last
    key = ", Tensor key)" if program.abi.draws else ")"
    fwd_schema = _FWD_SCHEMA[len("fwd"):].replace(") ->", key + " ->")
    bwd_schema = _BWD_SCHEMA[len("bwd"):].replace(") ->", key + " ->")

    def fwd_kernel(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute, *key):
        return _OWNER[ns].fwd_impl(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save,
                                   recompute, *key)

    def fwd_fake(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute, *key):
        x0 = inputs[0]
        # (the outputs' layout: the input's; a noisy model's steps in C order, where its elements are numbered)
        T, shape, order = x0.shape[0], x0.shape[1:], None if key else step_order(x0)
        dt, dev = x0.dtype, x0.device
        res = [alloc((T,), shape, order, dt, dev) for _ in range(n_out)] + \
            [alloc((), shape, order, dt, dev) for _ in range(n_st)]
        if store_seqs:
            res += [alloc((T,), shape, order, dt, dev) for _ in range(n_st)]
        if save and recompute:
            res.append(x0.new_empty((max(tm.chunks(T) - 1, 0), n_st, prod(shape)), dtype=torch.float32))
        elif save and tm.saved:
            res.append(x0.new_empty((len(tm.saved), T, *shape)))
        return res

    def bwd_kernel(tensors, sizes, vals, flags, dtype, *key):
        p = _OWNER[ns]
        call, *rest = unpack_bwd(p, tensors, sizes, vals, flags, dtype)
        if key:  # (a noisy model: the forward's draws)
            call.seed, call.t0 = key_ints(key[0])
        return p.bwd(call, *rest)

    def bwd_fake(tensors, sizes, vals, flags, dtype, *key):
        call, *_, need = unpack_bwd(tm, tensors, sizes, vals, flags, dtype)
        dev = next(t for t in tensors if t is not None).device
        n_in = len(tm.inputs)
        res = [alloc((call.T,), call.shape, call.order, dtype, dev) for n in need[:n_in] if n]
        res += [alloc((), call.shape, call.order, torch.float32, dev) for n in need[n_in:] if n]
        return res

    fwd, bwd = define(ns, [Op("fwd", fwd_kernel, fwd_schema, fwd_fake), Op("bwd", bwd_kernel, bwd_schema, bwd_fake)],
                      via="library", tags=(torch.Tag.flexible_layout,),
                      autograd=lambda handles: autograd_fns(tm, handles[1]), once=True)
    return fwd, bwd


def autograd_fns(tm: TritonProgram, bwd) -> tuple[Any, Any]:
    """The forward op's autograd formula, (setup_context, backward), with `bwd` the backward op
    (shared by the ops of `register_ops` and of `inductor.register_triton_ops`)."""

    def setup_context(ctx, inputs, output):
        xs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute, *key = inputs
        ctx.key = key  # ([the key of a noisy model's draws], else [])
        call = tm.call(xs, state_vals, param_vals, is_tensor, store_seqs, recompute, NoiseKey(0) if key else None)
        keep(tm, ctx, xs, unpack(states, (), call.state_is_t), unpack(params, (), call.param_is_t), call, save,
             output)

    def backward(ctx, grads):
        if not torch.compiler.is_compiling():
            first_order_only(tm)
        g_in, g_st, g_pr = gradients(tm, ctx, grads, lambda *a: bwd(*pack(*a), *ctx.key))
        return g_in, g_st, g_pr, None, None, None, None, None, None, *([None] * len(ctx.key))

    return setup_context, backward


def keep(tm: TritonProgram, ctx, xs, st, pr, call: Call, save: bool, output) -> None:
    """Keep on `ctx` what the backward needs; `st` and `pr` hold the state and param tensors
    (None where a value is a float). Recomputing, the initial states are kept too (a reference,
    no copy): the backward starts the first chunk from them."""
    n_out, n_st = len(tm.outputs), len(tm.states)
    ctx.call = call
    ctx.st_kept = [call.recompute and s is not None for s in st]
    ctx.param_shapes = [None if p is None else p.shape for p in pr]
    ctx.need = [*(x.requires_grad and nz for x, nz in zip(xs, tm.grad_inputs)),
                *(s is not None and s.requires_grad and nz for s, nz in zip(st, tm.grad_states)),
                *(pr[i] is not None and pr[i].requires_grad and nz for i, nz in zip(tm.learn_idx, tm.grad_params))]
    ctx.state_dtypes = [None if s is None else s.dtype for s in st]
    extra = save and (call.recompute or bool(tm.saved))
    sav = output[n_out + n_st + (n_st if call.store_seqs else 0)] if extra else None
    idx = tm.rc_idx if call.recompute else tm.reread_idx
    ctx.n_reread = len(idx)
    ctx.save_for_backward(*[xs[i] for i in idx], sav, *(p for p in pr if p is not None),
                          *(s for s, k in zip(st, ctx.st_kept) if k))
    ctx.set_materialize_grads(False)


def gradients(tm: TritonProgram, ctx, grads, run) -> tuple[list, list, list]:
    """The gradients of a call: (of the inputs, of the state tensors, of the param tensors).
    `run(call, reread, saved, params, states, grads, need)` launches the backward kernel
    (`params` and `states` with None where a value was a float or is not needed)."""
    call: Call = ctx.call
    n_out, n_st, n_in = len(tm.outputs), len(tm.states), len(tm.inputs)
    saved = ctx.saved_tensors
    k = ctx.n_reread
    reread, sav = list(saved[:k]), saved[k]
    it = iter(saved[k + 1:])
    params = [next(it) if is_t else None for is_t in call.param_is_t]
    states = [next(it) if kept else None for kept in ctx.st_kept]
    g = Grads(list(grads[:n_out]), list(grads[n_out + n_st:n_out + 2 * n_st]) if call.store_seqs else tm._nones_st,
              list(grads[n_out:n_out + n_st]))
    need = ctx.need
    g_in: list = [None] * n_in
    g_st: list = [None] * n_st
    g_pr: list = [None] * len(ctx.param_shapes)
    if any(need) and not all(x is None for x in [*g.outs, *g.fins, *g.seqs]):
        res = iter(run(call, reread, sav, params, states, g, need))
        for i in range(n_in):
            if need[i]:
                g_in[i] = next(res)
        for i in range(n_st):
            if need[n_in + i]:
                g_st[i] = next(res).to(ctx.state_dtypes[i])
        for i, n in zip(tm.learn_idx, need[n_in + n_st:]):
            if n:
                gp = next(res)
                pshape = ctx.param_shapes[i]
                g_pr[i] = gp.sum().reshape(pshape) if prod(pshape) == 1 else gp.sum_to_size(pshape)
    return (g_in, [x for x, t in zip(g_st, call.state_is_t) if t],
            [x for x, t in zip(g_pr, call.param_is_t) if t])


def first_order_only(tm: TritonProgram) -> None:
    """The backward kernel's gradients are not differentiable: under create_graph=True (grad
    mode on in a backward) they would silently act as constants, and second-order gradients
    through the kernels would be zero."""
    first_order(tm.name, tm.abi.name, "use backend='torch' for this model (its backward is differentiable)")


class Eager(torch.autograd.Function):
    """The eager path: the same kernels without the dispatcher's per-call cost of custom ops."""

    @staticmethod
    def forward(ctx, run, *tensors):
        tm, xs, st, pr, call = run
        res = tm._fwd(xs, st, pr, call, True)
        ctx.tm = tm
        keep(tm, ctx, xs, st, pr, call, True, res)
        n_keep = len(tm.outputs) + len(tm.states) * (2 if call.store_seqs else 1)
        if len(res) > n_keep:
            ctx.mark_non_differentiable(*res[n_keep:])
        return tuple(res)

    @staticmethod
    def backward(ctx, *grads):
        tm = ctx.tm
        first_order_only(tm)
        g_in, g_st, g_pr = gradients(tm, ctx, grads, tm.bwd)
        return (None, *g_in, *g_st, *g_pr)


__all__ = ["Call", "Grads", "register_ops", "autograd_fns", "Eager", "pack", "unpack_bwd"]
