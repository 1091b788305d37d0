"""Where a large recurrent call's host time goes on this machine: the aten ops' own CPU time
(torch.profiler, GPU idle at each call's start) and a few allocator probes (us per call)."""

from __future__ import annotations

import time

import torch
from recurrent_profile import layer_call


def probe(fn, n=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return sorted(ts)[n // 2]


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    keep = []
    print(f"  empty 263 MB (kept one call): {probe(lambda: keep.__setitem__(slice(None), [torch.empty((251, 256, 1024), device='cuda')])):7.1f} us")
    print(f"  empty 263 MB (freed):         {probe(lambda: torch.empty((251, 256, 1024), device='cuda')):7.1f} us")
    print(f"  empty 4 KB:                    {probe(lambda: torch.empty((1024,), device='cuda')):7.1f} us")
    print(f"  empty pinned 8 B:              {probe(lambda: torch.empty(2, dtype=torch.int32, pin_memory=True)):7.1f} us")
    z = torch.zeros(256, 1024, device="cuda")
    S = torch.empty((251, 256, 1024), device="cuda")
    print(f"  S[0] = s0:                     {probe(lambda: S.__setitem__(0, z)):7.1f} us")
    print(f"  S[0].copy_(s0):                {probe(lambda: S[0].copy_(z)):7.1f} us")
    print(f"  s0.to(bfloat16):               {probe(lambda: z.to(torch.bfloat16)):7.1f} us")
    print(f"  zeros(1) int32:                {probe(lambda: torch.zeros(1, dtype=torch.int32, device='cuda')):7.1f} us")
    for H, T, B in ((1024, 250, 256), (256, 100, 64)):
        step = layer_call("lif", H, T, B, "fp32", False)
        keys = ("segment.all.allocated", "segment.all.freed", "num_alloc_retries", "num_device_alloc",
                "num_device_free")
        for i in range(4):
            before = torch.cuda.memory_stats()
            step()
            torch.cuda.synchronize()
            after = torch.cuda.memory_stats()
            print(f"  call {i}: " + ", ".join(f"{k} +{after.get(k, 0) - before.get(k, 0)}" for k in keys)
                  + f", reserved {torch.cuda.memory_reserved() / 2**20:.0f} MiB", flush=True)
        print(f"  layer call host H={H} T={T} B={B}: {probe(lambda s=step: (s(), torch.cuda.synchronize()), 20):7.1f} us "
              f"(synchronized)", flush=True)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as p:
            for _ in range(10):
                step()
                torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=50), flush=True)
        for row in p.key_averages(group_by_stack_n=12):
            if row.key in ("cudaMalloc", "aten::fill_", "aten::zero_") and row.self_cpu_time_total > 500:
                print(f"{row.key}: {row.count} calls, self {row.self_cpu_time_total / row.count:.0f} us each")
                print("    " + "\n    ".join(str(f) for f in row.stack if "flexdsl" in str(f) or "bench" in str(f)))


if __name__ == "__main__":
    main()
