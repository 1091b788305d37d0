"""The bench scripts run (small sizes, CPU): what the lead runs on a GPU or on the CI machine
does not break silently. Speed itself is measured by the scripts, never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    # a benchmark runs on the machine's own floating-point path (.ci/run sets ATen's scalar kernels for the
    # tests' numerics; Inductor's C++ code for some graphs does not compile under ATEN_CPU_CAPABILITY=default)
    env.pop("ATEN_CPU_CAPABILITY", None)
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_e2e_benchmark_smoke_run(tmp_path):
    """SpikingJelly's SEW-ResNet-18 and spiking VGG-11-BN with both neurons, one CPU step each."""
    out = _run(["bench/e2e_gpu.py", "--smoke", "--json", str(tmp_path / "r.jsonl")], tmp_path)
    rows = [ln for ln in out.splitlines() if ln.startswith("| sew_resnet18") or ln.startswith("| spiking_vgg11_bn")]
    assert len(rows) == 4, out
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 4


def test_cpu_training_benchmark_runs_and_checks_its_results(tmp_path):
    out = _run(["bench/cpu_train.py", "--T", "4", "--B", "2", "--N", "64", "--repeat", "2", "--threads", "1"],
               tmp_path)
    assert "one-time build of the CPU kernels" in out and out.count("x |") == 3, out


def test_cpu_compile_benchmark_smoke_run(tmp_path):
    """bench/cpu_compile.py at small sizes: the four variants of both networks train (their first losses
    agree: the script checks it) and the table has a row per network."""
    out = _run(["bench/cpu_compile.py", "--T", "3", "--B", "2", "--F", "6", "--H", "5", "--C", "3", "--threads", "1",
                "--repeat", "1", "--cold", "none"], tmp_path)
    assert out.count("| 1 |") == 2 and "compiled / eager flexdsl" in out, out


def test_noise_benchmark_smoke_run(tmp_path):
    """bench/noise_gpu.py on the CPU (Triton's interpreter): its checks pass and it prints its table."""
    out = _run(["bench/noise_gpu.py", "--smoke"], tmp_path)
    assert out.count("| lif + sigma*randn() |") == 3 and "noisy / noise-free" in out, out
