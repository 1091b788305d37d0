"""Every torch.library op of flexdsl is built here (issue 31): the other modules describe an op
(`Op`: its name, implementation, schema, fake implementation) and its autograd formula, and call
`define`; nothing else in the package calls `torch.library`.

An op pair (a forward op and its backward op, the forward's autograd formula calling the
backward op) is defined in one of three ways (`via`):

- "custom_op": `torch.library.custom_op`, the schema given or inferred from the implementation's
  annotations (`noisy`: a program's op whose last parameter is `key`, see `op_schema`); the
  handles are the `CustomOpDef`s (the torch scan, the CPU kernels, the runtime's check and seeds);
- "library": a `torch.library.Library` fragment (one Python kernel for every device, a fake
  implementation, optional tags such as `flexible_layout`): no wrapper around a call, whose aliasing
  checks would cost more than a launch (the Triton kernels, the recurrent layer); the handles are
  the `OpOverload`s;
- "triton_op": `torch.library.triton_op`, whose bodies launch kernels through `wrap_kernel`
  (`torch.library.wrap_triton`), so that Inductor launches them itself on CUDA; the handles are the
  `OpOverload`s.

torch.library ops cannot be unregistered, and two threads defining ops at once could destroy one
`Library` under the other: definitions run under one lock, libraries are kept alive here, and
`once=True` returns the ops a namespace already has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Op:
    """One op of a namespace: its `name`, its implementation `impl` (a triton_op's body), its
    `schema` without the name ("(Tensor x) -> Tensor"; None: inferred from `impl`'s annotations,
    custom_op and triton_op only), its `fake` (meta) implementation, the arguments it mutates.
    `noisy` (custom_op): the schema is `op_schema(impl, noisy)`."""

    name: str
    impl: Callable[..., Any]
    schema: str | None = None
    fake: Callable[..., Any] | None = None
    mutates_args: tuple[str, ...] = ()
    noisy: bool | None = None


# (handles) -> (setup_context, backward): the forward op's autograd formula, given the ops defined
Wiring = Callable[[tuple[Any, ...]], tuple[Callable[..., Any], Callable[..., Any]]]

_LOCK = threading.RLock()
_LIBS: dict[str, torch.library.Library] = {}  # namespace -> its fragment (an op lives as long as its library)
_MADE: dict[tuple[str, tuple[str, ...]], tuple[Any, ...]] = {}  # (namespace, names) -> handles (`once`)


def op_schema(fn: Callable[..., Any], noisy: bool) -> str:
    """The schema of a program's custom op whose last parameter is `key: torch.Tensor | None = None`:
    without it for a model without noise (the op of such a model is what it was before noise
    existed), with a required key for a noisy one (so that a traced call always passes it, and the
    autograd formula's inputs are always the same)."""
    schema = torch.library.infer_schema(fn, mutates_args=())
    assert ", Tensor? key=None)" in schema, schema
    return schema.replace(", Tensor? key=None)", ", Tensor key)" if noisy else ")")


def define(ns: str, ops: Sequence[Op], *, via: str = "custom_op", tags: Sequence[Any] = (),
           device_types: str | None = None, autograd: Wiring | None = None, once: bool = False) -> tuple[Any, ...]:
    """Define the ops `ops` in namespace `ns` (see the module docstring for `via`), with their
    fake implementations and, with `autograd`, the first op's autograd formula; their handles, in
    order. `tags` (library): each op's tags; `device_types` (custom_op): the devices its
    implementation is for. With `once`, a namespace whose ops exist gets them back."""
    key = (ns, tuple(op.name for op in ops))
    if once and key in _MADE:
        return _MADE[key]
    with _LOCK:
        if once and key in _MADE:
            return _MADE[key]
        if via == "custom_op":
            handles, wire = _custom_ops(ns, ops, device_types)
        elif via == "library":
            handles, wire = _library_ops(ns, ops, tuple(tags))
        elif via == "triton_op":
            handles, wire = _triton_ops(ns, ops)
        else:
            raise ValueError(f"unknown way to define ops: {via!r}")
        if autograd is not None:
            setup_context, backward = autograd(handles)
            wire(backward, setup_context)
        if once:
            _MADE[key] = handles
        return handles


def _custom_ops(ns: str, ops: Sequence[Op], device_types: str | None) -> tuple[tuple[Any, ...], Callable]:
    defs = []
    for op in ops:
        schema = op_schema(op.impl, op.noisy) if op.noisy is not None else op.schema
        kwargs: dict[str, Any] = {"device_types": device_types} if device_types is not None else {}
        d = torch.library.custom_op(f"{ns}::{op.name}", mutates_args=op.mutates_args, schema=schema, **kwargs)(op.impl)
        if op.fake is not None:
            d.register_fake(op.fake)
        defs.append(d)

    def wire(backward: Callable, setup_context: Callable) -> None:
        defs[0].register_autograd(backward, setup_context=setup_context)

    return tuple(defs), wire


def _library_ops(ns: str, ops: Sequence[Op], tags: tuple[Any, ...]) -> tuple[tuple[Any, ...], Callable]:
    lib = _LIBS.get(ns)
    if lib is None:
        lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")  # noqa: TOR901 - kept alive in _LIBS
    for op in ops:
        assert op.schema is not None and not op.mutates_args, op.name
        lib.define(op.name + op.schema, tags=tags)
    for op in ops:
        lib.impl(op.name, op.impl, "CompositeExplicitAutograd")
        if op.fake is not None:
            torch.library.register_fake(f"{ns}::{op.name}", op.fake, lib=lib)
    namespace = getattr(torch.ops, ns)

    def wire(backward: Callable, setup_context: Callable) -> None:
        torch.library.register_autograd(f"{ns}::{ops[0].name}", backward, setup_context=setup_context, lib=lib)

    return tuple(getattr(namespace, op.name).default for op in ops), wire


def _triton_ops(ns: str, ops: Sequence[Op]) -> tuple[tuple[Any, ...], Callable]:
    defs = [torch.library.triton_op(f"{ns}::{op.name}", op.impl, mutates_args=op.mutates_args, schema=op.schema)
            for op in ops]
    namespace = getattr(torch.ops, ns)

    def wire(backward: Callable, setup_context: Callable) -> None:
        defs[0].register_autograd(backward, setup_context=setup_context)

    # (the OpOverloads: what a compiled graph calls)
    return tuple(getattr(namespace, op.name).default for op in ops), wire


def wrap_kernel(fn: Any) -> Any:
    """A Triton kernel launched from the body of a `triton_op` (`torch.library.wrap_triton`), which
    Inductor traces with tensors that have no data."""
    return torch.library.wrap_triton(fn)


__all__ = ["Op", "Wiring", "define", "op_schema", "wrap_kernel"]
