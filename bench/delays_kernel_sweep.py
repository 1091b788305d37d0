"""Tile sizes of the sparse synaptic delay kernels (`flexdsl/backends/triton/delays.py`) on one GPU: each
kernel's time (triton.testing.do_bench) for 700 -> 256 connections, T = 100, batch 256, max 25, two steps
per connection, over BR (rows of steps x batch), BI/BJ (neurons) and num_warps.

    python3 bench/delays_kernel_sweep.py
"""
import itertools

import torch
import triton

from flexdsl.backends.triton import delays as k


def main():
    torch.manual_seed(0)
    T, N, J, I, D = 100, 256, 700, 256, 25
    L = T + D
    hT = (torch.rand(J, L, N, device="cuda") < 0.05).float()
    d = torch.randint(0, D, (I, J), device="cuda", dtype=torch.int32)
    a, c = torch.randn(I, J, device="cuda"), torch.randn(I, J, device="cuda")
    out = torch.empty(T, N, I, device="cuda")
    gT = torch.randn(I, T, N, device="cuda")
    gh = torch.empty(L, N, J, device="cuda")
    ga, gc = torch.empty(I, J, device="cuda"), torch.empty(I, J, device="cuda")
    print(f"device {torch.cuda.get_device_name()}; T={T} batch={N} {J}->{I} max {D}, two steps")
    rows = []
    for br, bi, nw in itertools.product((32, 64, 128), (16, 32, 64), (2, 4, 8)):
        f = triton.testing.do_bench(lambda br=br, bi=bi, nw=nw: k._current[(triton.cdiv(T * N, br), triton.cdiv(I, bi))](
            hT, d, a, c, out, T, N, J, I, D, L, TWO=True, BR=br, BI=bi, num_warps=nw))
        h = triton.testing.do_bench(lambda br=br, bi=bi, nw=nw: k._history_grad[(triton.cdiv(L * N, br), triton.cdiv(J, bi))](
            gT, d, a, c, gh, T, N, J, I, D, L, TWO=True, BR=br, BJ=bi, num_warps=nw))
        w = triton.testing.do_bench(lambda br=br, bi=bi, nw=nw: k._weight_grad[(I, triton.cdiv(J, bi))](
            gT, hT, d, ga, gc, T, N, J, D, L, TWO=True, BR=br, BJ=bi, num_warps=nw))
        rows.append((br, bi, nw, f, h, w))
        print(f"BR={br:3d} BI/BJ={bi:2d} warps={nw}: current {f:.3f} ms, history grad {h:.3f} ms, weight grad {w:.3f} ms",
              flush=True)
    for col, name in ((3, "current"), (4, "history grad"), (5, "weight grad")):
        best = min(rows, key=lambda r: r[col])
        print(f"best {name}: BR={best[0]} BI/BJ={best[1]} warps={best[2]}: {best[col]:.3f} ms "
              f"(now BR={k.BR}, {k.BI}/{k.BJ}, 4 warps: "
              f"{next(r[col] for r in rows if r[:3] == (k.BR, k.BI if col == 3 else k.BJ, 4)):.3f} ms)")


if __name__ == "__main__":
    main()
