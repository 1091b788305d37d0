"""The cost of noise (issue 21): a noisy LIF layer against the library's noise-free LIF, both on
the Triton kernels, in the same run.

    python bench/noise_gpu.py                    # on a GPU: T=32, N=4,194,304, float32 (the target: <= 1.3x)
    python bench/noise_gpu.py --smoke            # a CPU check (Triton's interpreter, tiny sizes)

The noisy LIF is `lif` with `+ sigma * randn()` in its update (sigma not learnable, 0.1): the same
step, one draw per step and neuron (Philox4x32-10 and Box-Muller in the kernel: arithmetic, no
memory traffic). Timed per model: inference (forward, no grad) and training (forward + backward of
`out.backward(g)`, x a leaf that requires grad), each by `triton.testing.do_bench` (median of its
repetitions), in the training plan the kernels' cost model picks (stated in the table) and in each
plan forced. Before timing it checks that the noisy layer's spikes and input gradients equal the
torch path's at a fixed seed (smoke sizes) and that different seeds differ. Prints a table with the
ratio noisy / noise-free.
"""

from __future__ import annotations

import argparse
import os
import sys

NOISY_LIF = """neuron NoisyLIF:
    \"\"\"The library's LIF with Gaussian noise added to the membrane at every step.\"\"\"
    input x                                   "input current"
    param tau = 2.0          where tau > 1    "membrane time constant (steps)"
    param v_threshold = 1.0                   "firing threshold"
    param v_reset = 0.0                       "reset potential"
    param sigma = 0.1                         "noise per step"
    state v = v_reset                         "membrane potential"

    update:
        v = v + (x - (v - v_reset)) / tau + sigma * randn()

    spike when v >= v_threshold surrogate sigmoid(alpha=4.0)

    on spike:
        v = v_reset

    output spike
"""


def _check(flexdsl, torch, device: str) -> None:
    """The noisy layer on the kernels equals the torch path at a seed; other seeds differ."""
    x = torch.rand(9, 37, device=device) * 1.5
    outs = {}
    for backend in ("triton", "torch"):
        m = flexdsl.loads(NOISY_LIF, backend=backend).to(device)
        xx = x.clone().requires_grad_(True)
        out = m(xx, seed=7)
        out.backward(torch.ones_like(out))
        outs[backend] = (out.detach(), xx.grad)
    assert torch.equal(outs["triton"][0], outs["torch"][0]), "spikes differ from the torch path"
    torch.testing.assert_close(outs["triton"][1], outs["torch"][1], rtol=1e-4, atol=1e-5)
    m = flexdsl.loads(NOISY_LIF, backend="triton").to(device)
    assert not torch.equal(m(x, seed=1), m(x, seed=2)), "two seeds gave the same noise"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--N", type=int, default=4_194_304)
    ap.add_argument("--smoke", action="store_true", help="Triton's interpreter on the CPU, T=4, N=256")
    a = ap.parse_args()
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        a.T, a.N = 4, 256
    import torch
    import triton

    import flexdsl

    device = "cpu" if a.smoke else "cuda"
    if not a.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU check")
    _check(flexdsl, torch, device)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(a.T, a.N, device=device, generator=gen) * 1.5
    g = torch.rand(a.T, a.N, device=device, generator=gen)
    models = {"lif (no noise)": flexdsl.load("lif", backend="triton").to(device),
              "lif + sigma*randn()": flexdsl.loads(NOISY_LIF, backend="triton").to(device)}

    def bench(fn) -> float:
        """ms: triton.testing.do_bench's median on a GPU; in the smoke run one timed call."""
        if not a.smoke:
            return triton.testing.do_bench(fn, warmup=25, rep=200)
        import time

        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def infer(m):
        with torch.no_grad():
            m.reset()
            m(x)

    def train(m):
        m.reset()
        xx = x.detach().requires_grad_(True)
        m(xx).backward(g)

    rows = []
    for plan in ("default", "save", "recompute"):
        times = {}
        for name, m in models.items():
            prog = m.compiled.program("triton")
            if plan != "default":
                prog.train_plan = plan
            used = prog.train_plans[4]
            times[name] = (bench(lambda m=m: infer(m)), bench(lambda m=m: train(m)), used)
            prog.default_train_plans()
        base = times["lif (no noise)"]
        for name, (ti, tt, used) in times.items():
            rows.append((plan, name, used, ti, tt, ti / base[0], tt / base[1]))
    dev = "CPU (Triton interpreter, smoke)" if a.smoke else torch.cuda.get_device_name()
    print(f"noisy LIF vs LIF, Triton kernels, float32 x [T={a.T}, N={a.N:,}], {dev}, triton {triton.__version__}, "
          f"torch {torch.__version__}; " + ("one call each (smoke: no timing)" if a.smoke else
                                            "median ms of triton.testing.do_bench"))
    print("| plan asked | model | training plan | inference ms | training ms | inference x | training x |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for plan, name, used, ti, tt, ri, rt in rows:
        print(f"| {plan} | {name} | {used} | {ti:.3f} | {tt:.3f} | {ri:.2f} | {rt:.2f} |")
    worst = max(r[6] for r in rows if r[0] == "default")
    print(f"training, default plans: noisy / noise-free = {worst:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
