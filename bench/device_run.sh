#!/usr/bin/env bash
# One run on the GPU machine for the CUDA kernels (results: bench/results/README.md): build, lint the
# machine code, the smoke correctness groups, the GEMV benchmark, the full correctness groups, the op
# fuzz cases on CUDA, then the M-dependent indexing of the tensor-core kernel under compute-sanitizer
# memcheck. Most important first, so that a cut-off run still has the correctness smoke and the
# timings. Each step is time-boxed (its own cap, and never past DEADLINE seconds after the start,
# default 460); expected ~6 minutes (build ~40 s, smoke ~40 s with 4 groups at a time, gemv ~180 s,
# full check ~40 s, op fuzz ~70 s (2 x 600 cases took 33-36 s per seed, 4 groups at a time), memcheck
# ~20 s). Run from the repository root on a machine with a CUDA GPU, nvcc 13 and onnxruntime-gpu:
#
#     bash bench/device_run.sh
#
# The correctness checks are the pytest tests under tests/gpu (one process per group; their
# conftest.py says more); on their own, on any machine with a CUDA GPU and pytest:
#
#     python -m pytest tests/gpu                                # every group
#     python -m pytest tests/gpu -k smoke --sanitizer memcheck  # under compute-sanitizer
#
# Writes under $OUT: build.log, sass_lint.log, gemv.log + gemv.json, and for each check step
# (check_smoke, check_full, check_fuzz, memcheck) <step>.log (pytest's output), <step>.xml (JUnit XML:
# a testcase per group, its failure message naming the failing cases, its cases / seconds / seed as
# properties) and <step>_logs/ (each group's <group>.log and <group>.json); steps.log (seconds per
# step). The output ends with the checks' per-group results, the GEMV table and the targets.
# Environment: BUILD (build folder, default /tmp/ortmtp), PREBUILT (a carried library, below), DEADLINE, SKIP_MEMCHECK=1, SKIP_GEMV=1,
# SKIP_FUZZ=1, GEMV_IMPLS (comma list for gemv.py --impls; default: ort, ort_fpa_intb, ours, ours_tiles),
# GPU_SEED (the checks' --gpu-seed; default from the clock, printed in each check log's header).
set -u
OUT=${OUT:-$PWD/bench/results/device_run}
BUILD=${BUILD:-/tmp/ortmtp}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
DEADLINE=${DEADLINE:-460}
step() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/steps.log"; }
# cap SECONDS: the step's time limit, cut to what is left before DEADLINE (at least 10 s).
cap() { local left=$(( DEADLINE - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 10 ? left : 10 )) || echo "$1"; }

source bench/device_library.sh  # device_library: the carried library (PREBUILT) when it loads, else a build
step "library"
if ! BUILD_TIMEOUT=$(cap 240) device_library "$BUILD" "$OUT/build.log"; then
  tail -40 "$OUT/build.log"
  step "build FAILED"
  exit 1
fi

step "sass_lint (uniform registers read but never written: the error-715 pattern, docs/kernels.md#launch-and-pdl; local memory)"
# The fp16 block-32 GEMV kernels (the 27B benchmark's) must not touch local memory: a stack frame
# cost ~6% on the chain (docs/kernels.md#multi-token-kernels).
timeout "$(cap 30)" python3 bench/sass_lint.py "$ORT_MTP_LIBRARY" \
  --no-local 'Gemv(Tiles|Stream)KernelI6__halfLi32E' > "$OUT/sass_lint.log" 2>&1
echo "sass_lint exit $? ($(tail -1 "$OUT/sass_lint.log"))"

# checks NAME CAP GROUP_TIMEOUT JOBS PYTEST_ARGS...: the tests/gpu groups PYTEST_ARGS select, JOBS at a
# time, as step NAME (files above). timeout's SIGTERM stops pytest cleanly: the XML keeps the groups
# that finished and the running groups' processes are killed.
checks() {
  local name=$1 limit=$2 group_timeout=$3 jobs=$4; shift 4
  COLUMNS=250 timeout -k 5 "$(cap "$limit")" python3 -m pytest tests/gpu -v -rA -p no:cacheprovider \
    --gpu-jobs "$jobs" --group-timeout "$group_timeout" ${GPU_SEED:+--gpu-seed "$GPU_SEED"} \
    --junitxml "$OUT/$name.xml" --gpu-logs "$OUT/${name}_logs" "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $? ($(tail -1 "$OUT/$name.log"))"
}
if ! python3 -c "import pytest" 2> /dev/null; then
  echo "pytest is not installed: the correctness checks (tests/gpu) are skipped"
  SKIP_CHECKS=1
fi

if [ "${SKIP_CHECKS:-0}" != 1 ]; then
  step "smoke check (one process per kernel path)"
  checks check_smoke 100 80 4 -k "smoke or copy_slots"
fi

if [ "${SKIP_GEMV:-0}" != 1 ]; then
  step "gemv benchmark"
  timeout -k 5 "$(cap 230)" python3 bench/gemv.py ${GEMV_IMPLS:+--impls "$GEMV_IMPLS"} > "$OUT/gemv.log" 2>&1
  echo "gemv exit $?"
fi

if [ "${SKIP_CHECKS:-0}" != 1 ]; then
  step "full check (random cases, decode-consistency, CUDA graph)"
  checks check_full 100 90 4 -k "not smoke and not copy_slots and not op_fuzz"
  if [ "${SKIP_FUZZ:-0}" != 1 ]; then
    step "op fuzz on CUDA (tests/op_fuzz.py's cases: exact or ORT's error, never a crash)"
    checks check_fuzz 90 85 2 -k op_fuzz
  fi
  if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
    step "memcheck: tensor-core kernels, small cases (tokens past M, row ranges, activation copies)"
    checks memcheck 90 85 3 -k "[smoke-mma] or [smoke-mma-kparts] or [smoke-tiles]" --sanitizer memcheck
  fi
fi
step "done"

echo "---- summary"
for f in check_smoke check_full check_fuzz memcheck; do
  [ -f "$OUT/$f.log" ] && { echo "[$f]"; sed -n '/short test summary info/,$p' "$OUT/$f.log" | cut -c1-400; }
done
if [ -f "$OUT/gemv.log" ]; then
  grep -E "^(ERROR|[a-z_0-9]+: FAILED|check )" "$OUT/gemv.log" | cut -c1-220 | head -20
  sed -n '/^us per run/,$p' "$OUT/gemv.log"
fi
