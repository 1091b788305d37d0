"""`check_finite=True`: the first NaN or inf of a call, named and located.

A diverging model (an exponential term that overflows, a time step too long for an explicit
method) turns a state into inf, and the hard reset `s*e + (1 - s)*X` turns inf into NaN for
good; without a check, nothing says which state went first, or when. With the option on,
`NeuronModule` asks its program for the state sequences of the call (one more write of
`[T, *shape]` per state, on every backend) and hands them here after the call, with its
inputs, initial states and params; this module reads them once (`torch.isfinite`) and raises
a `NonFiniteError` at the first non-finite value: the param, the initial state, or the state
or output and the step where it appeared, its first element and value, what that element
held a step before and the inputs it saw. With the option off nothing of this runs.

Gradients too: with the option on, a call that records a graph passes its inputs, initial
states and learnable params through `guard`, an identity whose backward checks the gradient it
receives; a NaN or inf there (exploding gradients through a long sequence) raises a
`NonFiniteError` from `loss.backward()`, naming the input, state or param and, for an input,
the last step whose gradient is not finite (where the backward, coming from the end, first
produced one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import FlexDSLError
from ..frontend import ast as A

if TYPE_CHECKING:
    from ..backends.base import RunResult
    from .compiler import Compiled

ADVICE = ("a diverging model? an exponential term overflows for large arguments: clip its argument "
          "(e.g. `exp(min((v - v_T) / delta_T, 20.0))`, as Brian2 and NEST users do), bound the input, "
          "or shorten `dt`")


class NonFiniteError(FlexDSLError):
    """A NaN or inf found by `check_finite=True`. Besides the located message: `what` (the state,
    output or param), `step` (0-based, in this call; None for a param or an initial state),
    `index` (the element, a tuple), `value`, and the call's `state_seqs` and `outputs`."""

    def __init__(self, message: str, c: Compiled, pos: A.Pos, hint: str | None, what: str,
                 step: int | None, index: tuple[int, ...], value: float) -> None:
        super().__init__(message, c.filename, pos.line, pos.column, c.text, hint)
        self.what = what
        self.step = step
        self.index = index
        self.value = value
        self.state_seqs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}


def _first_bad(t: Any) -> tuple[tuple[int, ...], float] | None:
    """The first non-finite element of `t` (a float or a tensor; row-major) and its value, or None."""
    if not isinstance(t, torch.Tensor):
        return None if math.isfinite(float(t)) else ((), float(t))
    bad = ~torch.isfinite(t.detach())
    if not bool(bad.any()):
        return None
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))
    return index, float(t.detach().reshape(-1)[flat])


def _first_bad_step(seq: torch.Tensor) -> int | None:
    """The first step (index of dim 0) holding a non-finite value, or None."""
    if seq.numel() == 0:
        return None
    bad = ~torch.isfinite(seq.detach())
    if seq.dim() > 1:
        bad = bad.flatten(1).any(1)
    steps = bad.nonzero()
    return int(steps[0, 0]) if steps.numel() else None


def _at(v: Any, index: tuple[int, ...]) -> float:
    """A value (float or broadcastable tensor) at an element index of the step's shape."""
    if not isinstance(v, torch.Tensor):
        return float(v)
    v = v.detach()
    if v.dim() == 0:
        return float(v)
    idx = index[len(index) - v.dim():] if v.dim() <= len(index) else index
    return float(v[tuple(i if n > 1 else 0 for i, n in zip(idx, v.shape))])


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def check(c: Compiled, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any],
          res: RunResult) -> None:
    """Raise a NonFiniteError at the first non-finite value of a call (see the module docstring).
    `params` are the declared then the derived params as passed to the program, `states` the
    initial states, `res` the run with its state sequences. The error keeps the call's state
    sequences and outputs (`state_seqs`, `outputs`) for a look at what led there.

    Under `torch.compile` (which cannot branch on tensor values without a graph break) the check
    is one traced assertion that stops the call with a shorter message; an eager call names
    the state, the step and the element."""
    if torch.compiler.is_compiling():
        assert res.seqs is not None
        values = [*(p for p in params if isinstance(p, torch.Tensor)), *res.seqs, *res.outputs]
        ok = torch.stack([torch.isfinite(v).all() for v in values]).all() if values else None
        if ok is not None:
            torch._assert_async(ok, f"flexdsl check_finite: a NaN or inf appeared in a call of {c.name} "
                                    "(run it without torch.compile for the state, step and element)")
        return
    try:
        _check(c, inputs, states, params, res)
    except NonFiniteError as e:
        assert res.seqs is not None
        e.state_seqs = {s.name: q.detach() for s, q in zip(c.checked.states, res.seqs)}
        e.outputs = {name: o.detach() for (name, _), o in zip(c.checked.outputs, res.outputs)}
        raise


