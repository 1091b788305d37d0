"""The CPU backend's recurrent scan: the layer's time loop in Python, per step the recurrent
product by torch (`addmm` into the port's current, where the BLAS is) and the neuron's step by the
model's C++ forward kernel, called on that one step (T = 1) with the call's buffers as its
arguments; the backward, per step in reverse time, the C++ backward kernel of the step and the
product that carries the port's gradient back to the previous step's source. So a step costs
one product and one kernel call: no autograd graph, no tensor per operation of the model.

The contract is the torch scan's (`backends/torch/recurrent.py`, `backends.recurrent.RecurrentProgram`);
the step's arithmetic is the kernels' (`backends/cpu/launch.py`: the same as a neuron module's
on the CPU kernels). Where the kernels could not be built, the layer runs the reference backend's scan.

The kernel's arguments (`abi.CpuABI`) for step t: the port's current [N] (N = batch x hidden),
the other inputs at t, the states (two [n_st, N] buffers, read from one and written to the
other), the source output S[t + 1] (S: s0, then the source of every step), the other outputs at
t, and the step's saved values (a [T, K, N] buffer: [K, N] per step, the kernel's [K, T, N] at T = 1).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from ...store import cache
from ..base import NoiseKey, ScanSpec
from .launch import CALLS, DTYPES, CpuProgram

# lanes per OpenMP thread of a step's kernel call (fewer lanes: one thread, no parallel region per step)
LANES_PER_THREAD = 1 << 15


class _Kernel:
    """One kernel entry point called step after step: its argument arrays made once; per call,
    the pointers that move with the step set from their base address by integer arithmetic (no
    tensor is indexed for them)."""

    def __init__(self, prog: CpuProgram, kind: str, dtype: torch.dtype, n_ptrs: int, ints: list[int],
                 vals: list[float]) -> None:
        self.fn, self.kind = prog.fns[kind, DTYPES[dtype]], kind
        self.n = (ctypes.c_int64 * len(ints))(*ints)
        self.p = (ctypes.c_void_p * n_ptrs)()
        self.f = (ctypes.c_double * max(len(vals), 1))(*vals)
        self.keyed = bool(prog.abi.draws)
        self.moving: list[tuple[int, int, int]] = []  # (slot, base address, bytes per step)
        self.pairs: list[tuple[int, int, int]] = []  # (slot, address at even calls, at odd calls)

    def fixed(self, slot: int, t: torch.Tensor | None) -> None:
        self.p[slot] = None if t is None else t.data_ptr()

    def rows(self, slot: int, t: torch.Tensor | None, per_step: int) -> None:
        """`t`'s data at step s starts `per_step` elements after step s - 1's (None: a null pointer)."""
        if t is None:
            self.p[slot] = None
        else:
            self.moving.append((slot, t.data_ptr(), per_step * t.element_size()))

    def alternate(self, slot: int, even: torch.Tensor, odd: torch.Tensor) -> None:
        self.pairs.append((slot, even.data_ptr(), odd.data_ptr()))

    def __call__(self, t: int, call: int, t0: int | None) -> None:
        """Step `t`, the `call`-th call of the loop; `t0`: a noisy model's key step of step 0."""
        p = self.p
        for slot, base, step in self.moving:
            p[slot] = base + t * step
        for slot, even, odd in self.pairs:
            p[slot] = odd if call & 1 else even
        if self.keyed:
            self.n[len(self.n) - 1] = t0 + t  # (the key's step of this step)
        self.fn(self.n, self.p, self.f)
        CALLS[self.kind] += 1


