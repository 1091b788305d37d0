"""CPU training speed of the torch backend against SpikingJelly's LIFNode, in the same run.

    python bench/cpu_train.py [--threads 1] [--T 32 --B 64 --N 1024] [--repeat 20]

LIF (tau=2, hard reset, sigmoid(4) surrogate), fp32, x = [T, B, N]; one fwd+bwd is
`reset; out = neuron(x); out.backward(g)`; the median of `--repeat` timed runs after warm-up.
Both run on the same thread count (torch.set_num_threads). Prints one table row per library.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def bench(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--N", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from spikingjelly.activation_based import functional, neuron, surrogate

    import flexdsl

    x = torch.rand(a.T, a.B, a.N) * 1.5
    g = torch.rand_like(x)
    ours = flexdsl.load("lif", backend="torch")
    sj = neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0), step_mode="m")

    def step(m):
        def f():
            functional.reset_net(m) if m is sj else m.reset()
            xx = x.clone().requires_grad_(True)
            m(xx).backward(g)
        return f

    # same results first
    ours.reset()
    functional.reset_net(sj)
    assert torch.equal(ours(x), sj(x)), "spikes differ"
    t_ours, t_sj = bench(step(ours), a.repeat), bench(step(sj), a.repeat)
    print(f"CPU fwd+bwd LIF fp32 [T={a.T}, B={a.B}, N={a.N}], {a.threads} thread(s), torch {torch.__version__}")
    print("| library | ms (median) | ratio to SpikingJelly |")
    print("| --- | --- | --- |")
    print(f"| flexdsl (torch backend) | {t_ours:.1f} | {t_ours / t_sj:.2f}x |")
    print(f"| SpikingJelly 2.0.0 LIFNode (torch backend) | {t_sj:.1f} | 1.00x |")


if __name__ == "__main__":
    main()
