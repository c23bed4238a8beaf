#!/usr/bin/env bash
# Call B (same lease, after run_a.sh built /tmp/b): the side by side on the 27B-class folder: the
# driver's defaults (3 measured passes), the driver on ORT's own ops (1), onnxruntime-genai's Generator
# and MtpGenerator (its single pass); 4 prompts x 256 new tokens after a warm-up.
set -u
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so ORT_MTP_CACHE_DIR=/tmp/tiles-cache
st e2e
timeout 575 python3 bench/e2e_27b.py --configurations ours,ort,genai --prompts 4 --new-tokens 256 --repetitions 3 --ort-repetitions 1 --skip-identity > $R/e2e.log 2>&1; echo "e2e rc $?" | tee -a $R/steps.log
grep -v "W:onnxruntime" $R/e2e.log | tail -30
st done
