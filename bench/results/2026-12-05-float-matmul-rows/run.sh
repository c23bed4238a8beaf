#!/usr/bin/env bash
# ort_mtp::MatMul on CUDA with one one-row pass per row up to M = 8, one device call after the setup chunks:
#   source .device/c10/setup.sh && bash bench/results/2026-12-05-float-matmul-rows/run.sh   (carry .device/c10, .devlib)
# The float-matmul GPU group (width M bit-identical to M width-1 calls, against the CPU op) with the new
# library, then bench/float_matmul.py with the library before the change (.devlib/before.so.xz) and after
# it (.devlib/libort_mtp_ops.so.xz), each in its own process.
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start fm
st group
timeout 90 python3 -m pytest tests/gpu -k "float-matmul" -v -rA --gpu-logs $R/group_logs > $R/group.log 2>&1; echo "group rc $?" | tee -a $R/steps.log
tail -2 $R/group.log | cut -c1-250; grep -h "cases, " $R/group_logs/*.log | cut -c1-200; pack
mkdir -p /tmp/before && xz -dc .devlib/before.so.xz > /tmp/before/libort_mtp_ops.so
for which in before after; do
  st bench $which
  lib=$ORT_MTP_LIBRARY; [ $which = before ] && lib=/tmp/before/libort_mtp_ops.so
  mkdir -p $R/$which
  ORT_MTP_LIBRARY=$lib timeout 90 python3 bench/float_matmul.py --out $R/$which > $R/bench_$which.log 2>&1; echo "bench $which rc $?" | tee -a $R/steps.log
  grep -v "W:onnxruntime" $R/bench_$which.log | tail -16 | cut -c1-200; pack
done
st done
pack
