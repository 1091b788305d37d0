"""The learnable synaptic delays' convolution over time (gauss relaxation, bench/delays_gpu.py's DCLS-shaped
layers: batch 256, T = 100, 25 taps) two ways, forward + backward, one GPU, default TF32 convolutions:

- "ncl": conv1d on the history seen as [batch, channels, time] (a transposing copy in, one out: today's);
- "time-major": conv2d on the history as it lies ([time, batch, channels] = a [1, C, time, batch] input in
  channels_last), kernel [K, 1] along time, output [1, O, T, batch] in channels_last = [T, batch, O].

    python3 bench/delays_conv_probe.py
"""
import statistics
import time

import torch

dev = "cuda"
B, T, K = 256, 100, 25


def ncl(hist, w):  # hist [K - 1 + T, B, C], w [O, C, K] -> [T, B, O]
    h = hist.permute(1, 2, 0)
    out = torch.nn.functional.conv1d(h, w)
    return out.permute(2, 0, 1).contiguous()


def time_major(hist, w):
    L, N, C = hist.shape
    h = hist.permute(2, 0, 1).unsqueeze(0)  # [1, C, L, N], channels_last strides
    out = torch.nn.functional.conv2d(h, w.unsqueeze(-1).contiguous(memory_format=torch.channels_last))
    return out[0].permute(1, 2, 0)  # [T, N, O]


def bench(fn, hist, w, g):
    def step():
        hist.grad = w.grad = None
        fn(hist, w).backward(g)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


for C, O in ((140, 256), (256, 256), (256, 20)):
    hist = torch.randn(K - 1 + T, B, C, device=dev, requires_grad=True)
    w = torch.randn(O, C, K, device=dev, requires_grad=True)
    g = torch.randn(T, B, O, device=dev)
    a, b = ncl(hist, w), time_major(hist, w)
    err = float((a - b).abs().max() / a.abs().max())
    ga = torch.autograd.grad(ncl(hist, w), [hist, w], g)
    gb = torch.autograd.grad(time_major(hist, w), [hist, w], g)
    gerr = max(float((u - v).abs().max() / u.abs().max()) for u, v in zip(ga, gb))
    print(f"C={C:4d} O={O:4d}: ncl {bench(ncl, hist, w, g):6.3f} ms  time-major {bench(time_major, hist, w, g):6.3f} ms"
          f"  (out rel diff {err:.1e}, grads {gerr:.1e})", flush=True)
