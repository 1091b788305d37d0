"""The torch backend's time loop as one graph node, for torch.compile.

Eagerly, the torch backend runs `core` step by step with autograd. Traced step by step, the
same loop would be unrolled into T copies of the step (compile time growing with T). Under a
trace the loop is instead one pair of `torch.library` custom ops per model:

- `torch_fwd(inputs, states, params, store_seqs, save)`: the T steps of `core` without autograd;
  the outputs, the final states, the state sequences (with `store_seqs`) and, for training
  (`save`), the state before each step;
- `torch_bwd(...)`: the derived vector-Jacobian product (`core_backward`, printed from the
  symbolic backward) in reverse time, from those states; it returns full-shape gradients,
  which the autograd formula reduces to each tensor's shape (traced torch ops).

Params are tensors (a non-learnable param is an entry of the module's float64 parameter tensor
under a trace), so a new value is a new input, never a recompilation; the fake
implementations give the shapes, so the graph is built without running a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..base import NoiseKey, key_ints
from ..ops import Op, define


def _full(v: Any, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A value (number or broadcastable tensor) as a contiguous tensor of `shape` in `like`'s
    dtype and device."""
    if isinstance(v, torch.Tensor):
        return v.to(like.dtype).expand(shape).contiguous()
    return torch.full(tuple(shape), float(v), dtype=like.dtype, device=like.device)


