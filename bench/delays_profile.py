"""Where the time of bench/delays_gpu.py's flexdsl networks goes (torch.profiler, one GPU): the top CUDA
kernels and CPU ops of a training step, with and without delays.

    python3 bench/delays_profile.py
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
import delays_gpu as h  # noqa: E402, I001


def steps():
    """(delays, one training step) of the harness's flexdsl network without and with delays."""
    x = (torch.rand(100, 256, h.N_IN, device="cuda") < 0.03).float()
    y = torch.randint(0, h.N_OUT, (256,), device="cuda")
    for delays in (False, True):
        torch.manual_seed(0)
        yield delays, h.train_step(h.FlexDelayNet(delays).cuda().train(), x, y)


def main():
    for delays, step in steps():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(f"==== delays={delays}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
        waits = {e.key: e.count for e in prof.key_averages()
                 if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy")}
        print(f"host waits and copies in 5 steps: {waits}")
        # which Python lines copy or wait (a stack per event)
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof2:
            step()
            torch.cuda.synchronize()
        for e in prof2.events():
            if e.name in ("cudaStreamSynchronize", "cudaMemcpyAsync", "aten::item", "aten::_local_scalar_dense"):
                frames = [f for f in (e.stack or []) if "flexdsl" in f or "bench" in f][:4]
                print(f"  {e.name}: {' <- '.join(frames)}")


if __name__ == "__main__":
    main()
