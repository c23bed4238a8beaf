#!/usr/bin/env bash
# The state window the driver adds in memory (ops.state_window, aac2226) on CUDA, H200, after the device
# setup chunks, one call:
#   bash bench/results/2026-12-05-window-in-memory-cuda/run.sh
# bench/driver_cuda_check.py on the tiny and small presets (the tiny folder exported without a window:
# MTP == greedy with CUDA graphs, promote commits, the MTP session's W), then bench/e2e_27b.py, ours only,
# on the 27B-class folder built without a window and with W=5 (the README's), one after the other on the
# same machine. The library: the one carried in .devlib when it loads, else built here
# (bench/device_library.sh). Results come back as $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start w  # R, st, pack, the GPU's clocks, the library
st driver check
timeout 150 python3 bench/driver_cuda_check.py run --presets tiny,small --fixtures /tmp/no-genai-fixtures --out $R \
  > $R/driver_check.log 2>&1; echo "driver check rc $?" | tee -a $R/steps.log
grep -E "^\S.*\[(eager|graphs)\]|mtp_k" $R/driver_check.log | cut -c1-220; pack
for W in 0 5; do
  st e2e 27B folder with state_window $W, ours, 256 new tokens
  OUT=$R timeout 190 python3 bench/e2e_27b.py --folder /tmp/q27_w$W --state-window $W --configurations ours \
    --prompts 4 --new-tokens 256 --repetitions 1 --skip-identity > $R/e2e_w$W.log 2>&1; echo "e2e W=$W rc $?" | tee -a $R/steps.log
  mv $R/e2e_27b.json $R/e2e_w$W.json 2>/dev/null; grep -v "W:onnxruntime" $R/e2e_w$W.log | tail -8; pack
  rm -rf /tmp/q27_w$W
done
st done
pack
