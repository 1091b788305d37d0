"""The recurrent layer as one graph node under torch.compile: its custom ops `rec_fwd` and
`rec_bwd` (`register_ops`, once per program and process), their fake implementations and
autograd. The layer's forward and backward are `layercall`'s, looked up there at call time."""

from __future__ import annotations

from typing import Any

import torch

from . import layercall
from .base import NoiseKey, key_ints
from .exact import exact_bf16
from .ops import Op, define


def _unpack_args(tensors, vals, kinds, n_in: int, n_st: int) -> tuple[list, list, list, NoiseKey | None]:
    """(inputs, states, params, the key of a noisy model's draws: a last tensor of kind 3)."""
    noise = None
    if kinds and kinds[-1] == 3:
        noise = NoiseKey(*key_ints(tensors[-1]))
        tensors, kinds = tensors[:-1], kinds[:-1]
    it_t, it_v = iter(tensors), iter(vals)
    out = [None if k == 2 else next(it_t) if k == 1 else next(it_v) for k in kinds]
    return out[:n_in], out[n_in:n_in + n_st], out[n_in + n_st:], noise


_FWD = ("(Tensor x, Tensor w, Tensor s0, Tensor? w_in, Tensor? b, Tensor[] tensors, float[] vals, int[] kinds, "
        "bool keep) -> Tensor[]")
_BWD = ("(Tensor x, Tensor w, Tensor s0, Tensor? w_in, Tensor? b, Tensor[] tensors, float[] vals, int[] kinds, "
        "Tensor?[] grads, bool[] need, Tensor[] kept) -> Tensor[]")


def keeps(prog: Any) -> bool:
    """Whether the layer's forward op can keep what its backward reads (the program says what it
    saves: `saved_shapes`, `saved_tensors`, `restore`), so that the backward need not recompute it."""
    return hasattr(prog, "saved_shapes")


def register_ops(prog: Any, name: str, n_in: int, n_st: int, n_out: int, dense: bool) -> tuple:
    """The layer's custom ops `rec_fwd` and `rec_bwd` (once per program and process), with fake
    implementations and autograd, for torch.compile: one graph node per layer, never a trace of
    the loop. With `keep` (a call that trains, on a program that `keeps`), the forward op also
    returns what the backward reads: S (s0, then the source of every step) and the program's
    saved tensors, as eagerly. Else (the Triton kernels) the backward op runs the forward again,
    keeping what its backward reads, then the backward (as with activation checkpointing)."""
    ns = f"flexdsl_rec_{name}"

    def fwd_impl(x, w, s0, w_in, b, tensors, vals, kinds, keep):
        inputs, states, params, noise = _unpack_args(tensors, vals, kinds, n_in, n_st)
        xb = exact_bf16(x, prog) if w_in is not None and layercall.fusable(x, w_in, b) else None
        outs, fins, sv = layercall.forward(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, keep, noise)
        kept = [sv.S, *prog.saved_tensors(sv.saved)] if sv is not None else []
        return _fresh([*outs, *fins, *kept], [x, w, s0, w_in, b, *tensors])

    def fwd_fake(x, w, s0, w_in, b, tensors, vals, kinds, keep):
        ix = torch.nn.functional.linear(x, w_in, b) if w_in is not None else x if b is None else x + b
        T, B, H = ix.shape
        res = [ix.new_empty((T, B, H)) for _ in range(n_out)] + [ix.new_empty((B, H)) for _ in range(n_st)]
        if keep:
            res += [ix.new_empty((T + 1, B, H)), *(ix.new_empty(s) for s in prog.saved_shapes(T, (B, H)))]
        return res

    def bwd_impl(x, w, s0, w_in, b, tensors, vals, kinds, grads, need, kept):
        inputs, states, params, noise = _unpack_args(tensors, vals, kinds, n_in, n_st)
        if kept:
            sv = layercall.restore(prog, x, w, s0, w_in, b, kept, inputs, states, params, dense, noise)
        else:
            xb = exact_bf16(x, prog) if w_in is not None and layercall.fusable(x, w_in, b) else None
            _, _, sv = layercall.forward(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, True, noise)
        assert sv is not None
        g = layercall.backward(prog, sv, inputs, states, params, dense, grads, need[:len(need) - (noise is not None)])
        g += [None] * (noise is not None)  # (the key: no gradient)
        args = [x, w, s0, w_in, b, *tensors]
        return [(gi if gi is not None else torch.zeros_like(a)).to(a.dtype).reshape(a.shape)
                for gi, a, n in zip(g, args, need) if n]

    def bwd_fake(x, w, s0, w_in, b, tensors, vals, kinds, grads, need, kept):
        return [a.new_empty(a.shape) for a, n in zip([x, w, s0, w_in, b, *tensors], need) if n]

    return define(ns, [Op("rec_fwd", fwd_impl, _FWD, fwd_fake), Op("rec_bwd", bwd_impl, _BWD, bwd_fake)],
                  via="library", autograd=lambda handles: _autograd(handles[1], n_out, n_st), once=True)


def _autograd(bwd: Any, n_out: int, n_st: int) -> tuple[Any, Any]:
    """The forward op's autograd formula (setup_context, backward), with `bwd` the backward op."""

    def setup_context(ctx, inputs, output):
        x, w, s0, w_in, b, tensors, vals, kinds, keep = inputs
        args = [x, w, s0, w_in, b, *tensors]
        ctx.need = [a is not None and a.requires_grad for a in args]
        ctx.vals, ctx.kinds, ctx.n = list(vals), list(kinds), len(tensors)
        ctx.n_kept = len(output) - n_out - n_st
        ctx.save_for_backward(*args, *output[n_out + n_st:])

    def backward(ctx, grads):
        if not torch.compiler.is_compiling() and torch.is_grad_enabled():
            layercall.first_order()
        x, w, s0, w_in, b, *rest = ctx.saved_tensors
        tensors, kept = rest[:ctx.n], rest[ctx.n:]
        res = iter(bwd(x, w, s0, w_in, b, tensors, ctx.vals, ctx.kinds, list(grads[:n_out + n_st]), ctx.need,
                       kept))
        g = [next(res) if n else None for n in ctx.need]
        # (an empty list of floats has the structure of an empty list of tensors: its "gradient" is [])
        return (*g[:5], g[5:], None if ctx.vals else [], None if ctx.kinds else [], None)

    return setup_context, backward


def _fresh(results: list[torch.Tensor], args: list) -> list[torch.Tensor]:
    """A custom op's results sharing no memory with its arguments or with each other (a final
    state may be an initial one, unchanged, or a view of an output): copies where they would."""
    seen = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor) and a.numel()}
    out = []
    for r in results:
        ptr = r.untyped_storage().data_ptr() if r.numel() else None
        if ptr is not None and ptr in seen:
            r = r.clone()
            ptr = r.untyped_storage().data_ptr()
        if ptr is not None:
            seen.add(ptr)
        out.append(r)
    return out


__all__ = ["keeps", "register_ops"]
