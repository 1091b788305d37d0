#!/bin/bash
# On the device machine, from the repository root (a clean clone works): bash bench/run_all.sh check|lif|build|full
# Wheels in .whl/ (e.g. spikingjelly, for a machine without it) are installed into /tmp/site first.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
python3 bench/bench_gpu.py "${1:-check}" 2>&1 | tee "${OUT:-/tmp}/bench_${1:-check}.log"
