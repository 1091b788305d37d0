"""Where the time of `flexdsl.save_spikes_as_bits` goes in the memopt harness's spiking VGG-11-BN (one
GPU, torch.profiler): the top CUDA kernels and CPU ops of a training step, with flexdsl's lif, before
and after the rewrite.

    python3 bench/bits_profile.py
"""
import sys

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")


def main():
    import memopt_gpu as h
    from e2e_gpu import _stub_torchvision
    from spikingjelly.activation_based import functional

    import flexdsl
    _stub_torchvision()
    for bits in (False, True):
        net, x, _ = h.build("spiking_vgg11_bn", h.flexdsl_node)
        if bits:
            print(flexdsl.save_spikes_as_bits(net))
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        y = torch.randint(0, 10, (x.shape[1],), device="cuda")

        def step(net=net, opt=opt, x=x, y=y):
            functional.reset_net(net)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(net(x).mean(0)[:, :10], y).backward()
            opt.step()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        print(f"==== bits={bits}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))


if __name__ == "__main__":
    main()
