#!/usr/bin/env bash
# One device call for the CUDA kernels (bench/NOTES.md, "How to run on the device"): build, lint the
# machine code, the smoke correctness groups, the GEMV benchmark, the full correctness groups, then
# the M-dependent indexing of the tensor-core kernel under compute-sanitizer memcheck. Most important
# first, so that a cut-off run still has the correctness smoke and the timings. Each step is time-boxed
# (its own cap, and never past DEADLINE seconds after the start, default 400); expected ~5.5 minutes
# (build ~40 s, smoke ~40 s with 4 groups at a time, gemv ~180 s, full check ~40 s, memcheck ~40 s).
# Run from the repository root after the ORT setup chunk:
#
#     source .device/cN/setup.sh && bash bench/device_run.sh
#
# Writes under $OUT: build.log, sass_lint.log, check_smoke.log + check_cuda_ops_smoke.json (+ _logs/),
# gemv.log + gemv.json, check_full.log + check_cuda_ops.json (+ _logs/), memcheck.log +
# check_cuda_ops_memcheck.json (+ _logs/), steps.log (seconds per step). The output ends with the check
# summaries, the GEMV table and the targets.
# Environment: BUILD (build folder, default /tmp/ortmtp), DEADLINE, SKIP_MEMCHECK=1, SKIP_GEMV=1,
# GEMV_IMPLS (comma list for gemv.py --impls; default: ort, ort_fpa_intb, ours, ours_tiles).
set -u
OUT=${OUT:-$PWD/bench/results/device_run}
BUILD=${BUILD:-/tmp/ortmtp}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
DEADLINE=${DEADLINE:-400}
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

step "sass_lint (uniform registers read but never written: the error-715 pattern of run 1; local memory)"
# The fp16 block-32 GEMV kernels (the 27B benchmark's) must not touch local memory (lab run 17).
timeout "$(cap 30)" python3 bench/sass_lint.py "$ORT_MTP_LIBRARY" \
  --no-local 'Gemv(Tiles|Stream)KernelI6__halfLi32E' > "$OUT/sass_lint.log" 2>&1
echo "sass_lint exit $? ($(tail -1 "$OUT/sass_lint.log"))"

step "smoke check (one process per kernel path)"
timeout -k 5 "$(cap 100)" python3 bench/check_cuda_ops.py --smoke --jobs 4 --group-timeout 80 > "$OUT/check_smoke.log" 2>&1
echo "smoke check exit $?"

if [ "${SKIP_GEMV:-0}" != 1 ]; then
  step "gemv benchmark"
  timeout -k 5 "$(cap 230)" python3 bench/gemv.py ${GEMV_IMPLS:+--impls "$GEMV_IMPLS"} > "$OUT/gemv.log" 2>&1
  echo "gemv exit $?"
fi

step "full check (random cases, decode-consistency, CUDA graph)"
timeout -k 5 "$(cap 100)" python3 bench/check_cuda_ops.py --groups matmul,decode,graph,graph-plain,decode-simt \
  --jobs 4 --group-timeout 90 > "$OUT/check_full.log" 2>&1
echo "full check exit $?"

if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  step "memcheck: tensor-core kernels, small cases (tokens past M, row ranges, activation copies)"
  timeout -k 5 "$(cap 90)" python3 bench/check_cuda_ops.py --groups smoke-mma,smoke-mma-kparts,smoke-tiles \
    --sanitizer memcheck --jobs 3 --group-timeout 85 > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"
fi
step "done"

echo "---- summary"
for f in check_smoke check_full memcheck; do
  [ -f "$OUT/$f.log" ] && { echo "[$f]"; sed -n '/^group /,$p' "$OUT/$f.log"; }
done
if [ -f "$OUT/gemv.log" ]; then
  grep -E "^(ERROR|[a-z_0-9]+: FAILED|check )" "$OUT/gemv.log" | cut -c1-220 | head -20
  sed -n '/^us per run/,$p' "$OUT/gemv.log"
fi