def _sum_to(g: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A full-shape gradient reduced to a tensor's own (broadcast) shape."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    if len(shape) == 0:
        return g.sum()
    return g.sum_to_size(shape)


class ScanOps:
    """The custom ops of one model (see the module docstring). `loop(inputs, states, params,
    store_seqs, keep_prev)` is the program's forward loop; `core_backward` the derived VJP of
    one step: (*inputs, *states, *grad outputs, *grad next states, *params) -> (*grad inputs,
    *grad states, *grad learnable params)."""

    def __init__(self, ns: str, loop: Callable, core_backward: Callable, n_in: int, n_st: int, n_out: int,
                 learnable: Sequence[bool], stream: Callable | None = None) -> None:
        self.loop, self.core_backward = loop, core_backward
        self.stream = stream or (lambda *a: None)  # the draws of a call, for a noisy model
        self.n_in, self.n_st, self.n_out = n_in, n_st, n_out
        self.learnable = list(learnable)  # per param (declared, then derived)
        ops = self

        noisy = stream is not None

        def fwd(inputs: list[torch.Tensor], states: list[torch.Tensor], params: list[torch.Tensor],
                store_seqs: bool, save: bool, key: torch.Tensor | None = None) -> list[torch.Tensor]:
            return ops.forward(inputs, states, params, store_seqs, save, key)

        def fwd_fake(inputs, states, params, store_seqs, save, key=None):
            x0 = inputs[0]
            T = x0.shape[0]
            shape = _step_shape(inputs)
            n = n_out * [(T, *shape)] + n_st * [tuple(shape)] + (n_st * [(T, *shape)] if store_seqs else []) \
                + (n_st * [(T, *shape)] if save else [])
            return [x0.new_empty(s) for s in n]

        def bwd(inputs: list[torch.Tensor], prevs: list[torch.Tensor], params: list[torch.Tensor],
                g_outs: list[torch.Tensor | None], g_seqs: list[torch.Tensor | None],
                g_fins: list[torch.Tensor | None], need: list[bool],
                key: torch.Tensor | None = None) -> list[torch.Tensor]:
            return ops.backward(inputs, prevs, params, g_outs, g_seqs, g_fins, need, key)

        def bwd_fake(inputs, prevs, params, g_outs, g_seqs, g_fins, need, key=None):
            x0 = inputs[0]
            T, shape = x0.shape[0], _step_shape(inputs)
            out = [x0.new_empty((T, *shape)) for n in need[:n_in] if n]
            out += [x0.new_empty(tuple(shape)) for n in need[n_in:n_in + n_st] if n]
            out += [x0.new_empty(tuple(shape), dtype=torch.float64) for n in need[n_in + n_st:] if n]
            return out

        self.fwd, self.bwd = define(ns, [Op("torch_fwd", fwd, fake=fwd_fake, noisy=noisy),
                                         Op("torch_bwd", bwd, fake=bwd_fake, noisy=noisy)],
                                    autograd=lambda handles: _autograd(ops, handles[1]))

    # ------------------------------------------------------------------ implementations
    def forward(self, inputs, states, params, store_seqs: bool, save: bool, key=None) -> list[torch.Tensor]:
        with torch.no_grad():
            outs, fins, seqs, prevs = self.loop(list(inputs), list(states), list(params), store_seqs, save,
                                                _noise_key(key))
        x0 = inputs[0]
        T, shape = x0.shape[0], _step_shape(inputs)
        res = [_full(o, (T, *shape), x0) for o in outs] + [_full(s, shape, x0) for s in fins]
        if store_seqs:
            res += [_full(q, (T, *shape), x0) for q in seqs]
        if save:
            res += [_full(q, (T, *shape), x0) for q in prevs]
        return _unaliased(res, [*inputs, *states, *params])

    def backward(self, inputs, prevs, params, g_outs, g_seqs, g_fins, need, key=None) -> list[torch.Tensor]:
        """The derived VJP over the T steps, in reverse time: per step, `core_backward` at the
        step's inputs and previous states, with the outputs' gradients of the step and the
        gradients flowing back from the later steps."""
        n_in, n_st = self.n_in, self.n_st
        x0 = inputs[0]
        T, shape = x0.shape[0], tuple(_step_shape(inputs))
        dtype, device = x0.dtype, x0.device
        n_p = len(params)
        need_x, need_s, need_p = need[:n_in], need[n_in:n_in + n_st], need[n_in + n_st:]
        learn = [i for i, lrn in enumerate(self.learnable) if lrn]  # core_backward returns these params' grads
        g_state: list[Any] = [_full(g, shape, x0) if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                              for g in g_fins]
        gx = [torch.empty((T, *shape), dtype=dtype, device=device) if n else None for n in need_x]
        gp = [torch.zeros(shape, dtype=torch.float64, device=device) if n else None for n in need_p[:n_p]]
        zero = torch.zeros((), dtype=dtype, device=device)
        stream = self.stream(_noise_key(key), T, shape, dtype, device)  # (a noisy model: the forward's draws)
        for t in range(T - 1, -1, -1):
            for i, g in enumerate(g_seqs):
                if g is not None:
                    g_state[i] = g_state[i] + g[t]
            go = [g[t] if g is not None else zero for g in g_outs]
            r = self.core_backward(*(x[t] for x in inputs), *(p[t] for p in prevs), *go, *g_state, *params,
                                   *([stream.at(t)] if stream is not None else []))
            for i in range(n_in):
                if need_x[i]:
                    gx[i][t] = _full(r[i], shape, x0)  # type: ignore[index]
            g_state = [_full(r[n_in + i], shape, x0) for i in range(n_st)]
            for k, j in enumerate(learn):
                if j < len(gp) and gp[j] is not None:
                    gp[j] = gp[j] + _full(r[n_in + n_st + k], shape, x0).to(torch.float64)  # type: ignore[operator]
        out = [g for g in gx if g is not None]
        out += [g for g, n in zip(g_state, need_s) if n]
        out += [g for g in gp if g is not None]
        return _unaliased(out, [*inputs, *prevs, *params, *(g for g in [*g_outs, *g_seqs, *g_fins] if g is not None)])


def _autograd(ops: ScanOps, bwd: Any) -> tuple[Callable, Callable]:
    """The forward op's autograd formula (setup_context, backward), with `bwd` the backward op."""
    n_st, n_out = ops.n_st, ops.n_out

    def setup_context(ctx, inputs, output):
        xs, states, params, store_seqs, save, *key = inputs
        ctx.key = key[0] if key else None
        ctx.store_seqs = store_seqs
        ctx.shapes = ([tuple(x.shape) for x in xs], [tuple(s.shape) for s in states],
                      [tuple(p.shape) for p in params])
        ctx.param_dtypes = [p.dtype for p in params]
        ctx.need = [*(x.requires_grad for x in xs), *(s.requires_grad for s in states),
                    *(p.requires_grad and lrn for p, lrn in zip(params, ops.learnable))]
        prevs = output[len(output) - n_st:] if save else []
        ctx.save_for_backward(*xs, *prevs, *params)
        ctx.n = (len(xs), len(prevs))
        ctx.set_materialize_grads(False)

    def backward(ctx, grads):
        n_x, n_prev = ctx.n
        saved = ctx.saved_tensors
        xs, prevs, params = list(saved[:n_x]), list(saved[n_x:n_x + n_prev]), list(saved[n_x + n_prev:])
        g_outs = list(grads[:n_out])
        g_fins = list(grads[n_out:n_out + n_st])
        g_seqs = list(grads[n_out + n_st:n_out + 2 * n_st]) if ctx.store_seqs else [None] * n_st
        x_shapes, s_shapes, p_shapes = ctx.shapes
        extra = [None] if ctx.key is not None else []
        none = ([None] * len(xs), [None] * len(s_shapes), [None] * len(params), None, None, *extra)
        if not any(ctx.need) or not prevs or all(g is None for g in [*g_outs, *g_fins, *g_seqs]):
            return none
        res = iter(bwd(xs, prevs, params, g_outs, g_seqs, g_fins, ctx.need,
                       *([ctx.key] if ctx.key is not None else [])))
        need = ctx.need
        gx = [_sum_to(next(res), (sh[0], *sh[1:])) if need[i] else None for i, sh in enumerate(x_shapes)]
        gs = [_sum_to(next(res), sh) if need[n_x + i] else None for i, sh in enumerate(s_shapes)]
        gp = [_sum_to(next(res), sh).to(dt) if need[n_x + len(s_shapes) + i] else None
              for i, (sh, dt) in enumerate(zip(p_shapes, ctx.param_dtypes))]
        return gx, gs, gp, None, None, *extra

    return setup_context, backward


def _noise_key(key: Sequence[torch.Tensor]) -> NoiseKey | None:
    return NoiseKey(*key_ints(key)) if key is not None else None


def _step_shape(inputs: Sequence[torch.Tensor]) -> torch.Size:
    if len(inputs) == 1:
        return inputs[0].shape[1:]
    return torch.broadcast_shapes(*(x.shape[1:] for x in inputs))


def _unaliased(outs: list[torch.Tensor], args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A custom op's results must be fresh tensors: a copy of any that shares memory with an
    argument or an earlier result."""
    seen = {a.untyped_storage().data_ptr() for a in args if a.numel()}
    res = []
    for o in outs:
        if o.numel() and o.untyped_storage().data_ptr() in seen:
            o = o.clone()
        if o.numel():
            seen.add(o.untyped_storage().data_ptr())
        res.append(o)
    return res


__all__ = ["ScanOps"]
