#!/usr/bin/env bash
# One call: build; the float-matmul GPU group (now with the two-weight node and programmatic dependent
# launch); the driver's defaults end to end (the a and b projections of each layer in one two-weight
# ort_mtp::MatMul) with the width-4 identity check; the kernel profile.
set -u
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.txt 2>&1
st build
( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && timeout 330 ninja -C /tmp/b -j16 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so ORT_MTP_CACHE_DIR=/tmp/tiles-cache
st fm-group
timeout 60 python3 -m pytest tests/gpu -k float-matmul -v -rA --gpu-logs $R/fm_logs > $R/fm_group.log 2>&1; echo "fm group rc $?" | tee -a $R/steps.log
grep -E "passed|failed" $R/fm_group.log | tail -3
st e2e
timeout 150 python3 bench/e2e_27b.py --configurations ours --prompts 4 --new-tokens 128 > $R/e2e.log 2>&1; echo "e2e rc $?" | tee -a $R/steps.log
grep -v "W:onnxruntime" $R/e2e.log | tail -9
st profile
timeout 80 python3 bench/kernel_profile_27b.py > $R/kernel_profile.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
grep -v "W:onnxruntime" $R/kernel_profile.log | head -22
st done
