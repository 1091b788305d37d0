"""Cold torch.compile of a small network with a flexdsl LIF: the first forward + backward in a
fresh process with empty caches, at several T (the time loop is one graph node, so the time
should not grow with T), and the recompilations when params or the grad mode change.

    python bench/compile_time.py [--T 25 100 1000] [--backends auto torch] [--mode default]

Network: Linear(64, 128) -> LIF -> Linear(128, 10), input [T, 32, 64], fp32, on the CPU
("auto" runs the CPU kernels there); the baseline "relu" is the same network with a ReLU, so
that the rows show what flexdsl adds to Inductor's own cold compile. Each (backend, T) runs in a new Python process with empty
FLEXDSL_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR; the time is from
`torch.compile` to the end of the first backward (what a user waits for), measured inside that
process. The same process then changes `tau` 20 times and switches the grad mode, counting the
graphs Dynamo compiles (`torch._dynamo.utils.counters["stats"]["unique_graphs"]`) against a
network without the neuron (Dynamo's own guard on the grad mode compiles one graph per mode).
Prints one table row per case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import torch
from torch import nn
from torch._dynamo.utils import counters
import flexdsl
backend, T, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
if backend == "relu":  # the baseline: the same network with a ReLU for the neuron
    lif = nn.ReLU()
    lif.reset = lambda: None
else:
    lif = flexdsl.load("lif", backend=backend)
net = nn.Sequential(nn.Linear(64, 128), lif, nn.Linear(128, 10))
x = torch.rand(T, 32, 64)
t0 = time.perf_counter()
cm = torch.compile(net, mode=None if mode == "default" else mode)
out = cm(x)
out.square().mean().backward()
first = time.perf_counter() - t0
t0 = time.perf_counter()
lif.reset()
cm(x).square().mean().backward()
second = time.perf_counter() - t0
counters.clear()
for i in range(20):
    if backend != "relu":
        lif.tau = 2.0 + 0.1 * i
    lif.reset()
    cm(x).square().mean().backward()
tau_graphs = counters["stats"]["unique_graphs"]
counters.clear()
for i in range(3):
    lif.reset()
    with torch.no_grad():
        cm(x)
    lif.reset()
    cm(x).square().mean().backward()
grad_graphs = counters["stats"]["unique_graphs"]
print(json.dumps({"first": first, "second": second, "tau_graphs": tau_graphs, "grad_graphs": grad_graphs}))
"""


def run(backend: str, T: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="flexdsl-compile-bench-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "FLEXDSL_CACHE_DIR": f"{tmp}/flexdsl", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
               "TRITON_CACHE_DIR": f"{tmp}/triton"}
        r = subprocess.run([sys.executable, "-c", CHILD, backend, str(T), mode], capture_output=True, text=True,
                           env=env, timeout=3600)
        if r.returncode != 0:
            raise SystemExit(f"{backend} T={T} failed:\n{r.stderr[-3000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[25, 100, 1000])
    ap.add_argument("--backends", nargs="+", default=["relu", "auto", "torch"],
                    help="flexdsl backends; relu: the baseline network with a ReLU instead of the LIF")
    ap.add_argument("--mode", default="default", help="torch.compile mode (default, reduce-overhead, ...)")
    a = ap.parse_args()
    import torch

    print(f"cold torch.compile (mode {a.mode}) of Linear->LIF->Linear, first fwd+bwd in a fresh process with "
          f"empty caches; torch {torch.__version__}, {os.cpu_count()} CPU cores")
    print("| backend | T | first fwd+bwd (s) | second (s) | graphs for 20 new tau | graphs for 3 grad-mode "
          "switches |")
    print("| --- | --- | --- | --- | --- | --- |")
    for backend in a.backends:
        for T in a.T:
            r = run(backend, T, a.mode)
            print(f"| {backend} | {T} | {r['first']:.1f} | {r['second']:.3f} | {r['tau_graphs']} | "
                  f"{r['grad_graphs']} (Dynamo: 1 per grad mode) |", flush=True)


if __name__ == "__main__":
    main()
