"""Host time of flexdsl's Triton path per layer, eager against torch.compile (default mode), on
any machine: the kernels' launches are replaced by a stand-in that reads every argument (what
Triton's launcher does on a GPU) and launches nothing, so what is timed is what runs on the host
per layer and step (module code, autograd, the custom ops' dispatch, argument preparation and
launch plans, the compiled graph's own wrapper).

    python bench/host_overhead.py                 # 16 LIF layers on [4, 8, 16], training steps
    python bench/host_overhead.py --layers 32 --profile

On a CPU it runs the Triton backend through the interpreter's module (TRITON_INTERPRET=1, set
here); on a GPU machine the launch stand-in is the same, so the numbers compare hosts. A step is
`reset; forward; sum().backward()` through the stack.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import flexdsl  # noqa: E402
from flexdsl.backends.triton import kernel as K  # noqa: E402


def _no_launch(self, grid, full, key, device) -> None:
    """Kernel.launch_full without the launch: the compiled kernel's lookup and every argument read."""
    self.cache.get((self.warps, *key))
    for a in full:
        if isinstance(a, torch.Tensor):
            a.data_ptr()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="cProfile of the compiled steps (top 25 by own time)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    K.Kernel.launch_full = _no_launch
    net = nn.Sequential(*[flexdsl.load("lif", backend="triton") for _ in range(a.layers)])
    x = torch.rand(4, 8, 16, requires_grad=True)

    def step(model) -> None:
        for m in net:
            m.reset()
        x.grad = None
        model(x).sum().backward()

    compiled = torch.compile(net)
    print(f"torch {torch.__version__}, {a.layers} LIF layers (Triton path, launches replaced), {a.threads} thread(s)")
    for name, model in (("eager", net), ("torch.compile (default)", compiled)):
        for _ in range(5):
            step(model)
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step(model)
        dt = (time.perf_counter() - t0) / a.steps
        print(f"{name:24s} {dt * 1e6:8.0f} us a step, {dt * 1e6 / a.layers:6.1f} us a layer (forward + backward)")
    if a.profile:
        import cProfile
        import pstats

        with cProfile.Profile() as p:
            for _ in range(100):
                step(compiled)
        pstats.Stats(p).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
