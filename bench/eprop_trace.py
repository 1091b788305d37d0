"""Where an e-prop training step's time goes (CUDA), BPTT and e-prop, LIF and ALIF, on the SHD-shaped
layer (`bench/eprop_gpu.py`'s definitions: 700 -> 256, batch 64, T = 100, a readout and a loss every step).

    python3 bench/eprop_trace.py           # torch.profiler: wall time, GPU busy time, the kernels that take most
    python3 bench/eprop_trace.py --host    # cProfile over 10 steps: the host's functions by own and cumulative time
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
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


def gpu_profile(step, label: str) -> None:
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
    kern = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    busy = sum(e.self_device_time_total for e in kern) / 3 / 1e3
    n = sum(e.count for e in kern if e.self_device_time_total > 0) / 3
    print(f"== {label}: wall {wall:.2f} ms/step, GPU busy {busy:.2f} ms, ~{n:.0f} device ops/step")
    for e in kern[:14]:
        if e.self_device_time_total <= 0:
            break
        print(f"   {e.self_device_time_total / 3 / 1e3:7.3f} ms  x{e.count / 3:5.0f}  {e.key[:90]}")
    cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    print("   host (self cpu):", ", ".join(f"{e.key[:40]} {e.self_cpu_time_total / 3 / 1e3:.2f}ms x{e.count // 3}"
                                         for e in cpu[:8]))


def host_profile(step, label: str) -> None:
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    pr.disable()
    print(f"==== {label}: host profile of 10 steps", flush=True)
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(14)
    st.sort_stats("cumulative").print_stats("flexdsl", 26)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", action="store_true", help="cProfile the host instead of torch.profiler")
    a = ap.parse_args()
    for model, kw in [("lif", {}), ("alif", {"detach_reset": "v"})]:
        for learning in ("bptt", "eprop"):
            layer = flexdsl.recurrent(model, IN, H, learning=learning, **kw).to(dev)
            readout = nn.Linear(H, 20).to(dev)
            x = (torch.rand(T, B, IN, device=dev) < 0.05).float()
            y = torch.randint(0, 20, (T, B), device=dev)

            def step(layer=layer, readout=readout, x=x, y=y):
                layer.reset()
                s = layer(x)
                nn.functional.cross_entropy(readout(s).flatten(0, 1), y.flatten()).backward()

            for _ in range(5):
                step()
            (host_profile if a.host else gpu_profile)(step, f"{model} {learning}")


if __name__ == "__main__":
    main()
