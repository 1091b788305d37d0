"""Where a recurrent layer's learnable axonal delays cost (one GPU, torch.profiler): bench/delays_gpu.py's
recurrent case (input 700, H = 256, T = 250, batch 64, max 24), fwd+bwd, without delays and with each
relaxation; the CUDA kernels that take the most.

    python3 bench/delays_rec_profile.py
"""
import sys

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
import delays_gpu as h  # noqa: E402, I001

import flexdsl  # noqa: E402

H, T = 256, 250
x = (torch.rand(T, 64, 700, device="cuda") < 0.03).float()
y = torch.randint(0, 20, (64,), device="cuda")
for kind in ("none", "gauss", "linear"):
    step = h.train_step(h._Readout(flexdsl.loads(h.recurrent_text(H, kind)), nn.Linear(H, 20)).cuda(), x, y)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0), key=lambda e: -e.self_device_time_total)
    tot = sum(e.self_device_time_total for e in ev) / 3 / 1e3
    print(f"== {kind}: GPU {tot:.2f} ms a step", flush=True)
    for e in ev[:8]:
        print(f"   {e.self_device_time_total / 3 / 1e3:7.3f} ms x{e.count / 3:4.0f}  {e.key[:100]}", flush=True)