def _check(c: Compiled, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any],
           res: RunResult) -> None:
    ck = c.checked
    names = [p.name for p in ck.params] + c.derived_names
    for i, (name, v) in enumerate(zip(names, params)):
        hit = _first_bad(v)
        if hit is None:
            continue
        index, value = hit
        if i < len(ck.params):
            raise NonFiniteError(f"param `{name}` is {_fmt(value)}" + (f" at {index}" if index else ""), c,
                                 ck.params[i].pos, "a learnable param can diverge in training (a too large "
                                 "learning rate, or a NaN gradient upstream)", name, None, index, value)
        pos = c.step.origins.get(name) or ck.ast.pos
        raise NonFiniteError(f"`{name}`, a coefficient of the exact step computed from the params, is "
                             f"{_fmt(value)}", c, pos, "the params make the propagator overflow (a positive "
                             "rate times `dt` beyond ~700)", name, None, index, value)
    for s, v in zip(ck.states, states):
        hit = _first_bad(v)
        if hit is not None:
            index, value = hit
            raise NonFiniteError(f"state `{s.name}` is {_fmt(value)} before the first step (element {index})", c,
                                 s.pos, "its value was carried over from a previous call or assigned: "
                                 "`reset()` restores the initial states", s.name, None, index, value)
    assert res.seqs is not None, "check_finite needs the state sequences"
    # every state and every output that is not a state: the first step with a non-finite value
    seqs: list[tuple[str, A.Pos, torch.Tensor, bool]] = [
        (s.name, s.pos, q, True) for s, q in zip(ck.states, res.seqs)]
    state_names = {s.name for s in ck.states}
    seqs += [(name, pos, o, False) for (name, pos), o in zip(ck.outputs, res.outputs)
             if name != "spike" and name not in state_names]
    first: tuple[int, int] | None = None
    for k, (_, _, q, _) in enumerate(seqs):
        t = _first_bad_step(q)
        if t is not None and (first is None or t < first[0]):
            first = (t, k)
    if first is None:
        return
    t, k = first
    name, pos, q, is_state = seqs[k]
    hit = _first_bad(q[t])
    assert hit is not None
    index, value = hit
    T = q.shape[0]
    kind = "state" if is_state else "output"
    before = []
    for s, q0, s0 in zip(ck.states, res.seqs, states):
        prev = _at(q0[t - 1], index) if t > 0 else _at(s0, index)
        before.append(f"{s.name} = {_fmt(prev)}")
    seen = [f"{x.name} = {_fmt(_at(xv[t], index))}" for x, xv in zip(ck.inputs, inputs)]
    bad_inputs = [x.name for x, xv in zip(ck.inputs, inputs) if not torch.isfinite(xv[t].detach()).all()]
    context = (f"before step {t} that element held {', '.join(before)}"
               + (f"; its inputs at step {t}: {', '.join(seen)}" if seen else ""))
    if bad_inputs:
        hint = f"the input {', '.join(f'`{n}`' for n in bad_inputs)} is not finite at step {t}; {context}"
    else:
        hint = f"{context}; {ADVICE}"
    where_ = f", element {index}" if index else ""
    raise NonFiniteError(f"{kind} `{name}` became {_fmt(value)} at step {t} (0-based, of {T} in this call){where_}",
                         c, pos, hint, name, t, index, value)


class _Guard(torch.autograd.Function):
    """The identity; its backward raises at a non-finite gradient (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, c: Any, what: str, kind: str) -> torch.Tensor:
        ctx.info = (c, what, kind)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        if g is not None and not bool(torch.isfinite(g).all()):
            c, what, kind = ctx.info
            raise _gradient_error(c, what, kind, g)
        return g, None, None, None


def _gradient_error(c: Compiled, what: str, kind: str, g: torch.Tensor) -> NonFiniteError:
    ck = c.checked
    decl = next((d for d in [*ck.inputs, *ck.states, *ck.params] if d.name == what), None)
    pos = decl.pos if decl is not None else ck.ast.pos
    if kind == "input" and g.dim() >= 1:
        bad = ~torch.isfinite(g.detach())
        steps = bad.flatten(1).any(1).nonzero().flatten() if g.dim() > 1 else bad.nonzero().flatten()
        t = int(steps[-1])
        hit = _first_bad(g[t])
        assert hit is not None
        index, value = hit
        T = g.shape[0]
        n = len(steps)
        return NonFiniteError(
            f"the gradient of the loss with respect to input `{what}` is {_fmt(value)} at step {t} (0-based, of {T} in "
            f"this call){f', element {index}' if index else ''}; {n} step{'s' if n != 1 else ''} of it "
            "are not finite", c, pos, "exploding gradients: backpropagation through many steps multiplies the "
            "step's derivatives, which a hard reset or a steep surrogate can make large; shorten the sequence "
            "(truncated BPTT: `m.detach()` between chunks), use `detach_reset=True`, a flatter surrogate (smaller "
            "alpha), or clip gradients", what, t, index, value)
    hit = _first_bad(g)
    assert hit is not None
    index, value = hit
    label = {"state": "the initial state", "param": "param"}.get(kind, kind)
    return NonFiniteError(f"the gradient of the loss with respect to {label} `{what}` is {_fmt(value)}"
                          + (f" at {index}" if index else ""), c, pos,
                          "exploding gradients through the sequence: shorten it (truncated BPTT), use "
                          "`detach_reset=True`, a flatter surrogate, or clip gradients", what, None, index, value)


def guard(c: Compiled, inputs: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any]
          ) -> tuple[list[torch.Tensor], list[Any], list[Any]]:
    """The inputs, initial states and declared params of a call, each that needs a gradient passed
    through `_Guard` (the values are the same tensors' values)."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return list(inputs), list(states), list(params)
    ck = c.checked

    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)

    def g(v: Any, name: str, kind: str) -> Any:  # (not under a torch.func transform: vmap, grad)
        ok = isinstance(v, torch.Tensor) and v.requires_grad and not wrapped(v)
        return _Guard.apply(v, c, name, kind) if ok else v

    xs = [g(x, d.name, "input") for x, d in zip(inputs, ck.inputs)]
    st = [g(v, d.name, "state") for v, d in zip(states, ck.states)]
    n = len(ck.params)
    ps = [g(v, d.name, "param") for v, d in zip(params[:n], ck.params)] + list(params[n:])
    return xs, st, ps


__all__ = ["NonFiniteError", "check", "guard"]
