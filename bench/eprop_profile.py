"""Where an e-prop training step's time goes (CUDA): the forward's steps, the traces' kernel, the rest."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flexdsl  # noqa: E402
from flexdsl.runtime import eprop as E  # noqa: E402

dev = torch.device("cuda")
T, B, IN, H = 100, 64, 700, 256
for model, kw in [("lif", {}), ("alif", {"detach_reset": "v"})]:
    layer = flexdsl.recurrent(model, IN, H, learning="eprop", **kw).to(dev)
    readout = nn.Linear(H, 20).to(dev)
    x = (torch.rand(T, B, IN, device=dev) < 0.05).float()
    y = torch.randint(0, 20, (T, B), device=dev)
    times: dict[str, float] = {}

    def timed(name, fn, times=times):
        def wrap(*a, **kwargs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = fn(*a, **kwargs)
            torch.cuda.synchronize()
            times[name] = times.get(name, 0.0) + (time.perf_counter() - t0) * 1e3
            return r
        return wrap

    orig_run, orig_walk, orig_kernel = E._run, E._walk, E._walk_kernel
    E._run, E._walk, E._walk_kernel = timed("run (steps)", orig_run), timed("walk", orig_walk), \
        timed("  of which kernel", orig_kernel)
    for rep in range(4):
        if rep == 1:
            times.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        layer.reset()
        s = layer(x)
        loss = nn.functional.cross_entropy(readout(s).flatten(0, 1), y.flatten())
        loss.backward()
        torch.cuda.synchronize()
        times["total"] = times.get("total", 0.0) + (time.perf_counter() - t0) * 1e3 * (rep > 0)
    E._run, E._walk, E._walk_kernel = orig_run, orig_walk, orig_kernel
    print(model, {k: round(v / 3, 2) for k, v in times.items()}, flush=True)

# the traces' kernel alone (T = 100, batch 64, 256 neurons, 700 + 256 + 1 presynaptic values)
from flexdsl.backends.triton.eprop import walk  # noqa: E402

F, P = 64, IN + H + 1
for D in (1, 2):
    for zero in (True, False):
        eps = torch.zeros(F, H, P, D, device=dev) if zero else torch.randn(F, H, P, D, device=dev)
        J = torch.rand(T, F, H, D, D, device=dev) * 0.5
        b = torch.rand(T, F, H, D, device=dev)
        xs = (torch.rand(T, F, IN, device=dev) < 0.05).float()
        ss = (torch.rand(T, F, H, device=dev) < 0.05).float()
        A = torch.randn(T, F, H, D, device=dev)
        Lg = torch.randn(T, F, H, device=dev)
        walk(eps, J, b, xs, ss, True, A, Lg, zero)
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            walk(eps, J, b, xs, ss, True, A, Lg, zero)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        print(f"walk D={D} {'from zeros' if zero else 'from a kept eligibility'}: {min(ts):.3f} ms", flush=True)
