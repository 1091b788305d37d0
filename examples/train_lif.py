"""Train a tiny spiking classifier with a flexdsl LIF layer (CPU, a few seconds).

    python examples/train_lif.py
"""

from __future__ import annotations

import torch
from torch import nn

import flexdsl


def main(steps: int = 60, T: int = 16) -> float:
    torch.manual_seed(0)
    # two Gaussian blobs in 20 dimensions, encoded as constant input currents
    n, d = 256, 20
    y = torch.randint(0, 2, (n,))
    centers = torch.randn(2, d)
    x = centers[y] + 0.8 * torch.randn(n, d)
    net = nn.Sequential(nn.Linear(d, 64), flexdsl.load("plif", step_mode="m"))
    readout = nn.Linear(64, 2)
    opt = torch.optim.Adam([*net.parameters(), *readout.parameters()], lr=1e-2)
    for step in range(steps):
        for m in net.modules():
            if isinstance(m, flexdsl.NeuronModule):
                m.reset()
        xs = x.unsqueeze(0).expand(T, n, d)  # [T, batch, features]
        h = net[0](xs)
        spikes = net[1](h)  # [T, batch, 64]
        logits = readout(spikes.mean(0))
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            acc = (logits.argmax(1) == y).float().mean().item()
            print(f"step {step:3d}  loss {loss.item():.3f}  acc {acc:.2f}  rate {spikes.mean().item():.3f}")
    return acc


if __name__ == "__main__":
    main()
