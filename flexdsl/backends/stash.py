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
    return _map(obj, ts, True), ts


def unstash(held: Any, ts: Sequence[torch.Tensor]) -> Any:
    return _map(held, ts, False)


def _map(obj: Any, ts: Any, put: bool) -> Any:
    """`obj` with every tensor replaced by its slot in `ts` (appended there: `put`), or every slot by
    its tensor (not `put`), in nested tuples and lists, walked without recursion and without a
    Python call per node (a program's saved state, at every training call; nothing here refers to
    itself, so no reference cycle keeps the tensors alive)."""
    kind = torch.Tensor if put else _Slot
    if isinstance(obj, kind):
        obj = [obj]
        return _map(obj, ts, put)[0]
    if not isinstance(obj, (tuple, list)):
        return obj
    # post-order: (container, its items so far) frames
    root: list[Any] = []
    stack: list[tuple[Any, list[Any], int]] = [(obj, root, 0)]
    out: list[Any] = []
    while stack:
        o, items, i = stack.pop()
        if i == len(o):
            built = type(o)(*items) if hasattr(o, "_fields") else type(o)(items)  # (a named tuple: by position)
            if stack:
                stack[-1][1].append(built)
            else:
                out.append(built)
            continue
        stack.append((o, items, i + 1))
        v = o[i]
        if isinstance(v, kind):
            if put:
                items.append(_Slot(len(ts)))
                ts.append(v)
            else:
                items.append(ts[v])
        elif isinstance(v, (tuple, list)):
            stack.append((v, [], 0))
        else:
            items.append(v)
    return out[0]


__all__ = ["stash", "unstash"]
