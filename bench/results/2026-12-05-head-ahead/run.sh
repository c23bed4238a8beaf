#!/usr/bin/env bash
# Prepared 2026-12-05, run the same day on an H100 (README.md here has the results): Generator.head_ahead (8530894, and for
# sampling the commit after it), the next
# MTP round's first head forward queued before the accept's synchronisation on CUDA, so that the GPU
# runs it while the host decides the accept and commits. Predicted: the GPU's idle gap after each
# round's synchronisation (~0.1-0.2 ms of a ~10 ms k=3 round on the H100) mostly gone, less the head
# forward's wider M (k+1 rows instead of a+1: a few % of a ~0.4 ms head forward): +1-2% at k = 2..4.
# On the device, after the setup chunks, one call per stage, back to back:
#   bash bench/results/2026-12-05-head-ahead/run.sh check   # driver_cuda_check on tiny and small: MTP == greedy
#       (eager and graphs, k = 1..3 and replay) with head_ahead on, CUDA's default (run it first; revert
#       8530894 if it fails)
#   bash bench/results/2026-12-05-head-ahead/run.sh ab      # ab.py: head_ahead on / off, interleaved in one
#       process on one Generator, 4 prompts x 256 new tokens, 2 repetitions, k = 1..4, greedy and T=0.7
#       (~5 min)
#   bash bench/results/2026-12-05-head-ahead/run.sh fuzz    # tests/op_fuzz.py on CUDA, 4 seeds x 1500 cases:
#       the harness's bounds and mutations changed this session (GatedDeltaNet's y bound follows its float32
#       error's magnitude), checked so far on the CPU only
#   bash bench/results/2026-12-05-head-ahead/run.sh side    # on an H200: the side by side for README.md
# The library and the revision file as bench/device_library.sh says (.devlib/libort_mtp_ops.so.xz, this
# tree's csrc; .devlib/revision).
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start $1
case $1 in
  check) driver_check ;;
  ab)
    st head_ahead a/b
    OUT=$R timeout 560 python3 bench/results/2026-12-05-head-ahead/ab.py --prompts 4 --new-tokens 256 \
      --repetitions 2 --temperatures 0,0.7 > $R/ab.log 2>&1; echo "ab rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/ab.log | tail -10 | cut -c1-300 ;;
  fuzz)
    st op fuzz on CUDA
    for seed in 0 1 2 3; do
      timeout 120 python3 tests/op_fuzz.py --provider cuda --cases 1500 --seed $seed > $R/fuzz_$seed.log 2>&1
      echo "seed $seed rc $? $(tail -1 $R/fuzz_$seed.log | grep -o '"failures": [0-9]*')" | tee -a $R/steps.log
    done ;;
  side) side_by_side ;;
  profile)
    st kernel profile
    OUT=$R timeout 150 python3 bench/kernel_profile_27b.py --json profile.json > $R/profile.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
    grep -E "GPU kernels|round by phase|^  [a-z]|argmax" $R/profile.log | cut -c1-150 ;;
  noise0)
    st e2e at mtp-noise 0
    OUT=$R timeout 400 python3 bench/e2e_27b.py --folder /tmp/models_qwen35_27b_noise0 --mtp-noise 0 \
      --configurations ours --prompts 4 --new-tokens 256 --repetitions 2 --skip-identity > $R/e2e.log 2>&1
    echo "e2e rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/e2e.log | tail -8 | cut -c1-300 ;;
  *) echo "stage must be check, ab, fuzz, side, profile or noise0"; exit 2 ;;
esac
st done
pack
