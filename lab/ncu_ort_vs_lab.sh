#!/usr/bin/env bash
# Lab run 42b (device): the tiles kernels' durations one kernel at a time (Nsight Compute serialises them:
# no overlap between launches), through ORT (bench/gemv.py, the chain) and in the lab (gemv_lab --profile),
# at M = 2 and 8. If ORT's kernels take longer alone, the M = 2..4 gap of lab run 42 is in the kernels
# (their data's placement); if not, it is between them. Caches and clocks left as they are.
# Run from the repository root after the ORT setup chunk:
#
#     source .device/cN/setup.sh && bash lab/ncu_ort_vs_lab.sh
set -u
OUT=${OUT:-$PWD/build/lab/ncu_ort_vs_lab}
BUILD=${BUILD:-/tmp/ortmtp}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
mkdir -p "$OUT" build/lab
{ cmake -S . -B "$BUILD" -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C "$BUILD" \
  && nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -I. -lineinfo -o build/lab/gemv_lab lab/gemv_lab.cu; } \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export ORT_MTP_LIBRARY="$BUILD/libort_mtp_ops.so"
args=(--cache-control none --clock-control none -k regex:GemvTilesKernel --metrics gpu__time_duration.sum --csv)
for M in 2 8; do
  "$NCU" "${args[@]}" --target-processes all -c 24 \
    python3 bench/gemv.py --impls ours_tiles --workloads chain --ms $M --no-copy-slots --out "$OUT/gemv_M$M" \
    > "$OUT/ort_M$M.csv" 2> "$OUT/ort_M$M.err"
  "$NCU" "${args[@]}" ./build/lab/gemv_lab --profile 24 4 $M 1 > "$OUT/lab_M$M.csv" 2> "$OUT/lab_M$M.err"
done
python3 - "$OUT" <<'EOF'
# Per source and M: each profiled kernel's grid and duration (us), in launch order.
import csv, io, sys
out = sys.argv[1]
for M in (2, 8):
    for src in ("ort", "lab"):
        text = open(f"{out}/{src}_M{M}.csv").read()
        lines = text[text.find('"ID"'):] if '"ID"' in text else ""
        rows = [r for r in csv.DictReader(io.StringIO(lines)) if r.get("Metric Name") == "gpu__time_duration.sum"]
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        got = [(r["Grid Size"], float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1.0)) for r in rows]
        print(f"{src} M={M}: " + " ".join(f"{g}:{d:.1f}" for g, d in got))
EOF
