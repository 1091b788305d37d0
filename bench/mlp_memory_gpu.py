"""Training memory and time of an 8-layer `Linear(4096) -> LIF` MLP on one GPU (T = 32, batch 64, fp32,
step = forward, cross-entropy on the last layer's spike counts, backward): SpikingJelly 2.0.0's
`nn.Linear` + `LIFNode` (step_mode "m", its torch backend) against flexdsl's feed-forward layers
(`flexdsl.feedforward("lif", 4096, 4096)`: the product's 0/1 input saved as bits, `runtime/bits.py`)
and the same flexdsl layers with the bits off (`flexdsl.runtime.bits.ENABLED = False`), same run.
Peak = torch.cuda.max_memory_allocated during a step above what is allocated before it (the resident
model: weights, input, the last step's gradients, which the step drops first), as bench/memopt_gpu.py
defines it; median of 10 steps after 3.

    python3 bench/mlp_memory_gpu.py
"""
import statistics
import time

import torch
from torch import nn

T, B, N, L = 32, 64, 4096, 8


def sj_net():
    from spikingjelly.activation_based import layer, neuron
    mods = []
    for _ in range(L):
        mods += [layer.Linear(N, N, step_mode="m"), neuron.LIFNode(step_mode="m")]
    return nn.Sequential(*mods)


def flex_net():
    import flexdsl
    return nn.Sequential(*[flexdsl.feedforward("lif", N, N) for _ in range(L)])


def measure(net, x, y, reset):
    def step():
        reset(net)
        for p in net.parameters():
            p.grad = None
        out = net(x).sum(0)
        nn.functional.cross_entropy(out[:, :10], y).backward()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return peak, statistics.median(ts) * 1e3


def main():
    from spikingjelly.activation_based import functional

    import flexdsl
    import flexdsl.runtime.bits as bits
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}; {L} x Linear({N}) -> LIF, T={T}, "
          f"batch {B}, fp32", flush=True)
    torch.manual_seed(0)
    x = (torch.rand(T, B, N, device="cuda") < 0.2).float()
    y = torch.randint(0, 10, (B,), device="cuda")
    rows = []

    def flex_reset(net):
        for m in net:
            m.reset()
    def flex_recompute():
        net = flex_net()
        print(flexdsl.save_spikes_as_bits(net, recompute="product"), flush=True)
        return net
    for label, make, reset, on in (("SpikingJelly Linear + LIFNode", sj_net, functional.reset_net, True),
                                   ("flexdsl feedforward (bits)", flex_net, flex_reset, True),
                                   ("flexdsl feedforward (no bits)", flex_net, flex_reset, False),
                                   ("flexdsl feedforward (bits, recompute)", flex_recompute, flex_reset, True)):
        bits.ENABLED = on
        net = make().cuda()
        peak, ms = measure(net, x, y, reset)
        rows.append((label, peak, ms))
        print(f"{label:40s} peak {peak:6.3f} GiB   step {ms:7.2f} ms", flush=True)
        del net
        torch.cuda.empty_cache()
    bits.ENABLED = True
    sj = rows[0][1]
    print("| network | peak GiB | vs SpikingJelly | step ms |\n| --- | --- | --- | --- |")
    for label, peak, ms in rows:
        print(f"| {label} | {peak:.3f} | {peak / sj:.3f}x | {ms:.2f} |")


if __name__ == "__main__":
    main()
