"""CPU training speed of flexdsl's LIF (the CPU kernels, and the torch backend) against
SpikingJelly's LIFNode (torch backend), in the same run, after the one-time build of the kernels.

    python bench/cpu_train.py [--threads 2] [--T 32 --B 64 --N 1024] [--repeat 30]

LIF (tau=2, hard reset, sigmoid(4) surrogate), fp32, x = [T, B, N]; one fwd+bwd is
`reset; out = neuron(x); out.backward(g)` (x a fresh leaf that requires grad). The libraries are
timed in turn within each repetition (so that a busy machine slows them alike); the table gives
each one's median over `--repeat` repetitions after warm-up and its ratio to SpikingJelly. The
one-time cost of the CPU kernels is measured first, in an empty flexdsl cache (a temporary
folder): the model's lowering, derivation and C++ emission, and the C++ build (the compiler
PyTorch uses for Inductor). All run on the same thread count (torch.set_num_threads). Also
checks that the three give the same spikes and (to rounding) the same input gradients.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--N", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cache = tempfile.TemporaryDirectory(prefix="flexdsl-bench-cache-")
    os.environ["FLEXDSL_CACHE_DIR"] = cache.name  # (the one-time build, measured from nothing)
    from spikingjelly.activation_based import functional, neuron, surrogate

    import flexdsl
    from flexdsl.backends.cpu import build

    t0 = time.perf_counter()
    kern = flexdsl.load("lif", backend="cpu")  # lowering, backward, C++ emission and build
    t_build = time.perf_counter() - t0
    t_cc = sum(build.BUILD_TIMES.values())
    ref = flexdsl.load("lif", backend="torch")
    sj = neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0), step_mode="m")
    x = torch.rand(a.T, a.B, a.N) * 1.5
    g = torch.rand_like(x)

    def reset(m):
        functional.reset_net(m) if m is sj else m.reset()

    def fwd_bwd(m):
        reset(m)
        xx = x.clone().requires_grad_(True)
        out = m(xx)
        out.backward(g)
        return out.detach(), xx.grad

    # the same results first
    (o1, g1), (o2, g2), (o3, g3) = fwd_bwd(kern), fwd_bwd(ref), fwd_bwd(sj)
    assert torch.equal(o1, o3) and torch.equal(o2, o3), "spikes differ"
    torch.testing.assert_close(g1, g3, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(g2, g3, rtol=1e-4, atol=1e-6)

    libs = {"flexdsl (CPU kernels)": kern, "flexdsl (torch backend)": ref, "SpikingJelly 2.0.0 LIFNode (torch)": sj}
    for m in libs.values():
        for _ in range(3):
            fwd_bwd(m)
    times: dict[str, list[float]] = {k: [] for k in libs}
    for _ in range(a.repeat):
        for k, m in libs.items():
            t = time.perf_counter()
            fwd_bwd(m)
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    t_sj = med["SpikingJelly 2.0.0 LIFNode (torch)"]
    print(f"CPU fwd+bwd LIF fp32 [T={a.T}, B={a.B}, N={a.N}], {a.threads} thread(s), torch {torch.__version__}, "
          f"{os.cpu_count()} CPU cores; one-time build of the CPU kernels: {t_build:.1f} s "
          f"(of which C++ compile {t_cc:.1f} s)")
    print("| library | ms (median) | speed-up over SpikingJelly |")
    print("| --- | --- | --- |")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} | {t_sj / v:.2f}x |")
    cache.cleanup()


if __name__ == "__main__":
    main()
