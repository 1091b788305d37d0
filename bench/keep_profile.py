"""Where a rewritten network's step time goes (`flexdsl.save_spikes_as_bits(net, recompute=...)`), in the
memopt harness's networks (one GPU): per configuration the step and the peak as the harness measures
them (`memopt_gpu.bench`), the host's time to queue a step from an idle GPU (median of 8; near the step
when host-bound), the GPU's kernel time in
a step (torch.profiler) and the host synchronizations a step makes (`torch.cuda.set_sync_debug_mode`).
FLEXDSL_BITS_CHUNK_MB is set per row.

    python3 bench/keep_profile.py [--archs spiking_vgg11_bn sew_resnet18]
"""
import argparse
import os
import statistics
import sys
import time
import warnings

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")

CONFIGS = [("flexdsl lif", None, None), ("bits, chunks 8 MiB", "bits", "8"), ("bits, no chunks", "bits", "100000"),
           ("bits + norm, no chunks", "norm", "100000"), ("bits + product, no chunks", "product", "100000"),
           ("bits + norm, chunks 32 MiB", "norm", "32")]


def train_step(net, x):
    """One training step as the shared memopt harness takes it (reset, forward, cross-entropy on the
    first 10 outputs' mean over time, backward, SGD)."""
    from spikingjelly.activation_based import functional

    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    y = torch.randint(0, 10, (x.shape[1],), device=x.device)

    def step():
        functional.reset_net(net)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x).mean(0)[:, :10], y).backward()
        opt.step()
    return step


def main():
    import memopt_gpu as h
    from e2e_gpu import _stub_torchvision

    import flexdsl
    _stub_torchvision()
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["spiking_vgg11_bn", "sew_resnet18"])
    ap.add_argument("--host", type=int, nargs="*", default=None,
                    help="instead: cProfile the host over 5 steps for these rows of CONFIGS")
    a = ap.parse_args()
    if a.host is not None:
        return host(a.archs, a.host)
    rows = []
    for arch in a.archs:
        for label, mode, chunk in CONFIGS:
            if chunk:
                os.environ["FLEXDSL_BITS_CHUNK_MB"] = chunk
            net, x, _ = h.build(arch, h.flexdsl_node)
            if mode:
                flexdsl.save_spikes_as_bits(net, recompute=None if mode == "bits" else mode)
            ms, peak = h.bench(net, x)  # (the shared harness's step time and peak, its definitions)
            step = train_step(net, x)
            hs = []
            for _ in range(8):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                hs.append(time.perf_counter() - t0)  # (queued, not waited for)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                step()
            torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(m.message) for m in w)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            gpu = sum(e.device_time_total for e in prof.key_averages()) / 1e3
            r = (arch, label, ms, statistics.median(hs) * 1e3, gpu, syncs, peak)
            rows.append(r)
            print(f"{arch:17s} {label:28s} step {r[2]:7.2f} ms  host {r[3]:7.2f} ms  gpu {r[4]:7.2f} ms  "
                  f"syncs {syncs:3d}  peak {peak:6.3f} GiB", flush=True)
            del net, step
            torch.cuda.empty_cache()
    os.environ.pop("FLEXDSL_BITS_CHUNK_MB", None)
    print("| network | configuration | step ms | host ms | GPU ms | syncs | peak GiB |\n| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]} | {r[6]:.3f} |")


def host(archs, which):
    import cProfile
    import pstats

    import memopt_gpu as h

    import flexdsl
    for arch in archs:
        for i in which:
            label, mode, chunk = CONFIGS[i]
            os.environ["FLEXDSL_BITS_CHUNK_MB"] = chunk or "100000"
            net, x, _ = h.build(arch, h.flexdsl_node)
            if mode:
                flexdsl.save_spikes_as_bits(net, recompute=None if mode == "bits" else mode)
            step = train_step(net, x)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            pr.disable()
            print(f"==== {arch} {label}: host profile of 5 steps")
            pstats.Stats(pr).sort_stats("tottime").print_stats(18)
            pstats.Stats(pr).sort_stats("cumulative").print_stats("flexdsl|spikingjelly", 30)
            del net
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
