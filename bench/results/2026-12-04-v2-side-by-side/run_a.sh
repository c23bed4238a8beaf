#!/usr/bin/env bash
# Call A: build; the GatedDeltaNet v2 GPU groups under compute-sanitizer memcheck and racecheck
# (v2's first sanitizer runs: it uses cp.async, thread-block clusters with distributed shared memory,
# and programmatic dependent launch).
set -u
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.txt 2>&1
st build
( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && timeout 400 ninja -C /tmp/b -j16 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so
for tool in memcheck racecheck; do
  st gdn-$tool
  timeout 120 python3 -m pytest tests/gpu -k gated-delta-net --gpu-jobs 3 --sanitizer $tool -v -rA --gpu-logs $R/gdn_${tool}_logs > $R/gdn_$tool.log 2>&1; echo "gdn $tool rc $?" | tee -a $R/steps.log
  grep -E "passed|failed|ERROR SUMMARY|RACECHECK SUMMARY" $R/gdn_$tool.log | tail -6
done
st done
