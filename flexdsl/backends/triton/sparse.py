"""Sparse inputs in Triton kernels: a feed-forward layer's product `x W^T + b` taken from the
nonzero entries of `x` only (`sparse_input=True`), so its time falls with the input's spike rate.

Two passes. `compact` lists each row's nonzero columns (a prefix sum per row: `idx[r, :cnt[r]]`,
in column order); the product then gathers, for each row and each block of output neurons, the
rows of `W^T` at those columns and sums them times the values (float32 accumulation, in column
order: the same sums in every call). `current` stores the product (what the runtime's
differentiable product, `runtime/sparse.py`, runs forward); `SparseProgram` runs the neuron's step
on it in the same kernel (`templates/sparse.py.j2`, printed from the neuron's
forward step as the recurrent scan prints it: `recurrent.forward_view`), so the current is never
stored: inference (no gradient wanted), float32.

A product over n inputs costs `rows * n * H` multiply-adds dense, `rows * nnz * H` loads here: above
a count of nonzero entries (`FLEXDSL_SPARSE_DENSITY` of them) the runtime (`runtime/sparse.py`)
takes the dense product instead. The gathers can be gated by the count on the device (`gated`: they
return at once where it is too high), so a call queues them before the count is back.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import triton
import triton.language as tl

from ...settings import env_int
from ...store import cache
from ...store.generated import load_module
from ..base import IR
from .args import lane_param
from .emit import _env
from .kernel import Launcher, cdiv, next_pow2
from .launch import LAUNCHES, interpret
from .recurrent import _sm_count, forward_view

TEMPLATE = "sparse.py.j2"


@triton.jit
def _compact(x_ptr, idx_ptr, cnt_ptr, total_ptr, NI, BK: tl.constexpr):
    # row r of x [R, NI]: the columns of its nonzero entries, in order, into idx[r, :cnt[r]]; the
    # call's count of nonzero entries added to total
    r = tl.program_id(0).to(tl.int64)
    row = x_ptr + r * NI
    out = idx_ptr + r * NI
    base = tl.program_id(0) * 0  # (an int32 scalar the loop carries)
    for k0 in range(0, NI, BK):
        ks = k0 + tl.arange(0, BK)
        v = tl.load(row + ks, mask=ks < NI, other=0.0).to(tl.float32)
        nz = (v != 0) & (ks < NI)
        nzi = nz.to(tl.int32)
        pos = base + tl.cumsum(nzi, axis=0) - 1
        tl.store(out + pos, ks, mask=nz)
        base += tl.sum(nzi, axis=0)
    tl.store(cnt_ptr + r, base)
    tl.atomic_add(total_ptr, base)


@triton.jit
def _gather(x_ptr, idx_ptr, cnt_ptr, total_ptr, wt_ptr, b_ptr, out_ptr, NI, H, LIMIT, HAS_B: tl.constexpr,
            GATED: tl.constexpr, BJ: tl.constexpr, BH: tl.constexpr):
    # out[r, cols] = sum over row r's nonzero columns j of x[r, j] * W^T[j, cols] (+ b[cols]); with
    # GATED only where the call's nonzero entries are at most LIMIT (else out is left as it is)
    if not GATED or tl.load(total_ptr) <= LIMIT:
        r = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BH + tl.arange(0, BH)
        cm = cols < H
        n = tl.load(cnt_ptr + r)
        acc = tl.zeros([BH], dtype=tl.float32)
        for j0 in range(0, n, BJ):
            js = j0 + tl.arange(0, BJ)
            jm = js < n
            ii = tl.load(idx_ptr + r * NI + js, mask=jm, other=0)
            v = tl.load(x_ptr + r * NI + ii, mask=jm, other=0.0).to(tl.float32)
            w = tl.load(wt_ptr + ii[:, None].to(tl.int64) * H + cols[None, :], mask=jm[:, None] & cm[None, :],
                        other=0.0).to(tl.float32)
            acc += tl.sum(v[:, None] * w, axis=0)
        if HAS_B:
            acc += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * H + cols, acc.to(out_ptr.dtype.element_ty), mask=cm)


_COMPACT = Launcher(_compact)  # (launched with keywords: the fast path of flexdsl's launches)
_GATHER = Launcher(_gather)


class Workspace:
    """A synapse group's buffers for its calls' lists and counts, made once per shape and device and
    used again by every call (the calls of a stream run in order: a call's kernels have read them
    before the next call's listing writes them)."""

    def __init__(self) -> None:
        self.key: tuple | None = None

    def buffers(self, R: int, NI: int, device: torch.device) -> tuple:
        if self.key != (R, NI, device):
            self.idx = torch.empty((R, NI), dtype=torch.int32, device=device)
            self.cnt = torch.empty((R,), dtype=torch.int32, device=device)
            self.total = torch.empty((1,), dtype=torch.int64, device=device)
            cuda = device.type == "cuda"
            self.host = torch.empty((1,), dtype=torch.int64, pin_memory=cuda)
            self.event = torch.cuda.Event() if cuda else None
            self.key = (R, NI, device)
        return self.idx, self.cnt, self.total, self.host, self.event


class Compacted:
    """An input's rows' nonzero columns (`idx` [R, NI] int32: the first `cnt[r]` of row r, in order),
    their count (`total` on the device; its copy to the host starts at once, so `nnz()` waits for the
    compaction alone, not for what is queued after it) and `limit`: the most nonzero entries taken
    sparse (`always`: whatever the count)."""

    def __init__(self, idx: torch.Tensor, cnt: torch.Tensor, total: torch.Tensor, limit: int,
                 host: torch.Tensor | None = None, event: Any = None) -> None:
        self.idx, self.cnt, self.total, self.limit = idx, cnt, total, limit
        self._host: torch.Tensor | None = None
        self._ready: Any = None
        if total.is_cuda and not self.always:
            self._host = host if host is not None else torch.empty((1,), dtype=torch.int64, pin_memory=True)
            self._host.copy_(total, non_blocking=True)
            self._ready = event if event is not None else torch.cuda.Event()
            self._ready.record()

    @property
    def always(self) -> bool:
        return self.limit >= self.idx.numel()

    def nnz(self) -> int:
        """The count of nonzero entries (waits for the compaction)."""
        if self._ready is not None:
            self._ready.synchronize()
            return int(self._host[0])  # type: ignore[index]
        return int(self.total[0].item())

    def density(self) -> float:
        n = self.idx.numel()
        return self.nnz() / n if n else 0.0

    def sparse(self) -> bool:
        """Whether the input is taken sparse (at most `limit` nonzero entries, or always)."""
        return self.always or self.nnz() <= self.limit


def compact(x2: torch.Tensor, density: float, ws: Workspace | None = None) -> Compacted:
    """Each row's nonzero columns of `x2` [R, NI] (contiguous) and their count; sparse where at most
    `density` of the entries are nonzero (1.0: always). `ws`: the group's buffers, used again."""
    R, NI = x2.shape
    idx, cnt, total, host, event = (ws or Workspace()).buffers(R, NI, x2.device)
    total.zero_()
    if R and NI:
        bk = min(1024, next_pow2(NI))
        _COMPACT((R,), num_warps=4, x_ptr=x2, idx_ptr=idx, cnt_ptr=cnt, total_ptr=total, NI=NI, BK=bk)
        LAUNCHES["sparse_compact"] += 1
    else:
        cnt.zero_()
    return Compacted(idx, cnt, total, R * NI if density >= 1.0 else int(density * R * NI), host, event)


def _blocks(H: int) -> tuple[int, int]:
    bh = env_int("FLEXDSL_SPARSE_BH") or (32 if interpret() else min(256, max(32, next_pow2(H))))
    bj = env_int("FLEXDSL_SPARSE_BJ") or 16
    return bh, bj


def current(x2: torch.Tensor, c: Compacted, wt: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor | None = None,
            gated: bool = False) -> torch.Tensor:
    """`x2 W^T + b` from the nonzero entries `c` lists (with `gated`, only where the count on the device
    is at most `c.limit`: `out` is left as it is otherwise); `wt` is W^T [NI, H] contiguous; float32
    accumulation (in column order), the result in x2's dtype."""
    R, NI = x2.shape
    H = wt.shape[1]
    if out is None:
        out = torch.empty((R, H), dtype=x2.dtype, device=x2.device)
    if R and H:
        bh, bj = _blocks(H)
        _GATHER((R, cdiv(H, bh)), num_warps=4 if bh >= 128 else 2, x_ptr=x2, idx_ptr=c.idx, cnt_ptr=c.cnt,
                total_ptr=c.total, wt_ptr=wt, b_ptr=b if b is not None else wt, out_ptr=out, NI=NI, H=H,
                LIMIT=c.limit, HAS_B=b is not None, GATED=gated, BJ=bj, BH=bh)
        LAUNCHES["sparse_gather"] += 1
    return out


def emit_sparse(ir: IR, port: int, source: int) -> tuple[str, dict[str, Any]]:
    """The neuron's kernels module with the fused sparse-input kernel appended, and its metadata."""
    base, abi, _P, fwd, param_loads, param_block = forward_view(ir, port, source)
    src = _env().get_template(TEMPLATE).render(model=ir.step.name, port=ir.step.inputs[port].name,
                                               param_loads=param_loads, param_block=param_block, fwd=fwd)
    meta = {"abi": abi.to_dict(), "port": port, "source": source, "hoisted_fwd": [h["arg"] for h in fwd.hoisted]}
    return base + src, meta


class SparseProgram:
    """The fused sparse-input kernel of one neuron model and port: the product from the compacted
    input and the neuron's steps in one launch."""

    def __init__(self, module: Any, meta: dict[str, Any]) -> None:
        from .abi import KernelABI

        self.meta = meta
        self.abi = KernelABI.from_dict(meta["abi"])
        self.kernel = Launcher(module._sparse_fwd_kernel)
        self.out_args = [self.abi.name_of("out", n) for n in self.abi.outputs]
        self.param_args = [(self.abi.name_of("param", n), self.abi.name_of("mode", n)) for n in self.abi.params]

    def prepare(self, x: torch.Tensor, H: int, b: torch.Tensor | None, ext: torch.Tensor | None, states: list[Any],
                params: list[Any]) -> dict[str, Any]:
        """What a call takes apart from its product's source (`launch`): `x` [T, B, NI] float32
        contiguous, `b` [H] or None, `ext` [T, B, H] (other currents into the port) or None; states and
        params as floats or tensors broadcasting to [B, H]. The outputs [T, B, H] and the states [B, H]
        (initial now, final after `launch`) are its "outs" and "st"."""
        from .plastic import _stack

        T, B, NI = x.shape
        dev = x.device
        N = B * H
        outs = [torch.empty((T, B, H), dtype=torch.float32, device=dev) for _ in self.abi.outputs]
        st = _stack(states, B, H, dev)
        bh, bj = _blocks(H)
        if not interpret():  # (enough programs for the card: smaller blocks for few samples)
            sms = _sm_count(dev.index or 0)
            while bh > 32 and B * cdiv(H, bh) < 2 * sms:
                bh //= 2
        kw: dict[str, Any] = {"_X": x, "_bias": b if b is not None else x, "_ext": ext if ext is not None else x,
                              "_st": st, "_B": B, "_H": H, "_NI": NI, "_T": T, "_HOST": False, "_ROUND": False,
                              "_EXT": ext is not None, "_HASB": b is not None, "_BJ": bj, "_BH": bh}
        for arg, o in zip(self.out_args, outs):
            kw[arg] = o
        for (arg, mode_arg), p in zip(self.param_args, params):
            kw[arg], kw[mode_arg] = lane_param(p, B, H, dev)
        for h in self.meta["hoisted_fwd"]:
            kw[h] = 0.0
        return {"kw": kw, "outs": outs, "st": st, "grid": (B, cdiv(H, bh)), "warps": 4 if bh >= 128 else 2,
                "run": T * N > 0}

    def launch(self, call: dict[str, Any], c: Compacted, wt: torch.Tensor | None = None, cur: torch.Tensor | None = None,
               gated: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Run a prepared call: its product gathered from `c`'s lists and `wt` (W^T [NI, H] float32
        contiguous), or read from `cur` [T * B, H] (the dense product, taken before). With `gated` the
        kernel runs only where the count on the device is at most `c.limit` (else it writes nothing: the
        call can be launched again). Returns the outputs [T, B, H] and the final states [B, H]."""
        kw = call["kw"]
        x = kw["_X"]
        mode = 2 if cur is not None else (1 if gated else 0)
        kw.update({"_idx": c.idx, "_cnt": c.cnt, "_total": c.total, "_LIMIT": c.limit,
                   "_WT": wt if wt is not None else x, "_cur": cur if cur is not None else x, "_MODE": mode})
        if call["run"]:
            self.kernel(call["grid"], num_warps=call["warps"], **kw)
            LAUNCHES["sparse_fwd"] += 1
        st = call["st"]
        return call["outs"], [st[i].view(kw["_B"], kw["_H"]) for i in range(st.shape[0])]

    def forward(self, x: torch.Tensor, c: Compacted, wt: torch.Tensor, b: torch.Tensor | None,
                ext: torch.Tensor | None, states: list[Any], params: list[Any]
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`prepare` then `launch`."""
        return self.launch(self.prepare(x, wt.shape[1], b, ext, states, params), c, wt)


_PROGRAMS: dict[str, SparseProgram] = {}
_LOCK = threading.Lock()


def program(ir: IR, key: str, port: int, source: int) -> SparseProgram:
    """The fused sparse-input kernel of neuron `ir` (its Triton artefact's `key`), cached on disk like
    every artefact and loaded once per process."""
    k = cache.key(key, "sparse", str(port), str(source))
    if k not in _PROGRAMS:
        with _LOCK:
            if k not in _PROGRAMS:
                art = cache.get_or_make(k, lambda: cache.Artefact("tritonsparse", *emit_sparse(ir, port, source)))
                _PROGRAMS[k] = SparseProgram(load_module("tritonsparse", k, art.source), art.meta)
    return _PROGRAMS[k]


__all__ = ["Compacted", "SparseProgram", "Workspace", "compact", "current", "emit_sparse", "program"]
