#!/usr/bin/env bash
# End to end before and after the change, each in its own process (two Generators of different builds in
# one process are biased toward the later-created one: bench/results/2026-12-05-cpu-draft-cache/order_bias.py),
# on run.sh's folder (/tmp/m27w0, built there), after run.sh in the same lease:
#   bash bench/results/2026-12-05-attend-pairs/run2.sh
# bench/e2e_27b.py --configurations ours --prompts 4 --new-tokens 256 --repetitions 2 --skip-identity, the
# library before the change (.devlib/before.so.xz) then after it (.devlib/libort_mtp_ops.so.xz).
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start e2e
mkdir -p /tmp/before && xz -dc .devlib/before.so.xz > /tmp/before/libort_mtp_ops.so
for which in before after; do
  st e2e $which
  lib=$ORT_MTP_LIBRARY; [ $which = before ] && lib=/tmp/before/libort_mtp_ops.so
  ORT_MTP_LIBRARY=$lib timeout 220 python3 bench/e2e_27b.py --folder /tmp/m27w0 --configurations ours --prompts 4 \
    --new-tokens 256 --repetitions 2 --skip-identity > $R/e2e_$which.log 2>&1; echo "e2e $which rc $?" | tee -a $R/steps.log
  mv "$OUT/e2e_27b.json" $R/e2e_$which.json 2>/dev/null
  grep -v "W:onnxruntime" $R/e2e_$which.log | tail -12 | cut -c1-300; pack
done
st done
pack
