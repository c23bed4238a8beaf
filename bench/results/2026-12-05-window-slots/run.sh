#!/usr/bin/env bash
# On the device after the setup chunks, one call:  bash bench/results/2026-12-05-window-slots/run.sh
# 1. The skip-norm GPU group again (ORT_MTP_SKIP_NORM_CUDA=1), plain and under memcheck: its hidden-size
#    limit was lowered to 12280 after its only GPU run (bench/results/2026-12-05-skip-norm-cuda) and not run since.
# 2. The 27B-class folder without an exported window, then slots_probe.py on CUDA.
# A second call, `bash bench/results/2026-12-05-window-slots/run.sh profile`: width_profile.py on that folder
# (built again on a fresh machine).
# The library: the carried .devlib build when it loads (bench/device_library.sh). Results: $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
if [ "${1:-}" = profile ]; then
  device_run_start p
  st build the 27B-class folder without a window
  [ -f /tmp/m27w0/genai_config.json ] || timeout 120 python3 -m models build --preset qwen35-27b --out /tmp/m27w0 --precision int4 --ep cuda --state-window 0 --overwrite > $R/build27.log 2>&1
  st width profile
  timeout 300 python3 bench/results/2026-12-05-window-slots/width_profile.py --model /tmp/m27w0 --out $R/width_profile.json > $R/width_profile.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
  grep -v "W:onnxruntime" $R/width_profile.log | tail -16 | cut -c1-200
  st done
  pack
  exit 0
fi
device_run_start s
st skip-norm group
ORT_MTP_SKIP_NORM_CUDA=1 timeout 100 python3 -m pytest tests/gpu -k "skip-norm" -v -rA --gpu-logs $R/group_logs > $R/group.log 2>&1; echo "group rc $?" | tee -a $R/steps.log
grep -hE "^(ok|FAIL)" $R/group_logs/*.log | cut -c1-250; tail -2 $R/group.log | cut -c1-300
st skip-norm memcheck
ORT_MTP_SKIP_NORM_CUDA=1 timeout 100 python3 -m pytest tests/gpu -k "skip-norm" --sanitizer memcheck -v -rA --gpu-logs $R/memcheck_logs > $R/memcheck.log 2>&1; echo "memcheck rc $?" | tee -a $R/steps.log
tail -2 $R/memcheck.log | cut -c1-300; pack
st build the 27B-class folder without a window
timeout 120 python3 -m models build --preset qwen35-27b --out /tmp/m27w0 --precision int4 --ep cuda --state-window 0 --overwrite > $R/build27.log 2>&1; echo "build rc $?" | tee -a $R/steps.log
st slots probe
timeout 330 python3 bench/results/2026-12-05-window-slots/slots_probe.py --model /tmp/m27w0 --provider cuda --reps 40 --out $R/cuda.json > $R/probe.log 2>&1; echo "probe rc $?" | tee -a $R/steps.log
grep -v "W:onnxruntime" $R/probe.log | tail -5 | cut -c1-600
st done
pack
