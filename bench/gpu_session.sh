#!/bin/bash
# On the device machine, from the repository root (a clean clone works):
#   bash bench/gpu_session.sh STEP...
#   STEP: check | check_save | harness | harness_old | recurrent | recurrent_old | recurrent_all | sew | sew_old | compile_ops | layers | delays | spread_check | conv_check | delays_net | delays_net_profile | delays_host | delays_profile | mlp_memory | memopt | e2e_memory | eprop | eprop_check | eprop_trace | eprop_example | plasticity | plastic_online | sparse | sparse_profile | keep_profile | recurrent_bits | recurrent_check | extra | noise | noise_check | profile | models | sweep | diag | diag16 | diagk | diagk128 | full
# flexdsl runs from this checkout. Wheels in .whl/ (e.g. spikingjelly, loguru, for a machine without them)
# are installed into /tmp/site first; `harness_old` and `recurrent_old` run a baseline checkout carried as .old/ (flexdsl/, grammar/, neurons/).
# Every script a step runs is in bench/; logs go to $OUT (default /tmp), one per step.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLEXDSL_CACHE_DIR=/tmp/flexdsl-cache
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee -a $OUT/session.log
for step in "$@"; do
  echo "=== $step" | tee -a $OUT/session.log
  case $step in
    check) timeout 420 python3 bench/bench_gpu.py check ;;
    check_save) FLEXDSL_TRITON_TRAINING=save timeout 300 python3 bench/bench_gpu.py check ;;
    sweep) timeout 500 python3 bench/sweep_rc.py ;;
    diag) timeout 300 python3 bench/diag_rc.py ;;
    diag16) timeout 300 python3 bench/diag_rc.py bfloat16 ;;
    diagk128) for k in 8 16; do DIAG_T=128 DIAG_MODELS=lif FLEXDSL_CHUNK=$k timeout 200 python3 bench/diag_rc.py; done ;;
    models) timeout 300 python3 bench/models_gpu.py ;;
    diagk) for k in 4 8 16; do FLEXDSL_CHUNK=$k timeout 200 python3 bench/diag_rc.py; done ;;
    full) timeout 560 python3 bench/bench_gpu.py full ;;
    harness) timeout 300 python3 bench/flexdsl_gpu.py ;;
    harness_old) PYTHONPATH=/tmp/site:$PWD/.old FLEXDSL_CACHE_DIR=/tmp/flexdsl-cache-old timeout 300 python3 bench/flexdsl_gpu.py ;;
    recurrent) timeout 280 python3 bench/recurrent_gpu.py --no-check --no-breakdown --reps 5 --peers hand ;;
    recurrent_old) PYTHONPATH=/tmp/site:$PWD/.old FLEXDSL_CACHE_DIR=/tmp/flexdsl-cache-old timeout 280 python3 bench/recurrent_gpu.py --no-check --no-breakdown --reps 5 --peers hand ;;
    layers) timeout 300 python3 bench/layers_gpu_check.py ;;
    delays) timeout 500 python3 bench/delays_gpu.py --check --recurrent ;;
    spread_check) timeout 200 python3 bench/delays_spread_check.py ;;
    conv_check) timeout 300 python3 bench/delays_conv_check.py --sweep ;;
    delays_net) timeout 300 python3 bench/delays_gpu.py --check ;;
    delays_net_profile) timeout 200 python3 bench/delays_profile.py ;;
    delays_host) timeout 200 python3 bench/delays_host_probe.py --profile ;;
    delays_profile) timeout 200 python3 bench/delays_rec_profile.py ;;
    mlp_memory) timeout 300 python3 bench/mlp_memory_gpu.py ;;
    memopt) timeout 550 python3 bench/memopt_gpu.py ;;
    e2e_memory) timeout 500 python3 bench/e2e_gpu.py --archs mlp8 spiking_vgg11_bn sew_resnet18 --libs sj memopt flexdsl flexdsl-bits zero --modes eager --dtypes fp32 ;;
    eprop) timeout 500 python3 bench/eprop_gpu.py ;;
    eprop_check) timeout 300 python3 bench/eprop_cuda_check.py ;;
    eprop_trace) timeout 300 python3 bench/eprop_trace.py && timeout 200 python3 bench/eprop_profile.py ;;
    plasticity) timeout 400 python3 bench/plasticity_gpu.py --online ;;
    plasticity_profile) timeout 300 python3 bench/plasticity_profile.py ;;
    plastic_online) timeout 500 python3 bench/plastic_online_gpu.py --sweep ;;
    recurrent_bits) timeout 300 python3 bench/recurrent_bits_gpu.py ;;
    sparse_profile) timeout 200 python3 bench/sparse_profile.py ;;
    keep_profile) timeout 500 python3 bench/keep_profile.py ;;
    sparse) timeout 300 python3 bench/sparse_gpu.py && FLEXDSL_SPARSE_DENSITY=1 timeout 250 python3 bench/sparse_gpu.py --rates 0.05,0.1,0.2 ;;
    eprop_example) for l in bptt eprop; do timeout 250 python3 examples/train_recurrent_digits.py --device cuda --learning $l | tail -3; done ;;
    compile_ops) timeout 300 python3 bench/compile_ops_gpu.py ;;
    recurrent_all) timeout 420 python3 bench/recurrent_gpu.py --no-check --no-breakdown --reps 5 ;;
    sew) timeout 400 python3 bench/e2e_gpu.py --archs sew_resnet18 --libs flexdsl --modes reduce-overhead default --dtypes fp32 ;;
    sew_old) PYTHONPATH=/tmp/site:$PWD/.old FLEXDSL_CACHE_DIR=/tmp/flexdsl-cache-old timeout 400 python3 bench/e2e_gpu.py --archs sew_resnet18 --libs flexdsl --modes reduce-overhead default --dtypes fp32 ;;
    recurrent_check) timeout 300 python3 bench/recurrent_gpu.py --check-only ;;
    extra) timeout 300 python3 bench/extra_gpu.py ;;
    noise) timeout 300 python3 bench/noise_gpu.py ;;
    noise_check) timeout 300 python3 bench/noise_cuda_check.py ;;
    profile) timeout 200 python3 bench/profile_overhead.py ;;
    *) echo "unknown step $step" ;;
  esac 2>&1 | tee -a $OUT/$step.log | grep -v "Warning\|warn("
done
