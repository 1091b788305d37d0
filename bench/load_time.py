"""Cold and warm load time of library models on the CPU (issue: cold lif < 0.5 s, warm < 20 ms).

    python bench/load_time.py [stem ...]

Each stem is measured in a fresh process: `import flexdsl, torch, sympy` first (not counted),
then the first `flexdsl.load(stem)` (cold: parse, check, lower, emit, exec), a second load of
the same model (warm, from the in-process cache), and the symbolic backward (`.backward`).
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch, sympy, lark, flexdsl
import flexdsl.module, flexdsl.compiler
stem = sys.argv[1]
t0 = time.perf_counter(); m = flexdsl.load(stem); t1 = time.perf_counter()
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
        out = subprocess.run([sys.executable, "-c", CHILD, s], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'model':22s} {'cold load':>10s} {'warm load':>10s} {'backward':>10s} {'fwd/bwd SSA':>12s}")
    for r in rows:
        print(f"{r['stem']:22s} {r['cold_ms']:8.1f}ms {r['warm_ms']:8.2f}ms {r['backward_ms']:8.1f}ms "
              f"{r['n_fwd']:5d}/{r['n_bwd']:<5d}")


if __name__ == "__main__":
    main(sys.argv[1:])
