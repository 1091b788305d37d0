#!/bin/bash
# On the device machine, from the repository root: bash bench/run_all.sh check|lif|build|full
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
python3 bench/bench_gpu.py "${1:-check}" 2>&1 | tee "${OUT:-/tmp}/bench_${1:-check}.log"
