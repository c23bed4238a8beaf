#!/usr/bin/env bash
# GatedDeltaNet's FinishKernel triggering the next launch at its top (ORT_MTP_GDN_FINISH_TRIGGER=1), H200,
# after the device setup chunks, one call:
#   bash bench/results/2026-12-05-gdn-finish-trigger-cuda/run.sh
# the gated-delta-net GPU group with the trigger (against the CPU op, width S against S width-1 calls,
# in place, CUDA graph), then bench/e2e_27b.py, ours, without, with and again without it: processes one
# after the other on the same machine and folder (the switch is read once per process; the first also
# builds the 27B-class folder). The library: the one
# carried in .devlib when it loads, else built here (bench/device_library.sh). Results: $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start t  # R, st, pack, the GPU's clocks, the library
st gated-delta-net group with the trigger
ORT_MTP_GDN_FINISH_TRIGGER=1 timeout 90 python3 -m pytest tests/gpu -k "gated-delta-net and not cols" -v -rA --gpu-logs $R/group_logs \
  > $R/group.log 2>&1; echo "group rc $?" | tee -a $R/steps.log
grep -hE "^(ok|FAIL)" $R/group_logs/*.log | cut -c1-250; pack
LIMIT=170 I=0
for T in 0 1 0; do
  I=$((I + 1)); N=e2e_$I-trigger$T
  st e2e ours, ORT_MTP_GDN_FINISH_TRIGGER=$T, 256 new tokens
  ORT_MTP_GDN_FINISH_TRIGGER=$T OUT=$R timeout $LIMIT python3 bench/e2e_27b.py --configurations ours --prompts 4 \
    --new-tokens 256 --repetitions 1 --skip-identity > $R/$N.log 2>&1; echo "$N rc $?" | tee -a $R/steps.log
  mv $R/e2e_27b.json $R/$N.json 2>/dev/null; grep -v "W:onnxruntime" $R/$N.log | grep "tok/s" | cut -c1-150; pack
  LIMIT=120
done
st done
pack
