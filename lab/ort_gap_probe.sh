#!/usr/bin/env bash
# Lab run 42 (device): why the chain runs slower through ONNX Runtime than in lab/gemv_lab.cu (device
# run 18 against the lab: +1.6% at M=1, +3-4% at M=2..4, none at M=8; lab/NOTES.md, version 3.5).
# In one call: the lab's chain (the same kernels without ORT), then bench/gemv.py on the chain alone
# (ours_tiles and ORT's default), as always and with --prefill (the GPU kept busy while the host queues
# each sample's calls: if that is faster, the host's pace was in the measurement), and the host's time
# per session.run call. Run from the repository root after the ORT setup chunk:
#
#     source .device/cN/setup.sh && bash lab/ort_gap_probe.sh
#
# Writes under $OUT: build.log, lab.log, plain/ and prefill/ (gemv.py's JSON and log).
set -u
OUT=${OUT:-$PWD/build/lab/ort_gap_probe}
BUILD=${BUILD:-/tmp/ortmtp}
mkdir -p "$OUT/plain" "$OUT/prefill" build/lab
export PYTHONUNBUFFERED=1
if ! { cmake -S . -B "$BUILD" -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
       && ninja -C "$BUILD" \
       && nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -I. -lineinfo -o build/lab/gemv_lab lab/gemv_lab.cu; } \
     > "$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"
  exit 1
fi
export ORT_MTP_LIBRARY="$BUILD/libort_mtp_ops.so"

echo "== the lab's chain (tiles kernel, k1)"
LAB_KERNELS=1 LAB_NO_BALANCE=1 ./build/lab/gemv_lab > "$OUT/lab.log" 2>&1
grep "^24" "$OUT/lab.log"
for mode in plain prefill; do
  echo "== gemv.py, the chain, $mode"
  python3 bench/gemv.py --impls ours_tiles,ort --workloads chain --ms 1,2,4,8 --no-copy-slots --out "$OUT/$mode" \
    $([ $mode = prefill ] && echo --prefill) > "$OUT/$mode/gemv.log" 2>&1
  echo "gemv exit $?"
done
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
runs = {m: json.load(open(f"{out}/{m}/gemv.json")) for m in ("plain", "prefill")}
for m, r in runs.items():
    print(f"{m}: copy ceiling {r['copy_ceiling_GBps']:.0f} GB/s; errors {len(r['errors'])}")
print(f"{'impl':12} {'M':>3} {'plain us':>9} {'prefill us':>11} {'host us/call':>13}")
for impl in runs["plain"]["results"]:
    for M, e in runs["plain"]["results"][impl]["workloads"]["chain"]["M"].items():
        p = runs["prefill"]["results"][impl]["workloads"]["chain"]["M"][M]
        print(f"{impl:12} {M:>3} {1e6 * e['seconds']:9.1f} {1e6 * p['seconds']:11.1f} "
              f"{1e6 * e['host_seconds_per_call']:13.1f}")
EOF
