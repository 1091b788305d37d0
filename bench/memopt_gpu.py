"""Training memory on one GPU: SpikingJelly 2.0.0's memopt (`optimize_memory`, levels 1-4) against the
plain network with SpikingJelly's LIFNode and with flexdsl's lif, same run.

Run on the device: python3 bench/memopt_gpu.py [--archs sew_resnet18 spiking_vgg11_bn]
Networks as bench/e2e_gpu.py: SEW-ResNet-18 (ADD) on [T=4, B=16, 3, 224, 224], spiking VGG-11-BN on
[T=4, B=64, 3, 32, 32], fp32. Step = reset, zero_grad, forward, cross-entropy of the time mean, backward,
SGD. For each: the optimizer's search time, the peak memory of a step above the resident model
(torch.cuda.max_memory_allocated), median step time of 8 after 2 warm-ups.
memopt's targets: the ResNet's BasicBlocks / the VGG's convolutions and LIF nodes.
flexdsl: `flexdsl_node` (the library lif) and whatever memory-saving form the project documents
(edit `flexdsl_optimize`). In this repository: the shared harness with `flexdsl_optimize` filled in
(`flexdsl.save_spikes_as_bits`); `bash bench/gpu_session.sh memopt`."""
import argparse
import statistics
import sys
import time

import torch
from torch import nn

dev = "cuda"


def build(arch, node):
    from spikingjelly.activation_based import functional
    from spikingjelly.activation_based.model import sew_resnet, spiking_vgg
    torch.manual_seed(0)
    if arch == "sew_resnet18":
        net = sew_resnet.sew_resnet18(spiking_neuron=node, cnf="ADD", detach_reset=True)
        x = torch.rand(4, 16, 3, 224, 224, device=dev)
        targets = (sew_resnet.BasicBlock,)
    else:
        net = spiking_vgg.spiking_vgg11_bn(spiking_neuron=node, num_classes=10, detach_reset=True)
        x = torch.rand(4, 64, 3, 32, 32, device=dev)
        from spikingjelly.activation_based import layer, neuron
        targets = (layer.Conv2d, neuron.LIFNode)
    functional.set_step_mode(net, "m")
    return net.to(dev), x, targets


def sj_node(**kw):
    from spikingjelly.activation_based import neuron, surrogate
    return neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0),
                          detach_reset=kw.get("detach_reset", False), step_mode="m")


def flexdsl_node(**kw):
    import flexdsl
    return flexdsl.load("lif", detach_reset=kw.get("detach_reset", False), step_mode="m")


def flexdsl_optimize(net, x, recompute=None):
    """The project's memory-saving form: `flexdsl.save_spikes_as_bits(net, recompute=...)` (the network as
    built, with flexdsl's lif: every Linear/Conv product saves its 0/1 input as bits, other saved spikes
    too; "norm": the BN outputs recomputed in the backward, "product": the conv outputs too)."""
    import flexdsl
    print(flexdsl.save_spikes_as_bits(net, recompute=recompute), flush=True)
    return net


def bench(net, x):
    from spikingjelly.activation_based import functional
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    y = torch.randint(0, 10, (x.shape[1],), device=dev)

    def step():
        functional.reset_net(net)
        opt.zero_grad(set_to_none=True)
        out = net(x)
        nn.functional.cross_entropy(out.mean(0)[:, :10], y).backward()
        opt.step()
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    ts = []
    for _ in range(8):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, peak


def main():
    sys.path.insert(0, "bench")
    from e2e_gpu import _stub_torchvision
    _stub_torchvision()  # (SpikingJelly's zoo imports torchvision for downloads it never makes here)
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["sew_resnet18", "spiking_vgg11_bn"])
    ap.add_argument("--levels", nargs="+", type=int, default=[1, 2, 3, 4])
    a = ap.parse_args()
    from spikingjelly.activation_based import functional
    from spikingjelly.activation_based.memopt import optimize_memory
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    for arch in a.archs:
        rows = []
        for label, node, level in ([("SJ LIFNode", sj_node, 0), ("flexdsl lif", flexdsl_node, 0)]
                                   + [(f"SJ memopt level {lv}", sj_node, lv) for lv in a.levels]
                                   + [("flexdsl bits", flexdsl_node, -1), ("flexdsl bits + norm", flexdsl_node, -2),
                                      ("flexdsl bits + product", flexdsl_node, -3)]):
            try:
                net, x, targets = build(arch, node)
                search = 0.0
                if level > 0:
                    def example(m, x=x):
                        functional.reset_net(m)
                        return m(x)
                    t0 = time.perf_counter()
                    net = optimize_memory(net, targets, example, level=level)
                    torch.cuda.synchronize()
                    search = time.perf_counter() - t0
                elif level < 0:
                    net = flexdsl_optimize(net, x, recompute=[None, "norm", "product"][-level - 1])
                    if net is None:
                        print(f"{arch:17s} {label:24s} n/a (no API)", flush=True)
                        continue
                ms, peak = bench(net, x)
                rows.append((label, ms, peak))
                print(f"{arch:17s} {label:24s} step {ms:8.2f} ms  peak {peak:6.3f} GiB  search {search:6.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{arch:17s} {label:24s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            finally:
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
