"""Host overhead of one LIF training call at a small size (GPU idle), profiled with cProfile.

    python bench/profile_overhead.py            # on a CUDA machine
"""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

import flexdsl

T, N = 8, 4096
m = flexdsl.load("lif")
x = (torch.rand(T, N, device="cuda") * 1.5).requires_grad_()
g = torch.rand(T, N, device="cuda")


def train() -> None:
    m.reset()
    x.grad = None
    m(x).backward(g)


def infer() -> None:
    m.reset()
    with torch.no_grad():
        m(x)


for fn in (train, infer):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(1000):
        fn()
    torch.cuda.synchronize()
    print(f"{fn.__name__}: {(time.perf_counter() - t0) * 1e3:.1f} us/call (host-bound, 1000 calls)")

# the same layer under CUDA graphs (torch.compile, mode="reduce-overhead"): replays, no per-kernel host work
mc = torch.compile(m, mode="reduce-overhead")


def train_graphed() -> None:
    m.reset()
    x.grad = None
    mc(x).backward(g)


try:
    for _ in range(50):
        train_graphed()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(1000):
        train_graphed()
    torch.cuda.synchronize()
    print(f"train under torch.compile(mode='reduce-overhead'): {(time.perf_counter() - t0) * 1e3:.1f} us/call")
except Exception as e:  # noqa: BLE001 - a benchmark reports and goes on
    print(f"train under torch.compile(mode='reduce-overhead'): failed: {type(e).__name__}: {e}")

pr = cProfile.Profile()
pr.enable()
for _ in range(2000):
    train()
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
