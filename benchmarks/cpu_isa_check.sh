#!/usr/bin/env bash
# `--preset auto` and bf16 training on one large x86 CPU under each instruction set oneDNN (torch's bf16 products on
# a CPU) may use, side by side, each benchmark on 2 pinned cores of its own (10 cores in all):
#   - `bench_auto_cpu` (auto's choice for an hour, its probes, then the run's speed beside the probe's estimate)
#     with oneDNN native (AMX where the CPU has it), held to AVX512_CORE_BF16 (AVX512-BF16 without AMX) and to
#     AVX512_CORE (AVX-512 without bf16 instructions);
#   - `bench_autocast --profile` (bf16 against fp32, and where each spends its time) native and AVX512_CORE_BF16.
# The corpus split must be prepared under $DATA/$CORPUS first (`python -m benchmarks.bench_probe --corpus sotu`
# prepares bench-out/probe/sotu; `make corpora` fetches the text). Logs and results go to $OUT.
#
#     ELMO_BENCH_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/cpu_isa_check.sh
set -u
OUT=${OUT:-bench-out/isa}
DATA=${DATA:-bench-out/probe}
CORPUS=${CORPUS:-sotu}
RUN_SECONDS=${RUN_SECONDS:-180}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

job() {  # CORES CAP NAME MODULE ARGS...: one benchmark in the background on CORES, oneDNN held to CAP
  local cores=$1 cap=$2 name=$3
  shift 3
  if [ "$cap" = native ]; then
    taskset -c "$cores" env -u ONEDNN_MAX_CPU_ISA "$PY" -m "$@" > "$OUT/$name.log" 2>&1 &
  else
    ONEDNN_MAX_CPU_ISA=$cap taskset -c "$cores" "$PY" -m "$@" > "$OUT/$name.log" 2>&1 &
  fi
}

k=0
for cap in native AVX512_CORE_BF16 AVX512_CORE; do
  job "$((2 * k)),$((2 * k + 1))" "$cap" "auto-$cap" benchmarks.bench_auto_cpu --corpus "$CORPUS" --out "$DATA" \
    --run-seconds "$RUN_SECONDS" --label "$cap-$CORPUS"
  k=$((k + 1))
done
for cap in native AVX512_CORE_BF16; do
  job "$((2 * k)),$((2 * k + 1))" "$cap" "autocast-$cap" benchmarks.bench_autocast --corpus "$CORPUS" --out "$DATA" \
    --seconds 8 --repeats 2 --profile 4 --label "$cap-$CORPUS"
  k=$((k + 1))
done
wait
cp benchmarks/results/auto-cpu-*-"$CORPUS"-*.json benchmarks/results/autocast-*-"$CORPUS"-*.json "$OUT/" 2>/dev/null
tail -n 4 "$OUT"/*.log
echo "cpu checks done in $SECONDS s"
