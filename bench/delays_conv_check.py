"""The Triton backend's dense relaxed synaptic delays (`delay_conv`: learnable gauss synaptic delays, the
time-major history read in place) on CUDA against torch's convolution over time in float64 on the CPU
(outputs, the history's and the weights' gradients; TF32 on, as PyTorch's convolutions default, and off);
then fwd+bwd times of the kernel and of the convolution path it replaces (the history transposed to
[batch, channels, time], cuDNN's conv1d, transposed back) at the DCLS-shaped network's layer sizes (max 24,
T = 100, batch 256: 140 -> 256, 256 -> 256, 256 -> 20); `--sweep`: tile and pipeline choices.

    python3 bench/delays_conv_check.py [--sweep]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flexdsl.backends.triton.dense_delays as dl  # noqa: E402


def conv_path(h, W):
    x = h.permute(1, 2, 0)  # [N, J, L] (a copy in conv1d's input)
    out = torch.nn.functional.conv1d(x, W.permute(2, 1, 0).flip(-1))
    return out.permute(2, 0, 1).contiguous()


def run(f, h, W, go):
    h, W = h.detach().requires_grad_(), W.detach().requires_grad_()
    out = f(h, W)
    return (out, *torch.autograd.grad((out * go).sum(), [h, W]))


def timed(f, h, W, go, reps=20):
    for _ in range(3):
        run(f, h, W, go)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run(f, h, W, go)
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    D, T, N = 24, 100, 64
    hist = (torch.rand(D + T, N, 140, generator=g, dtype=torch.float64) < 0.2).double()
    W = torch.randn(D + 1, 140, 256, generator=g, dtype=torch.float64) / 30
    go = torch.randn(T, N, 256, generator=g, dtype=torch.float64)
    ref = run(conv_path, hist, W, go)
    for tf32 in (True, False):
        torch.backends.cudnn.allow_tf32 = tf32
        got = run(dl.delay_conv, hist.float().cuda(), W.float().cuda(), go.float().cuda())
        errs = [float((u.double().cpu() - v).abs().max() / v.abs().max()) for u, v in zip(got, ref)]
        print(f"check (TF32 {'on' if tf32 else 'off'}): CUDA float32 vs CPU float64, largest relative error "
              f"out {errs[0]:.2e}, grad hist {errs[1]:.2e}, grad W {errs[2]:.2e}", flush=True)
    check_gauss()
    torch.backends.cudnn.allow_tf32 = True
    N = 256
    rows = []
    for J, I in ((140, 256), (256, 256), (256, 20)):
        h = (torch.rand(D + T, N, J, device="cuda") < 0.2).float()
        Wc = torch.randn(D + 1, J, I, device="cuda") / 30
        o = torch.randn(T, N, I, device="cuda")
        dl.TMA = False
        tp = timed(dl.delay_conv, h, Wc, o)
        dl.TMA = True
        tk, tc = timed(dl.delay_conv, h, Wc, o), timed(conv_path, h, Wc, o)
        parts = [event_ms(f) for f in phases(h, Wc, o)]
        rows.append((J, I, tk, tc, parts))
        print(f"{J:4d} -> {I:3d}: kernel {tk:.3f} ms (forward {parts[0]:.3f}, history grad {parts[1]:.3f}, weight grad "
              f"{parts[2]:.3f}; pointer kernels {tp:.3f})  conv path {tc:.3f} ms  ({tc / tk:.2f}x)", flush=True)
        if a.sweep:
            sweep(h, Wc, o)
    print("| layer | kernel fwd+bwd | forward / history grad / weight grad | conv path fwd+bwd | speed-up |")
    print("| --- | --- | --- | --- | --- |")
    for J, I, tk, tc, p in rows:
        print(f"| {J} -> {I} | {tk:.3f} ms | {p[0]:.3f} / {p[1]:.3f} / {p[2]:.3f} ms | {tc:.3f} ms | {tc / tk:.2f}x |")


def check_gauss():
    """The fused op (`delay_gauss`: taps made in a kernel, the product, gradients of history, w and d) on
    CUDA in float32 (TF32 on and off) and 16-bit against the taps and convolution in float64 on the CPU."""
    from flexdsl.runtime.delays import gauss_coef, tap_weights

    g = torch.Generator().manual_seed(1)
    D, T, N, J, I, width = 24, 100, 64, 140, 256, 12.27
    hist = (torch.rand(D + T, N, J, generator=g) < 0.2).double()
    w = torch.randn(I, J, generator=g, dtype=torch.float64) / 10
    d = torch.rand(I, J, generator=g, dtype=torch.float64) * D
    go = torch.randn(T, N, I, generator=g, dtype=torch.float64)

    def ref_f(h, w_, d_):
        return conv_path(h, (w_.unsqueeze(-1) * tap_weights(d_, D, width, "gauss")).permute(2, 1, 0))

    def grads(f, args):
        args = [a.detach().requires_grad_() for a in args]
        out = f(*args)
        return [out.detach(), *torch.autograd.grad((out * go.to(out.device, out.dtype)).sum(), args)]
    ref = grads(ref_f, [hist, w, d])
    for label, dt, tf32 in (("float32, TF32 on", torch.float32, True), ("float32, TF32 off", torch.float32, False),
                            ("bfloat16", torch.bfloat16, True), ("float16", torch.float16, True)):
        torch.backends.cudnn.allow_tf32 = tf32
        got = grads(lambda h, w_, d_: dl.delay_gauss(h, w_, d_, gauss_coef(width, D, torch.float32), D),
                    [v.to(dt).cuda() for v in (hist, w, d)])
        errs = [float((u.double().cpu() - v).abs().max() / v.abs().max()) for u, v in zip(got, ref)]
        print(f"check delay_gauss ({label}) vs CPU float64, largest relative error: out {errs[0]:.2e}, "
              f"history {errs[1]:.2e}, w {errs[2]:.2e}, d {errs[3]:.2e}", flush=True)


def phases(h, Wc, o):
    K, L = Wc.shape[0], h.shape[0]
    Wt = Wc.transpose(1, 2).contiguous()
    return (lambda: dl.conv_forward(h, Wt, K - 1), lambda: dl.conv_history_grad(o, Wc, L, K - 1),
            lambda: dl.conv_weight_parts(h, o, K, K - 1))


def event_ms(f, reps=10):
    for _ in range(2):
        f()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def sweep(h, Wc, o):
    base, base_t = dl.mm_config, dl.mmt_config
    fwd, dh, dw = phases(h, Wc, o)
    for cfg in ((128, 128, 32, 8, 3), (128, 128, 32, 8, 4), (128, 128, 32, 4, 4), (128, 128, 64, 8, 3),
                (128, 64, 32, 4, 4), (256, 128, 32, 8, 3), (128, 256, 32, 8, 3), (256, 128, 32, 8, 4),
                (64, 128, 32, 4, 4), (128, 128, 16, 8, 5)):
        dl.mm_config = lambda rows, cols, inner, c=cfg: (c[0], min(c[1], max(16, 1 << (cols - 1).bit_length())),
                                                        *c[2:])
        dl.mmt_config = lambda J, I, c=cfg: (min(c[0], max(16, 1 << (J - 1).bit_length())),
                                             min(c[1], max(16, 1 << (I - 1).bit_length())), *c[2:])
        out = []
        for f in (fwd, dh, dw):
            try:
                out.append(f"{event_ms(f, 5):.3f}")
            except Exception as e:  # (a tile that does not fit)
                out.append(type(e).__name__)
        print(f"   tiles {cfg[0]}x{cfg[1]}x{cfg[2]} warps {cfg[3]} stages {cfg[4]}: forward {out[0]}, history grad "
              f"{out[1]}, weight grad {out[2]} ms", flush=True)
    dl.mm_config, dl.mmt_config = base, base_t


if __name__ == "__main__":
    main()
