"""The Triton program's autograd and custom-op glue: one `torch.library.custom_op` pair per model
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

from ...errors import FlexDSLError
from ..base import NoiseKey, custom_op, key_ints
from .args import unpack
from .kernel import prod

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
    sizes = [call.T, len(reread), len(grads.outs), len(grads.seqs), *call.shape]
    # (which params and states are passed as tensors: the backward gets the states only to recompute)
    flags = [*(p is not None for p in params), *(s is not None for s in states), *need, call.recompute,
             call.store_seqs]
    return tensors, sizes, [*call.param_vals, *call.state_vals], flags, call.dtype


def unpack_bwd(tm: TritonProgram, tensors: list, sizes: list[int], vals: list[float], flags: list[bool],
               dtype: torch.dtype) -> tuple[Call, list, Any, list, list, Grads, list[bool]]:
    """The inverse of `pack`: (call, reread, saved, params, states, grads, need)."""
    n_pr, n_st, n_in = len(tm.params), len(tm.states), len(tm.inputs)
    T, n_re, n_out, n_seq, *shape = sizes
    p_is_t, s_is_t = list(flags[:n_pr]), list(flags[n_pr:n_pr + n_st])
    need = list(flags[n_pr + n_st:n_pr + n_st + n_in + n_st + len(tm.learnable)])
    recompute, store_seqs = bool(flags[-2]), bool(flags[-1])
    call = Call(T, tuple(shape), dtype, list(vals[:n_pr]), p_is_t, list(vals[n_pr:]), s_is_t, store_seqs, recompute)
    reread, saved = list(tensors[:n_re]), tensors[n_re]
    rest = tensors[n_re + 1:]
    k_p, k_s = sum(p_is_t), sum(s_is_t)
    params = unpack(rest[:k_p], (), p_is_t)
    states = unpack(rest[k_p:k_p + k_s], (), s_is_t)
    g = rest[k_p + k_s:]
    grads = Grads(list(g[:n_out]), list(g[n_out:n_out + n_seq]), list(g[n_out + n_seq:]))
    return call, reread, saved, params, states, grads, need


def register_ops(tm: TritonProgram) -> tuple[Any, Any]:
    """The model's custom ops `fwd` and `bwd`, with fake implementations and autograd."""
    ns = f"flexdsl_{''.join(ch for ch in tm.name.lower() if ch.isascii() and ch.isalnum())[:24]}_{tm.key[:16]}"
    n_out, n_st = len(tm.outputs), len(tm.states)

    noisy = bool(tm.abi.draws)

    @custom_op(f"{ns}::fwd", noisy)
    def fwd(inputs: list[torch.Tensor], states: list[torch.Tensor], params: list[torch.Tensor],
            state_vals: list[float], param_vals: list[float], is_tensor: list[bool], store_seqs: bool,
            save: bool, recompute: bool, key: torch.Tensor | None = None) -> list[torch.Tensor]:
        return tm.fwd_impl(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute,
                           key)

    @fwd.register_fake
    def _(inputs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute, key=None):
        x0 = inputs[0]
        T, shape = x0.shape[0], x0.shape[1:]
        res = [x0.new_empty((T, *shape)) for _ in range(n_out)] + [x0.new_empty(shape) for _ in range(n_st)]
        if store_seqs:
            res += [x0.new_empty((T, *shape)) for _ in range(n_st)]
        if save and recompute:
            res.append(x0.new_empty((max(tm.chunks(T) - 1, 0), n_st, prod(shape)), dtype=torch.float32))
        elif save and tm.saved:
            res.append(x0.new_empty((len(tm.saved), T, *shape)))
        return res

    @custom_op(f"{ns}::bwd", noisy)
    def bwd(tensors: list[torch.Tensor | None], sizes: list[int], vals: list[float], flags: list[bool],
            dtype: torch.dtype, key: torch.Tensor | None = None) -> list[torch.Tensor]:
        call, *rest = unpack_bwd(tm, tensors, sizes, vals, flags, dtype)
        if key is not None:  # (a noisy model: the forward's draws)
            call.seed, call.t0 = key_ints(key)
        return tm.bwd(call, *rest)

    @bwd.register_fake
    def _(tensors, sizes, vals, flags, dtype, key=None):
        call, *_, need = unpack_bwd(tm, tensors, sizes, vals, flags, dtype)
        like = next(t for t in tensors if t is not None)
        n_in = len(tm.inputs)
        res = [like.new_empty((call.T, *call.shape), dtype=dtype) for n in need[:n_in] if n]
        res += [like.new_empty(call.shape, dtype=torch.float32) for n in need[n_in:] if n]
        return res

    def setup_context(ctx, inputs, output):
        xs, states, params, state_vals, param_vals, is_tensor, store_seqs, save, recompute, *key = inputs
        ctx.key = key[0] if key else None  # (a noisy model's op takes the key of its draws)
        key = ctx.key
        call = tm.call(xs, state_vals, param_vals, is_tensor, store_seqs, recompute,
                       NoiseKey(0) if key is not None else None)
        keep(tm, ctx, xs, unpack(states, (), call.state_is_t), unpack(params, (), call.param_is_t), call, save,
             output)

    def backward(ctx, grads):
        if not torch.compiler.is_compiling():
            first_order_only(tm)
        extra = [ctx.key] if ctx.key is not None else []
        g_in, g_st, g_pr = gradients(tm, ctx, grads, lambda *a: bwd(*pack(*a), *extra))
        return g_in, g_st, g_pr, None, None, None, None, None, None, *([None] * len(extra))

    fwd.register_autograd(backward, setup_context=setup_context)
    return fwd, bwd


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
    if torch.is_grad_enabled():
        raise FlexDSLError("second-order gradients (create_graph=True) cannot go through the Triton kernels of "
                           f"{tm.name}: their backward is a kernel, and its results are not differentiable",
                           tm.abi.name, hint="use backend='torch' for this model (its backward is differentiable)")


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


__all__ = ["Call", "Grads", "register_ops", "Eager", "pack", "unpack_bwd"]
