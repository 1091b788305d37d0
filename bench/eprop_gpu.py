"""e-prop against BPTT on the SHD-shaped recurrent layer (issue 34), in one run on one device.

    python3 bench/eprop_gpu.py                     # CUDA: LIF and ALIF, the table last
    python3 bench/eprop_gpu.py --device cpu --hidden 64 --batch 4 --T 20 200 --chunk 20   # a small CPU run

Layer: `flexdsl.recurrent(model, 700, 256)` (ALIF with `detach_reset="v"`, Bellec's), batch 64, inputs
Bernoulli(0.05) spikes, a readout `Linear(256, 20)` at every step and cross-entropy against fixed
random labels. A training step = reset, forward, loss, backward (no optimizer). BPTT: one call over
T steps. e-prop (`learning="eprop"`): one call over T steps, and the same T streamed as calls of
`--chunk` steps, each with its own loss and backward (the calls' gradients add up to one call's).
Peak memory above what is resident before the step (the model, the whole input), from
`torch.cuda.max_memory_allocated`; times: median of --reps synchronized runs after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flexdsl  # noqa: E402

IN, OUT_N = 700, 20


def build(model: str, learning: str, H: int, dev: torch.device) -> tuple[nn.Module, nn.Module]:
    kw = {"detach_reset": "v"} if model == "alif" else {}
    torch.manual_seed(0)
    layer = flexdsl.recurrent(model, IN, H, learning=learning, **kw).to(dev)
    torch.manual_seed(1)
    readout = nn.Linear(H, OUT_N).to(dev)
    return layer, readout


def step(layer, readout, x: torch.Tensor, y: torch.Tensor, chunk: int | None) -> None:
    layer.reset()
    T = x.shape[0]
    for a in range(0, T, chunk or T):
        b = min(T, a + (chunk or T))
        s = layer(x[a:b])
        loss = nn.functional.cross_entropy(readout(s).flatten(0, 1), y[a:b].flatten())
        loss.backward()
    layer.zero_grad(set_to_none=True)
    readout.zero_grad(set_to_none=True)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def measure(layer, readout, x, y, chunk, reps: int, dev: torch.device) -> tuple[float, float]:
    """(median ms, peak MiB above the resident)."""
    t0 = time.perf_counter()
    step(layer, readout, x, y, chunk)  # (warm-up: compiles, caches)
    sync(dev)
    print(f"  (first step {time.perf_counter() - t0:.1f} s)", flush=True)
    peak = float("nan")
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(layer, readout, x, y, chunk)
        sync(dev)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = []
    for _ in range(reps):
        sync(dev)
        t0 = time.perf_counter()
        step(layer, readout, x, y, chunk)
        sync(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), peak


def check(model: str, dev: torch.device) -> float:
    """The device's e-prop gradients (float32: the compiled step, the traces' kernel) against the same
    layer's on the CPU in float64 (the torch operations): the largest error relative to each
    gradient's largest value."""
    H, T, B = 64, 50, 8
    grads = []
    for d, dtype in ((dev, torch.float32), (torch.device("cpu"), torch.float64)):
        layer, readout = build(model, "eprop", H, torch.device("cpu"))
        layer, readout = layer.to(d, dtype), readout.to(d, dtype)
        g = torch.Generator().manual_seed(3)
        x = (torch.rand(T, B, IN, generator=g) < 0.05).to(d, dtype)
        y = torch.randint(0, OUT_N, (T, B), generator=g).to(d)
        layer.reset()
        for a in (0, 20):  # (two calls: the kept eligibility crosses them)
            s = layer(x[a:a + 30 if a else 20])
            nn.functional.cross_entropy(readout(s).flatten(0, 1), y[a:a + 30 if a else 20].flatten()).backward()
        grads.append({n: getattr(layer, n).grad.double().cpu() for n in ("W_in", "W_rec", "bias")})
    return max(float((grads[0][n] - grads[1][n]).abs().max() / grads[1][n].abs().max()) for n in grads[1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", nargs="+", default=["lif", "alif"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--T", type=int, nargs=2, default=[100, 1000], metavar=("SHORT", "LONG"))
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    short, long = a.T
    for model in a.models:
        print(f"check {model}: e-prop on {dev.type} (float32) against the CPU in float64: largest relative error "
              f"{check(model, dev):.2e}", flush=True)
    rows = []
    for model in a.models:
        g = torch.Generator().manual_seed(2)
        x_long = (torch.rand(long, a.batch, IN, generator=g) < 0.05).float().to(dev)
        y_long = torch.randint(0, OUT_N, (long, a.batch), generator=g).to(dev)
        cases = [("BPTT", "bptt", short, None), ("BPTT", "bptt", long, None),
                 ("e-prop, one call", "eprop", short, None),
                 (f"e-prop, calls of {a.chunk}", "eprop", short, a.chunk),
                 (f"e-prop, calls of {a.chunk}", "eprop", long, a.chunk)]
        for name, learning, T, chunk in cases:
            layer, readout = build(model, learning, a.hidden, dev)
            try:
                ms, mib = measure(layer, readout, x_long[:T], y_long[:T], chunk, a.reps if T == short else 1, dev)
            except torch.OutOfMemoryError:
                ms, mib = float("nan"), float("inf")
            rows.append((model, name, T, ms, mib))
            print(f"{model:5s} {name:22s} T={T:5d}: {ms:9.2f} ms, peak {mib:9.1f} MiB", flush=True)
            del layer, readout
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    print()
    print(f"| model | training | T | ms / step | peak MiB above resident |  ({a.hidden} neurons, batch {a.batch}, "
          f"{dev.type})")
    print("| --- | --- | --- | --- | --- |")
    for model, name, T, ms, mib in rows:
        print(f"| {model} | {name} | {T} | {ms:.2f} | {mib:.1f} |")
    for model in a.models:
        r = {(n, T): (ms, mib) for m, n, T, ms, mib in rows if m == model}
        bptt, ep = r[("BPTT", short)], r[("e-prop, one call", short)]
        streamed = [v for (n, T), v in r.items() if n.startswith("e-prop, calls") and T == long][0]
        short_streamed = [v for (n, T), v in r.items() if n.startswith("e-prop, calls") and T == short][0]
        print(f"{model}: e-prop/BPTT time at T={short}: {ep[0] / bptt[0]:.2f}x; streamed peak T={long}/T={short}: "
              f"{streamed[1] / short_streamed[1]:.2f}x; BPTT peak T={long}/T={short}: "
              f"{r[('BPTT', long)][1] / bptt[1]:.2f}x")


if __name__ == "__main__":
    main()
