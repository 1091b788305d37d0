"""Spikes kept as bits by the recurrent scans (issue 35): peak training memory and step time of a
recurrent layer with the bits on and off (`flexdsl.runtime.bits.ENABLED`), same run. The input is a
flexdsl neuron's spike output (known 0/1), as in a stack of layers.

    python bench/recurrent_bits_gpu.py [--shapes 700x256x64x100,700x256x64x1000,700x1024x64x250]

Shapes are FxHxBxT[xL] (L recurrent layers stacked, default 1). Step = forward, sum(out * g), backward; median of 10 (ms); peak above what was
allocated before the step (MiB). Gradients compared between the two (max abs difference).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import flexdsl
from flexdsl.runtime import bits


def step(r, x, g):
    r.reset()
    r.zero_grad(set_to_none=True)
    out = r(x)
    (out * g).sum().backward()


class Stack(torch.nn.Sequential):
    def reset(self) -> None:
        for m in self:
            m.reset()


def measure(F: int, H: int, B: int, T: int, on: bool, L: int = 1):
    torch.manual_seed(0)
    r = Stack(*[flexdsl.recurrent("lif", F if k == 0 else H, H) for k in range(L)]).cuda()
    with torch.no_grad():
        for m in r:
            m.W_in.mul_(4.0)
    src = flexdsl.load("lif").cuda()
    with torch.no_grad():
        x = src(torch.rand(T, B, F, device="cuda") * 2.5)  # (a neuron's spikes: known 0/1)
    g = torch.randn(T, B, H, device="cuda")
    bits.ENABLED = on
    try:
        for _ in range(2):
            step(r, x, g)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(r, x, g)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            step(r, x, g)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        grads = [p.grad.clone() for p in r.parameters() if p.grad is not None]
    finally:
        bits.ENABLED = True
    return statistics.median(ts) * 1e3, peak, grads, float(x.mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="700x256x64x100,700x256x64x1000,700x1024x64x250,700x256x64x1000x3")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    rows = []
    for sh in a.shapes.split(","):
        F, H, B, T, *L = (int(v) for v in sh.split("x"))
        t_off, m_off, g_off, rate = measure(F, H, B, T, False, *L)
        t_on, m_on, g_on, _ = measure(F, H, B, T, True, *L)
        diff = max((x - y).abs().max().item() for x, y in zip(g_on, g_off))
        rows.append((sh, rate, t_off, t_on, m_off, m_on, diff))
        print(rows[-1], flush=True)
    print("\n| F×H×B×T[×layers] | input rate | step ms, bits off | bits on | peak MiB, bits off | bits on | on/off | max |Δgrad| |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for sh, rate, t0, t1, m0, m1, d in rows:
        print(f"| {sh} | {rate:.3f} | {t0:.3f} | {t1:.3f} | {m0:.1f} | {m1:.1f} | {m1 / m0:.2f} | {d:.1e} |")


if __name__ == "__main__":
    main()
