"""Where an e-prop training step's GPU time and launches go (CUDA, torch.profiler): per model, the
step's wall time, the GPU's busy time, the number of kernels, and the kernels that take the most."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flexdsl  # noqa: E402

dev = torch.device("cuda")
T, B, IN, H = 100, 64, 700, 256
for model, kw in [("lif", {}), ("alif", {"detach_reset": "v"})]:
    for learning in ("bptt", "eprop"):
        layer = flexdsl.recurrent(model, IN, H, learning=learning, **kw).to(dev)
        readout = nn.Linear(H, 20).to(dev)
        x = (torch.rand(T, B, IN, device=dev) < 0.05).float()
        y = torch.randint(0, 20, (T, B), device=dev)

        def step(layer=layer, readout=readout, x=x, y=y):
            layer.reset()
            s = layer(x)
            loss = nn.functional.cross_entropy(readout(s).flatten(0, 1), y.flatten())
            loss.backward()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 10 * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0]
        kern = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
        busy = sum(e.self_device_time_total for e in kern) / 3 / 1e3
        n = sum(e.count for e in kern if e.self_device_time_total > 0) / 3
        print(f"== {model} {learning}: wall {wall:.2f} ms/step, GPU busy {busy:.2f} ms, ~{n:.0f} device ops/step")
        for e in kern[:14]:
            if e.self_device_time_total <= 0:
                break
            print(f"   {e.self_device_time_total / 3 / 1e3:7.3f} ms  x{e.count / 3:5.0f}  {e.key[:90]}")
        cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        print("   host (self cpu):", ", ".join(f"{e.key[:40]} {e.self_cpu_time_total / 3 / 1e3:.2f}ms x{e.count // 3}" for e in cpu[:8]))
