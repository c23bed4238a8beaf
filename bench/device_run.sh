#!/usr/bin/env bash
# One device call for the CUDA kernels (bench/NOTES.md, "How to run on the device"): build, lint the
# machine code, smoke groups under compute-sanitizer memcheck, the full correctness check, then the
# GEMV benchmark. Each step is time-boxed (its own cap, and never past DEADLINE seconds after the
# start, default 570, so the device tool's 600 s limit is not hit); expected ~6 minutes in all. Run
# from the repository root after the ORT setup chunk:
#
#     source .device/cN/setup.sh && bash bench/device_run.sh
#
# Writes under $OUT: build.log, sass_lint.log, memcheck.log + check_cuda_ops_smoke_memcheck.json (+ _logs/),
# check.log + check_cuda_ops.json (+ _logs/), gemv.log + gemv.json, steps.log (seconds per step).
# Environment: BUILD (build folder, default /tmp/ortmtp), SKIP_MEMCHECK=1, SKIP_GEMV=1,
# GEMV_IMPLS (comma list for gemv.py --impls).
set -u
OUT=${OUT:-$PWD/bench/results/device_run}
BUILD=${BUILD:-/tmp/ortmtp}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
DEADLINE=${DEADLINE:-570}
step() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/steps.log"; }
# cap SECONDS: the step's time limit, cut to what is left before DEADLINE (at least 10 s).
cap() { local left=$(( DEADLINE - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 10 ? left : 10 )) || echo "$1"; }

step "build"
if ! { cmake -S . -B "$BUILD" -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
       && timeout "$(cap 240)" ninja -C "$BUILD"; } > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  step "build FAILED"
  exit 1
fi
export ORT_MTP_LIBRARY="$BUILD/libort_mtp_ops.so"

step "sass_lint (uniform registers read but never written: the error-715 pattern of run 1)"
timeout "$(cap 60)" python3 bench/sass_lint.py "$ORT_MTP_LIBRARY" > "$OUT/sass_lint.log" 2>&1
echo "sass_lint exit $? ($(tail -1 "$OUT/sass_lint.log"))"

if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  step "smoke groups under compute-sanitizer memcheck"
  timeout -k 5 "$(cap 150)" python3 bench/check_cuda_ops.py --smoke --sanitizer memcheck --group-timeout 50 \
    --groups smoke-mma,smoke-mma-cluster,smoke-simt > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"
  grep -E "^(PASS|FAIL) " "$OUT/memcheck.log"
fi

step "full check (every group in its own process)"
timeout -k 5 "$(cap 180)" python3 bench/check_cuda_ops.py --group-timeout 90 > "$OUT/check.log" 2>&1
echo "check exit $?"
sed -n '/^group /,$p' "$OUT/check.log"

if [ "${SKIP_GEMV:-0}" != 1 ]; then
  step "gemv benchmark"
  timeout -k 5 "$(cap 230)" python3 bench/gemv.py ${GEMV_IMPLS:+--impls "$GEMV_IMPLS"} > "$OUT/gemv.log" 2>&1
  echo "gemv exit $?"
  grep -E "^(ERROR|[a-z_]+: FAILED)" "$OUT/gemv.log" | cut -c1-300 | head -12
  sed -n '/^us per run/,$p' "$OUT/gemv.log"
fi
step "done"
