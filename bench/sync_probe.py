"""Where a rewritten network's training step makes the host wait (one GPU): the synchronizing calls of a
step of the memopt harness's spiking VGG-11-BN rewritten with `recompute="norm"`, each with its traceback
(`torch.cuda.set_sync_debug_mode("error")`; up to 4 a step).

    python3 bench/sync_probe.py [--arch spiking_vgg11_bn|sew_resnet18] [--recompute norm]
"""
import argparse
import sys
import traceback

import torch

sys.path.insert(0, "bench")


def main():
    import memopt_gpu as h
    from e2e_gpu import _stub_torchvision

    import flexdsl
    _stub_torchvision()
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="spiking_vgg11_bn")
    ap.add_argument("--recompute", default="norm")
    a = ap.parse_args()
    net, x, _ = h.build(a.arch, h.flexdsl_node)
    print(flexdsl.save_spikes_as_bits(net, recompute=None if a.recompute == "none" else a.recompute))
    from keep_profile import train_step

    step = train_step(net, x)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    for _ in range(4):
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
            print("a step without a host sync")
            break
        except RuntimeError:
            traceback.print_exc(limit=-6)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
