#!/usr/bin/env bash
# ort_mtp::SkipSimplifiedLayerNormalization on CUDA (programmatic dependent launch), H200, after the device
# setup chunks, one call:
#   bash bench/results/2026-12-05-skip-norm-cuda/run.sh
# the skip-norm GPU group, the same under memcheck, bench/e2e_27b.py with and without the norm rewrite
# (one process), the kernel profile, the op fuzz (its norm cases on the CUDA kernel). The library: the one
# carried in .devlib when it loads, else built here (bench/device_library.sh). Results come back as $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
# ORT_MTP_SKIP_NORM_CUDA=1: the CUDA kernel is registered only on request until this run has checked it.
export ORT_MTP_SKIP_NORM_CUDA=1
source bench/device_library.sh
device_run_start n  # R, st, pack, the GPU's clocks, the library
st skip-norm group
timeout 100 python3 -m pytest tests/gpu -k "skip-norm" -v -rA --gpu-logs $R/group_logs > $R/group.log 2>&1; echo "group rc $?" | tee -a $R/steps.log
grep -hE "^(ok|FAIL)" $R/group_logs/*.log | cut -c1-250
st skip-norm memcheck
timeout 100 python3 -m pytest tests/gpu -k "skip-norm" --sanitizer memcheck -v -rA --gpu-logs $R/memcheck_logs > $R/memcheck.log 2>&1; echo "memcheck rc $?" | tee -a $R/steps.log
tail -2 $R/memcheck.log | cut -c1-300; pack
st e2e with and without the norm rewrite, 256 new tokens
OUT=$R timeout 380 python3 bench/e2e_27b.py --configurations ours,ours_nonorm --prompts 4 --new-tokens 256 --repetitions 2 > $R/e2e_ab.log 2>&1; echo "e2e ab rc $?" | tee -a $R/steps.log
mv $R/e2e_27b.json $R/e2e_ab.json 2>/dev/null; grep -v "W:onnxruntime" $R/e2e_ab.log | tail -14; pack
st kernel profile
OUT=$R timeout 90 python3 bench/kernel_profile_27b.py --json profile.json > $R/profile.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
grep -E "GPU kernels|^  [a-z]" $R/profile.log | cut -c1-150
st op fuzz
timeout 110 python3 -m pytest tests/gpu -k op_fuzz --gpu-jobs 2 -v -rA --gpu-logs $R/fuzz_logs > $R/fuzz.log 2>&1; echo "fuzz rc $?" | tee -a $R/steps.log
sed -n '/short test summary/,$p' $R/fuzz.log | cut -c1-300 | tail -4; grep -h "^FAIL" $R/fuzz_logs/*.log | cut -c1-250 | head -8
st done
pack
