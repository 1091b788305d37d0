"""Where the recompute plan's time goes on a GPU: the training kernels of LIF alone (forward with
saved values or with checkpoints, backward reading saved values or recomputing), their registers
and spills, at several launch shapes.

    python bench/diag_rc.py [float32|bfloat16|float16]     (env DIAG_T, DIAG_MODELS, FLEXDSL_CHUNK)
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch
import triton.testing as tt

import flexdsl
from flexdsl.backends.triton.glue import Grads


def _backward(tm, calls, params, states, grads, need, reread, saved, recompute=False):
    """The backward kernel alone, saving or recomputing."""
    return tm.bwd(calls[recompute], reread, saved, params, states, grads, need)


def bench(f):
    return tt.do_bench(f, warmup=25, rep=200, return_mode="median")


def main() -> None:
    T, N = int(os.environ.get("DIAG_T", 32)), 1 << 22
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32")
    x = (torch.rand(T, N, device="cuda") * 1.5).to(dtype)
    g = torch.rand_like(x)
    for name in os.environ.get("DIAG_MODELS", "lif,izhikevich").split(","):
        m = flexdsl.load(name, backend="triton").to("cuda")
        tm = m.compiled.program("triton")
        npar = len(tm.params)
        pv = [float(v) for v in m._param_list()]
        sv = [float(m._initial_values()[s]) for s in tm.states]
        n_st = len(tm.states)
        is_t = [False] * (n_st + npar)
        shapes = ((256, 4), (128, 2), (64, 2)) if dtype == torch.float32 else (
            (512, 4), (256, 4), (256, 2), (128, 2), (128, 1), (64, 2))
        for block, warps in shapes:
            tm.block_rc = block
            tm.k_bwd_rc.warps = warps
            tm.launch_plans.clear()

            fwd = partial(tm.fwd_impl, [x], [], [], sv, pv, is_t, False, True)
            rs, rc = fwd(False), fwd(True)
            need = [True] + [False] * n_st
            calls = {rc: tm.call([x], sv, pv, is_t, False, rc) for rc in (False, True)}
            bwd = partial(_backward, tm, calls, [None] * npar, [None] * n_st, Grads([g], [None] * n_st, [None] * n_st),
                          need)
            times = {
                "fwd_save": bench(partial(fwd, False)), "fwd_ckpt": bench(partial(fwd, True)),
                "bwd_save": bench(partial(bwd, [x][:len(tm.reread_idx)], rs[-1], recompute=False)),
                "bwd_rc": bench(partial(bwd, [x], rc[-1], recompute=True)),
            }
            info = []
            for kname, k in (("fwd", tm.k_fwd), ("bwd", tm.k_bwd), ("bwd_rc", tm.k_bwd_rc)):
                for ck in k.cache.values():
                    info.append(f"{kname}: regs {getattr(ck, 'n_regs', '?')} spills {getattr(ck, 'n_spills', '?')}")
            print(f"{name} {dtype} T={T} K={tm.abi.chunk} BLOCK_RC={block} warps={warps}: " +
                  ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()) + " | " + "; ".join(sorted(set(info))),
                  flush=True)


if __name__ == "__main__":
    main()
