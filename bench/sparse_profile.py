"""Where a sparse-input layer's time goes (issue 35): CUDA time per kernel of one inference call of
`flexdsl.feedforward("lif", NI, H, sparse_input=True)` (torch.profiler), and the accuracy of its
products against float64 (the sparse gather, the dense fallback, cuBLAS float32).

    python bench/sparse_profile.py [--shape 4096x4096x32x64] [--rates 0.01,0.2]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import flexdsl
from flexdsl.backends.triton import sparse as sp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x4096x32x64")
    ap.add_argument("--rates", default="0.01,0.2")
    ap.add_argument("--host", action="store_true", help="where the host's time goes (cProfile)")
    a = ap.parse_args()
    ni, h, T, B = (int(v) for v in a.shape.split("x"))
    torch.manual_seed(0)
    m = flexdsl.feedforward("lif", ni, h, sparse_input=True).cuda()
    with torch.no_grad():
        m.W.mul_(8.0)
    for rate in (float(r) for r in a.rates.split(",")):
        x = (torch.rand((T, B, ni), device="cuda") < rate).float()
        for _ in range(3):
            m.reset()
            with torch.no_grad():
                m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                m.reset()
                with torch.no_grad():
                    m(x)
            torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                per[e.name[:60]] += e.device_time / 5 / 1e3
        print(f"rate {rate:.0%}: {m.sparse_report()}")
        t0 = time.perf_counter()
        for _ in range(20):
            m.reset()
            with torch.no_grad():
                m(x)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"  host {1e3 * (t1 - t0) / 20:.3f} ms/call queued, {1e3 * (t2 - t0) / 20:.3f} ms/call to the end")
        if a.host:
            import cProfile
            import pstats

            m.sparse_input = "always"  # (no count read: the host's own time, no waits)
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(200):
                m.reset()
                with torch.no_grad():
                    m(x)
            pr.disable()
            torch.cuda.synchronize()
            m.sparse_input = True
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  {v:8.3f} ms  {k}")
        # the products against float64
        x2 = x.reshape(-1, ni)
        w = m.W.detach()
        ref = x2.double() @ w.double().t()
        scale = (x2.double().abs() @ w.double().abs().t()).max().item()
        out = sp.current(x2, sp.compact(x2, 1.0), w.t().contiguous(), None)
        print(f"  sparse gather: max |err| {(out.double() - ref).abs().max().item():.2e} (scale {scale:.2e})")
        print(f"  cuBLAS float32: max |err| {(x2 @ w.t()).double().sub(ref).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
