#!/usr/bin/env bash
# The slot promotion as a direct call of CopySlots' copy (ops.copy_slots.RangeCopier, no ORT run) and
# GdnKernel's two alternating state stages (one block barrier per stored token instead of two), on the
# device, after the setup chunks, one call per stage:
#   bash bench/results/2026-12-05-direct-promote/run.sh a   # GPU groups copy_slots and gated-delta-net
#       (width S bit-identical to S width-1 calls, three column counts); bench/gated_delta_net.py with the
#       library before (.devlib/before.so.xz) and after (.devlib/libort_mtp_ops.so.xz), separate processes
#   bash bench/results/2026-12-05-direct-promote/run.sh b   # end to end before (HEAD's Python,
#       .devlib/before_py.tgz, with the before library) and after (this tree), each its own process, on
#       e2e_27b.py's default folder (the qwen35-27b preset, state_window 5; the first run builds it)
#   bash bench/results/2026-12-05-direct-promote/run.sh c   # the side by side at this tree: ours, ORT's own
#       ops, onnxruntime-genai (regenerates the README's table when run on an H200)
#   bash bench/results/2026-12-05-direct-promote/run.sh d   # as b, for a Python-only change: the same
#       library (.devlib/libort_mtp_ops.so.xz) before (.devlib/before_py.tgz) and after (this tree), no --phases
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start $1
[ "$1" = a ] || [ "$1" = b ] && mkdir -p /tmp/before && xz -dc .devlib/before.so.xz > /tmp/before/libort_mtp_ops.so
if [ "$1" = a ]; then
  st groups
  timeout 200 python3 -m pytest tests/gpu -k "copy_slots or gated-delta-net" --gpu-jobs 4 -v -rA --gpu-logs $R/group_logs > $R/group.log 2>&1; echo "groups rc $?" | tee -a $R/steps.log
  tail -6 $R/group.log | cut -c1-250; grep -h "^FAIL\|direct" $R/group_logs/*.log | cut -c1-200 | head -12; pack
  for which in before after; do
    st gdn bench $which
    lib=$ORT_MTP_LIBRARY; [ $which = before ] && lib=/tmp/before/libort_mtp_ops.so
    mkdir -p $R/gdn_$which
    ORT_MTP_LIBRARY=$lib timeout 120 python3 bench/gated_delta_net.py --out $R/gdn_$which > $R/gdn_$which.log 2>&1; echo "gdn $which rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/gdn_$which.log | tail -10 | cut -c1-200; pack
  done
elif [ "$1" = b ] || [ "$1" = d ]; then
  # Two Generators of different builds in one process are biased toward the later-created one
  # (bench/results/2026-12-05-cpu-draft-cache/order_bias.py): one process each.
  mkdir -p /tmp/before_py && tar -C /tmp/before_py -xzf .devlib/before_py.tgz
  phases=--phases; [ $1 = d ] && phases=  # d: no profiled pass, to fit what was left of the device time
  for which in before after; do
    st e2e $which
    dir=$PWD; lib=$ORT_MTP_LIBRARY
    [ $which = before ] && dir=/tmp/before_py && [ $1 = b ] && lib=/tmp/before/libort_mtp_ops.so
    (cd $dir && OUT=$R ORT_MTP_LIBRARY=$lib timeout 260 python3 bench/e2e_27b.py --configurations ours \
      --prompts 4 --new-tokens 256 --repetitions 2 --skip-identity $phases) > $R/e2e_$which.log 2>&1; echo "e2e $which rc $?" | tee -a $R/steps.log
    mv $R/e2e_27b.json $R/e2e_$which.json 2>/dev/null
    grep -v "W:onnxruntime" $R/e2e_$which.log | tail -12 | cut -c1-300; pack
  done
else
  st side by side
  OUT=$R timeout 585 python3 bench/e2e_27b.py --configurations ours,ort,genai --prompts 4 --new-tokens 256 \
    --repetitions 3 --ort-repetitions 1 --phases --skip-identity > $R/e2e.log 2>&1; echo "e2e rc $?" | tee -a $R/steps.log
  grep -v "W:onnxruntime" $R/e2e.log | tail -24
fi
st done
pack
