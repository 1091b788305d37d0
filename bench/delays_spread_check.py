"""The Triton backend's per-element relaxed delays (`delay_spread`) on CUDA against the torch path's depthwise
convolution in float64 on the CPU: outputs and gradients (history, taps), relative error; then the time of
both on the GPU (fwd+bwd, the recurrent case's size: max 24, T = 250, batch 64, 700 channels).

    python3 bench/delays_spread_check.py
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flexdsl.backends.triton.delays import delay_spread  # noqa: E402
from flexdsl.runtime.delays import _spread  # noqa: E402

D, T, N, C = 24, 250, 64, 700
g = torch.Generator().manual_seed(0)
hist = torch.randn(D + T, N, C, generator=g, dtype=torch.float64)
taps = torch.softmax(torch.randn(C, D + 1, generator=g, dtype=torch.float64), -1)
go = torch.randn(T, N, C, generator=g, dtype=torch.float64)


def run(f, h, t, o):
    h, t = h.clone().requires_grad_(), t.clone().requires_grad_()
    out = f(h, t)
    return (out, *torch.autograd.grad((out * o).sum(), [h, t]))


ref = run(lambda h, t: _spread(h, t, T), hist, taps, go)
got = run(delay_spread, hist.float().cuda(), taps.float().cuda(), go.float().cuda())
for name, u, v in zip(("out", "grad hist", "grad taps"), got, ref):
    print(f"{name}: CUDA float32 vs CPU float64, largest relative error "
          f"{float((u.double().cpu() - v).abs().max() / v.abs().max()):.2e}", flush=True)
for label, f in (("kernel", delay_spread), ("depthwise conv", lambda h, t: _spread(h, t, T))):
    h, t, o = hist.float().cuda(), taps.float().cuda(), go.float().cuda()
    for _ in range(3):
        run(f, h, t, o)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        run(f, h, t, o)
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    print(f"{label}: fwd+bwd {statistics.median(ts):.3f} ms", flush=True)
