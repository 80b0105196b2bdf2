#!/usr/bin/env bash
# The GPU checks in one command on a GPU machine: the CUDA tests, then `bench_gpu` in what is left of LIMIT
# seconds (default 570), every part of it saved as it ends. Logs and the results file go to $OUT (default
# bench-out/gpu). Needs torch with CUDA and elmo-cli's dependencies (pyproject.toml); nothing is installed (the
# tree is put on PYTHONPATH). In a copy of the tree on another machine, give the commit it was made from:
# ELMO_BENCH_COMMIT=abc1234. TESTS narrows the tests (a pytest -k expression); the arguments after LIMIT go to
# bench_gpu.
#
#     ELMO_BENCH_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_check.sh 570 [--parts steps profile]
set -u
LIMIT=${1:-570}
shift || true
OUT=${OUT:-bench-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.txt"
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
'gpu', torch.cuda.get_device_name(), 'cpu threads', torch.get_num_threads())" | tee -a "$OUT/nvidia-smi.txt"
timeout -s INT $((LIMIT * 2 / 5)) $PY -m pytest -q -p no:cacheprovider --durations=8 tests/test_cuda.py \
  ${TESTS:+-k "$TESTS"} 2>&1 | tee "$OUT/test_cuda.log"
BUDGET=$((LIMIT - SECONDS - 45))
echo "bench_gpu: --budget $BUDGET (started $SECONDS s into the check)"
$PY -m benchmarks.bench_gpu --budget "$BUDGET" "$@" 2>&1 | tee "$OUT/bench_gpu.log"
cp benchmarks/results/gpu-*.json "$OUT/" 2>/dev/null
echo "check done in $SECONDS s"; grep -E "passed|failed|error" "$OUT/test_cuda.log" | tail -3
