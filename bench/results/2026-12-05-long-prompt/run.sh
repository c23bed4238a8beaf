#!/usr/bin/env bash
# Prepared 2026-12-05, not yet run (no device was lent after it was written): time to first token on long
# prompts, ours against the driver on ONNX Runtime's own ops, on the 27B-class folder. Why: our
# ort_mtp::MatMulNBits streams the weights once per 16 rows (docs/kernels.md, Limits), so a prefill of M
# tokens pays ceil(M / 16) weight passes, where ORT's com.microsoft::MatMulNBits can dequantize once and
# run a tensor-core GEMM. At 64 tokens ours is the faster (H200, 2026-12-05-mlp-cuda: 37.0 against 47.6 ms);
# predicted: near 1x at 256-512 tokens, ours several times slower at 2048 (~0.9 s against ~0.2-0.3 s, a
# guess from the 64-token figure and the GEMM's FLOPs, not measured). On the CPU ours is the faster at every
# length (README.md here).
# On the device, after the setup chunks, one call:
#   bash bench/results/2026-12-05-long-prompt/run.sh ttft   # e2e_27b.py --configurations ours,ort at prompt
#       lengths 512 and 2048, 2 prompts, 16 new tokens, 1 repetition (~5 min with the folder built)
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start $1
case $1 in
  ttft)
    for length in 512 2048; do
      st ttft at prompt length $length
      OUT=$R/p$length timeout 280 python3 bench/e2e_27b.py --configurations ours,ort --prompts 2 \
        --prompt-length $length --new-tokens 16 --repetitions 1 --skip-identity > $R/p$length.log 2>&1
      echo "e2e $length rc $?" | tee -a $R/steps.log
      grep -v "W:onnxruntime" $R/p$length.log | grep -E "greedy|mtp_k3" | cut -c1-160
      pack
    done ;;
  *) echo "stage must be ttft"; exit 2 ;;
esac
st done
pack
