"""Cold and warm load time of library models on the CPU (issue: cold lif < 0.5 s, warm < 20 ms).

    python bench/load_time.py [stem ...]

Each stem is measured in fresh processes with an empty disk cache: `import flexdsl, torch, sympy`
first (not counted), then the first `flexdsl.load(stem)` (cold: parse, check, sympy lowering,
emit, exec), a second load of the same model (warm, in-process cache), and the
symbolic backward (`.backward`). A second process then loads the model from the disk cache
(no sympy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import torch, flexdsl
import flexdsl.runtime.module, flexdsl.runtime.compiler
stem = sys.argv[1]
if sys.argv[2] == "cold":
    import sympy, flexdsl.ir.lower, flexdsl.backends.torch.emit  # library imports are not the pipeline's work
t0 = time.perf_counter(); m = flexdsl.load(stem); t1 = time.perf_counter()
if sys.argv[2] == "disk":
    print(json.dumps({"disk_ms": (t1 - t0) * 1e3, "sympy": "sympy" in sys.modules}))
    raise SystemExit
m2 = flexdsl.load(stem); t2 = time.perf_counter()
bw = m.compiled.backward; t3 = time.perf_counter()
print(json.dumps({"stem": stem, "cold_ms": (t1 - t0) * 1e3, "warm_ms": (t2 - t1) * 1e3,
                  "backward_ms": (t3 - t2) * 1e3, "n_fwd": len(m.compiled.step.assignments),
                  "n_bwd": len(bw.assignments)}))
"""


def main(stems: list[str]) -> None:
    if not stems:
        import flexdsl

        stems = flexdsl.library()
    rows = []
    for s in stems:
        env = dict(os.environ, FLEXDSL_CACHE_DIR=tempfile.mkdtemp(prefix="flexdsl-bench-"))
        out = subprocess.run([sys.executable, "-c", CHILD, s, "cold"], capture_output=True, text=True, check=True,
                             env=env)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        out = subprocess.run([sys.executable, "-c", CHILD, s, "disk"], capture_output=True, text=True, check=True,
                             env=env)
        row.update(json.loads(out.stdout.strip().splitlines()[-1]))
        rows.append(row)
    print(f"{'model':22s} {'cold load':>10s} {'warm load':>10s} {'backward':>10s} {'fwd/bwd SSA':>12s} "
          f"{'disk-cached load (new process)':>32s}")
    for r in rows:
        print(f"{r['stem']:22s} {r['cold_ms']:8.1f}ms {r['warm_ms']:8.2f}ms {r['backward_ms']:8.1f}ms "
              f"{r['n_fwd']:5d}/{r['n_bwd']:<5d} {r['disk_ms']:14.1f}ms (sympy imported: {r['sympy']})")


if __name__ == "__main__":
    main(sys.argv[1:])
