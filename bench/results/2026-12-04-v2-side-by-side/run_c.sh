#!/usr/bin/env bash
# Call B (same warm lease, after run_a.sh built /tmp/b): the 27B-class end to end on the defaults
# (our GroupQueryAttention, the tiles cache), with per-phase ms per round, then the kernel profile.
set -u
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so ORT_MTP_CACHE_DIR=/tmp/tiles-cache
st e2e
timeout 420 python3 bench/e2e_27b.py --configurations ours --prompts 4 --new-tokens 256 --phases > $R/e2e.log 2>&1; echo "e2e rc $?" | tee -a $R/steps.log
tail -12 $R/e2e.log
st profile
timeout 150 python3 bench/kernel_profile_27b.py > $R/kernel_profile.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
tail -30 $R/kernel_profile.log
st done
