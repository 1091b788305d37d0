"""Tensors nested in tuples and lists (a program's saved state) through an autograd Function's
`save_for_backward`: `stash` replaces each tensor by its slot and lists the tensors in slot order,
`unstash` puts them back. So autograd owns every tensor a backward needs: it frees them after the
backward (keeps them with `retain_graph=True`) and an in-place change before the backward is an error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class _Slot(int):
    """Where a stashed tensor was (its index among the saved tensors)."""


def stash(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """`obj` (tensors in nested tuples and lists) with each tensor replaced by its `_Slot`, and the
    tensors in slot order."""
    ts: list[torch.Tensor] = []
    return _walk(obj, ts), ts


def _walk(o: Any, ts: list[torch.Tensor]) -> Any:
    # (a module-level function: a nested one calling itself would be a reference cycle holding the
    # tensors until Python's cycle collector runs, long after autograd freed them)
    if isinstance(o, torch.Tensor):
        ts.append(o)
        return _Slot(len(ts) - 1)
    if isinstance(o, (tuple, list)):
        return _rebuild(o, [_walk(v, ts) for v in o])
    return o


def _rebuild(o: tuple | list, items: list) -> Any:
    return type(o)(*items) if hasattr(o, "_fields") else type(o)(items)  # (a named tuple: by position)


def unstash(held: Any, ts: Sequence[torch.Tensor]) -> Any:
    if isinstance(held, _Slot):
        return ts[held]
    if isinstance(held, (tuple, list)):
        return _rebuild(held, [unstash(v, ts) for v in held])
    return held


__all__ = ["stash", "unstash"]
