#!/usr/bin/env bash
# AttendKernel's (row, q head) pairs split over several blocks (a z grid dimension), H200, after the device
# setup chunks, one call:  bash bench/results/2026-12-05-attend-pairs/run.sh
# The GPU groups of the two ops that run the kernel (group-query-attention: width S bit-identical to S
# width-1 calls, against the CPU op; gated-attention), then width_profile.py with the library before the
# change (.devlib/before.so.xz) and after it (.devlib/libort_mtp_ops.so.xz), after it again with the GEMV's
# programmatic dependent launch off (ORT_MTP_GEMV_PDL=0), then slots_probe.py after it.
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start a
st groups
timeout 120 python3 -m pytest tests/gpu -k "group-query-attention or gated-attention" -v -rA --gpu-logs $R/group_logs > $R/group.log 2>&1; echo "groups rc $?" | tee -a $R/steps.log
tail -3 $R/group.log | cut -c1-250; grep -h "cases, " $R/group_logs/*.log | cut -c1-200; pack
st folder
[ -f /tmp/m27w0/genai_config.json ] || timeout 120 python3 -m models build --preset qwen35-27b --out /tmp/m27w0 --precision int4 --ep cuda --state-window 0 --overwrite > $R/build27.log 2>&1
mkdir -p /tmp/before && xz -dc .devlib/before.so.xz > /tmp/before/libort_mtp_ops.so
for which in before after; do
  st width profile $which
  lib=$ORT_MTP_LIBRARY; [ $which = before ] && lib=/tmp/before/libort_mtp_ops.so
  ORT_MTP_LIBRARY=$lib timeout 150 python3 bench/results/2026-12-05-window-slots/width_profile.py --model /tmp/m27w0 --out $R/width_profile_$which.json > $R/width_profile_$which.log 2>&1; echo "profile $which rc $?" | tee -a $R/steps.log
  grep -E "GPU kernel|attention \(ours\)" $R/width_profile_$which.log; pack
done
st width profile after, GEMV without programmatic dependent launch
# ORT_MTP_GEMV_PDL=0: the GEMV no longer lets the next kernel start early, so the a/b projections' MatMul
# and GdnKernel records hold their own time, not part of the GEMV's (FinishKernel still overlaps GdnKernel).
ORT_MTP_GEMV_PDL=0 timeout 150 python3 bench/results/2026-12-05-window-slots/width_profile.py --model /tmp/m27w0 --out $R/width_profile_after_nopdl.json > $R/width_profile_after_nopdl.log 2>&1; echo "profile no-pdl rc $?" | tee -a $R/steps.log
grep -v "W:onnxruntime" $R/width_profile_after_nopdl.log | tail -8; pack
st slots probe after
timeout 150 python3 bench/results/2026-12-05-window-slots/slots_probe.py --model /tmp/m27w0 --provider cuda --reps 30 --out $R/slots_after.json > $R/slots_after.log 2>&1; echo "probe rc $?" | tee -a $R/steps.log
tail -1 $R/slots_after.log | cut -c1-400
st done
pack
