"""Where a rewritten network's training step makes the host wait (one GPU): the first synchronizing call of
a step of the memopt harness's VGG-11-BN rewritten with recompute="norm", with its traceback (torch.cuda.set_sync_debug_mode).

    python3 bench/sync_probe.py
"""
import sys, traceback, torch, os
sys.path.insert(0, "bench")
import memopt_gpu as h
from e2e_gpu import _stub_torchvision
_stub_torchvision()
from spikingjelly.activation_based import functional
import flexdsl
from torch import nn
net, x, _ = h.build("spiking_vgg11_bn", h.flexdsl_node)
flexdsl.save_spikes_as_bits(net, recompute="norm")
y = torch.randint(0, 10, (x.shape[1],), device="cuda")
def step():
    functional.reset_net(net); net.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(net(x).mean(0)[:, :10], y).backward()
for _ in range(3): step()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
for k in range(2):
    try:
        step(); print("no sync"); break
    except RuntimeError as e:
        traceback.print_exc(limit=-6)
        torch.cuda.set_sync_debug_mode("default"); torch.cuda.synchronize(); torch.cuda.set_sync_debug_mode("error")