class CpuRecurrentProgram:
    """The recurrent scan of one model, port and source on the CPU kernels (float32, float64)."""

    def __init__(self, prog: CpuProgram, port: int, source: int, dense: bool) -> None:
        self.k = prog
        self.port, self.source, self.dense = port, source, dense
        abi = prog.abi
        self.binary = abi.outputs[source] == "spike"  # the source is 0/1
        self.n_in, self.n_st, self.n_out = prog.n_in, prog.n_st, prog.n_out
        self.K = len(abi.saved)
        self.keeps_port = port in prog.reread_idx  # the backward reads the port's current again

    def _kernel(self, kind: str, dtype: torch.dtype, N: int, noise: NoiseKey | None, prm: list, vals: list[float]
                ) -> tuple[_Kernel, dict[str, int]]:
        """The kernel `kind` ("fwd", "bwd") for steps of N lanes, its params set; and its pointer slots."""
        abi = self.k.abi
        slots = abi.fwd_slots() if kind == "fwd" else abi.bwd_slots()
        threads = max(1, min(torch.get_num_threads(), N // LANES_PER_THREAD))
        key = [int(noise.seed), int(noise.t0)] if noise is not None and abi.draws else []
        ints = [1, N, threads, *[N] * self.n_in, *self.k._key(key)]  # (one step: its strides are never read)
        call = _Kernel(self.k, kind, dtype, slots["n"], ints, vals)
        for j, q in enumerate(prm):
            call.fixed(slots["params"] + j, q)
        return call, slots

    def _others(self, inputs: Sequence[Any], N: int, dtype: torch.dtype) -> list[torch.Tensor | None]:
        """The inputs other than the port ([T, B, H]) as [T, N] (None at the port)."""
        return [None if k == self.port else inputs[k].to(dtype).reshape(inputs[k].shape[0], N).contiguous()
                for k in range(self.n_in)]

    def forward(self, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor, inputs: Sequence[Any],
                states: Sequence[Any], params: Sequence[Any], save: bool, noise: NoiseKey | None = None,
                s0_exact: bool | None = None):
        T, shape = ix.shape[0], ix.shape[1:]
        N, dtype = shape.numel(), ix.dtype
        n_in, n_st, n_out = self.n_in, self.n_st, self.n_out
        prm, prm_vals, _keep = self.k._params(params, shape, N)
        others = self._others(inputs, N, dtype)
        st = [torch.empty((n_st, N), dtype=dtype) for _ in range(2)]  # (read one, write the other)
        for i, s in enumerate(states):
            if isinstance(s, torch.Tensor):
                st[0][i] = s.detach().to(dtype).expand(shape).reshape(N)
            else:
                st[0][i] = float(s)
        S = torch.empty((T + 1, *shape), dtype=dtype)
        S[0] = s0
        outs = [S[1:] if k == self.source else torch.empty((T, *shape), dtype=dtype) for k in range(n_out)]
        sav = torch.empty((T, self.K, N), dtype=dtype) if save and self.K else None
        every = save and self.keeps_port  # (the port's current of every step, for the backward; else one buffer)
        cur = torch.empty((T if every else 1, *shape), dtype=dtype)
        call, at = self._kernel("fwd", dtype, N, noise, prm, [0.0] * n_st + prm_vals)
        for k in range(n_in):
            call.rows(at["inputs"] + k, cur if k == self.port else others[k], N if k != self.port or every else 0)
        for i in range(n_st):
            call.alternate(at["inits"] + i, st[0][i], st[1][i])  # (the states before the step)
            call.alternate(at["fins"] + i, st[1][i], st[0][i])  # (after it)
        for k in range(n_out):
            call.rows(at["outputs"] + k, outs[k], N)
        call.rows(at["saved"], sav, self.K * N)
        t0 = noise.t0 if noise is not None else None
        wt = w.t() if self.dense else w
        for t in range(T):
            c = cur[t if every else 0]
            if self.dense:
                torch.addmm(ix[t], S[t], wt, out=c)
            else:
                torch.addcmul(ix[t], S[t], w, out=c)
            call(t, t, t0)
        fin = st[T % 2]
        fins = [fin[i].reshape(shape) for i in range(n_st)]
        saved = (sav, cur if self.keeps_port else None, others, params, shape, dtype, noise) if save else None
        return outs, fins, S, saved

    # what a training forward keeps, as tensors (the layer's custom op returns them: `recurrent_ops`)
    def saved_shapes(self, T: int, shape: Sequence[int]) -> list[tuple[int, ...]]:
        N = int(torch.Size(shape).numel())
        return [(T, self.K, N)] * bool(self.K) + [(T, *shape)] * self.keeps_port

    def saved_tensors(self, saved) -> list[torch.Tensor]:
        return [t for t in saved[:2] if t is not None]

    def restore(self, tensors: Sequence[torch.Tensor], inputs: Sequence[Any], params: Sequence[Any],
                like: torch.Tensor, noise: NoiseKey | None):
        it = iter(tensors)
        sav = next(it) if self.K else None
        cur = next(it) if self.keeps_port else None
        return sav, cur, self._others(inputs, like.numel(), like.dtype), params, like.shape, like.dtype, noise

    def backward(self, saved, w: torch.Tensor, g_outs: Sequence[torch.Tensor | None],
                 g_fins: Sequence[torch.Tensor | None], need: dict[str, Any]):
        """(gI [T, B, H], grads of the other inputs [T, B, H], of the initial states, of the
        param values (each the size of the param value it was given), {})."""
        sav, cur, others, params, shape, dtype, noise = saved
        T, N = need["T"], shape.numel()
        n_in, n_st, n_out = self.n_in, self.n_st, self.n_out
        abi = self.k.abi
        prm, prm_vals, _keep = self.k._params(params, shape, N)
        gI = (torch.empty if abi.grad_inputs[self.port] else torch.zeros)((T, *shape), dtype=dtype)
        g_in = [torch.zeros((T, *shape), dtype=dtype) if n and k != self.port else None
                for k, n in enumerate(need["inputs"])]
        go = [g.to(dtype).expand(T, *shape).contiguous() if g is not None else None for g in g_outs]
        gst = [torch.zeros((n_st, N), dtype=dtype) for _ in range(2)]  # (read one, write the other)
        for i, g in enumerate(g_fins):
            if g is not None:
                gst[0][i] = g.to(dtype).expand(shape).reshape(N)
        learn = self.k.learn_idx
        gp = [torch.zeros((T, N), dtype=torch.float64) if need["params"][i] and abi.grad_params[j] else None
              for j, i in enumerate(learn)]
        call, at = self._kernel("bwd", dtype, N, noise, prm, prm_vals)
        for k in self.k.reread_idx:
            call.rows(at["inputs"] + k, cur if k == self.port else others[k], N)
        call.rows(at["saved"], sav, self.K * N)
        for k in range(n_out):
            if k != self.source:
                call.rows(at["g_outputs"] + k, go[k], N)
        for i in range(n_st):
            call.alternate(at["g_fins"] + i, gst[0][i], gst[1][i])  # (the later step's)
            call.alternate(at["g_states"] + i, gst[1][i], gst[0][i])  # (this step's)
        for k in range(n_in):
            call.rows(at["g_inputs"] + k, gI if k == self.port else g_in[k], N)
        for j, g in enumerate(gp):
            call.rows(at["g_params"] + j, g, N)
        # the source's gradient at step t: its output's, plus the recurrence's from step t + 1 (g_src)
        src, g_out, g_src = at["g_outputs"] + self.source, go[self.source], torch.empty(shape, dtype=dtype)
        t0 = noise.t0 if noise is not None else None
        for t in range(T - 1, -1, -1):
            if t == T - 1:
                call.fixed(src, g_out[t] if g_out is not None else None)
            else:
                if t == T - 2:
                    call.fixed(src, g_src)
                if self.dense:
                    torch.mm(gI[t + 1], w, out=g_src) if g_out is None else torch.addmm(g_out[t], gI[t + 1], w,
                                                                                          out=g_src)
                else:
                    torch.mul(gI[t + 1], w, out=g_src) if g_out is None else torch.addcmul(g_out[t], gI[t + 1], w,
                                                                                             out=g_src)
            call(t, T - 1 - t, t0)
        g0 = gst[T % 2]
        g_st = [g0[i].reshape(shape).clone() if n else None for i, n in enumerate(need["states"])]
        g_pr: list[Any] = [None] * len(params)
        for j, i in enumerate(learn):
            if gp[j] is not None:
                q = params[i]
                g = gp[j].sum(0).reshape(shape)
                g_pr[i] = (g.sum() if q.numel() == 1 else g.sum_to_size(q.shape)).reshape(q.shape).to(q.dtype)
            elif need["params"][i]:
                g_pr[i] = torch.zeros_like(params[i])
        return gI, g_in, g_st, g_pr, {}


def load_recurrent(b: Any, spec: ScanSpec, key: str) -> CpuRecurrentProgram | None:
    """The scan on the CPU kernels of the model of backend `b` (built now if the cache has none),
    or None where they could not be built (the CPU backend warned why; the layer then runs the
    reference backend's scan: `backends.recurrent.program`)."""
    ir = spec.ir
    k = ir.cache_key(b.name, b.version())
    prog = b.load(cache.get_or_make(k, lambda: b.emit(ir)), k)
    if prog.lib is None:
        return None
    return CpuRecurrentProgram(prog, spec.port, spec.source, spec.dense)


__all__ = ["CpuRecurrentProgram", "load_recurrent", "LANES_PER_THREAD"]
