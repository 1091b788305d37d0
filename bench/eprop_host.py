"""Where an e-prop training step's host time goes (CUDA): cProfile over 10 steps of the SHD-shaped layer
(`bench/eprop_gpu.py`'s definitions), BPTT and e-prop, LIF and ALIF; the functions by own time and flexdsl's
by cumulative time.

    python3 bench/eprop_host.py
"""
from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flexdsl  # noqa: E402

dev = torch.device("cuda")
T, B, IN, H = 100, 64, 700, 256
for model, kw in [("lif", {}), ("alif", {"detach_reset": "v"})]:
    for learning in ("bptt", "eprop"):
        layer = flexdsl.recurrent(model, IN, H, learning=learning, **kw).to(dev)
        readout = nn.Linear(H, 20).to(dev)
        x = (torch.rand(T, B, IN, device=dev) < 0.05).float()
        y = torch.randint(0, 20, (T, B), device=dev)

        def step(layer=layer, readout=readout, x=x, y=y):
            layer.reset()
            s = layer(x)
            nn.functional.cross_entropy(readout(s).flatten(0, 1), y.flatten()).backward()

        for _ in range(5):
            step()
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        pr.disable()
        print(f"==== {model} {learning}: host profile of 10 steps", flush=True)
        st = pstats.Stats(pr)
        st.sort_stats("tottime").print_stats(14)
        st.sort_stats("cumulative").print_stats("flexdsl", 26)
