"""Launch-shape sweep of the training kernels on a GPU, saving against recomputing.

    python bench/sweep_rc.py

For LIF and Izhikevich (fp32 and bf16, N = 4,194,304, T = 8, 32, 128): fwd+bwd through the
module (do_bench median, ms) with the saving plan and with the recomputing plan at several
(lanes per program, warps) of the recompute backward; SpikingJelly's LIFNode/IzhikevichNode in
the same run. Prints a table; the best recompute shape per case is marked.
"""

from __future__ import annotations

import itertools

import torch
import triton.testing as tt

import flexdsl

dev = "cuda"


def bench(f):
    return tt.do_bench(f, warmup=25, rep=200, return_mode="median")


def train_fn(m, x, g, reset):
    xg = x.clone().requires_grad_(True)

    def f():
        reset(m)
        xg.grad = None
        m(xg).backward(g)

    return f


def main() -> None:
    from spikingjelly.activation_based import functional, neuron, surrogate

    sg = surrogate.Sigmoid(alpha=4.0)
    N = 1 << 22
    print(f"device {torch.cuda.get_device_name()}")
    print("| model | dtype | T | SJ ms | save ms | recompute ms (BLOCK_RC, warps) | best / SJ |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, sj_cls in (("lif", neuron.LIFNode), ("izhikevich", neuron.IzhikevichNode)):
        m = flexdsl.load(name, backend="triton").to(dev)
        prog = m.compiled.program("triton")
        for dt, T in itertools.product((torch.float32, torch.bfloat16), (8, 32, 128)):
            x = (torch.rand(T, N, device=dev) * 1.5).to(dt)
            g = torch.rand_like(x)
            sj = sj_cls(surrogate_function=sg, step_mode="m").to(dev)
            t_sj = bench(train_fn(sj, x, g, functional.reset_net)) if dt == torch.float32 else float("nan")
            prog.train_plan = "save"
            t_save = bench(train_fn(m, x, g, lambda mm: mm.reset()))
            prog.train_plan = "recompute"
            res = {}
            for block, warps in ((128, 4), (256, 4), (256, 8), (512, 4), (512, 8), (1024, 8)):
                prog.block_rc = block
                prog.k_bwd_rc.warps = warps
                res[(block, warps)] = bench(train_fn(m, x, g, lambda mm: mm.reset()))
            best = min(res, key=res.get)
            shown = ", ".join(f"{v:.3f}{'*' if k == best else ''} {k}" for k, v in res.items())
            print(f"| {name} | {str(dt)[6:]} | {T} | {t_sj:.3f} | {t_save:.3f} | {shown} | "
                  f"{t_sj / res[best]:.2f}x |", flush=True)
            del x, g


if __name__ == "__main__":
    main()
