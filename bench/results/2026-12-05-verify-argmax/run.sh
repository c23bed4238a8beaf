#!/usr/bin/env bash
# Prepared 2026-12-05, run the next session on an H100 (README.md has the results): the verify's argmax row by row (3b44a27:
# CuPy's 1-D device-wide reduction per row instead of one reduction over the last axis of [k+1, V],
# which runs one thread block per row: 0.35 ms per verify in bench/results/2026-12-05-mlp-cuda/c/profile.json),
# the sampled verify's distributions row by row (889ac2c), and greedy's host reading each token one forward
# late (the greedy column of before/after: the GPU no longer waits for the host between forwards). On the
# device (an H200 for the README's table), after the setup chunks, one call per stage, back to back:
#   bash bench/results/2026-12-05-verify-argmax/run.sh check     # driver_cuda_check on tiny and small: greedy
#       eager == graphs, MTP == greedy at k = 1..3 and replay (the CUDA code of these changes; run it first)
#   bash bench/results/2026-12-05-verify-argmax/run.sh before    # e2e at 8fe1a96 (.devlib/before_py.tgz)
#   bash bench/results/2026-12-05-verify-argmax/run.sh after     # e2e at this tree
#   bash bench/results/2026-12-05-verify-argmax/run.sh side      # the side by side: ours, ORT's ops, onnxruntime-genai
#   bash bench/results/2026-12-05-verify-argmax/run.sh profile   # kernel profile (cupy_cub_argmax should be gone) and
#       the GPU kernel time inside each phase of a k=3 round against its wall time
# Both e2e runs use the same library (.devlib/libort_mtp_ops.so.xz, this tree's csrc), each in its own
# process: greedy and MTP k=1..4, 4 prompts x 256 new tokens, 2 repetitions, --phases, and sampled
# decoding at T=0.7. Make the carried files with
#   git archive 8fe1a96 driver ops models bench/e2e_27b.py bench/cpu.py | gzip > .devlib/before_py.tgz
# and the library as bench/device_library.sh says. Afterwards point bench/report.py's RUNS at the side
# by side (an H200 run) and run `python bench/report.py`.
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start $1
case $1 in
  check)
    st driver check
    timeout 200 python3 bench/driver_cuda_check.py run --presets tiny,small --fixtures /tmp/no-genai-fixtures --out $R \
      > $R/driver_check.log 2>&1; echo "driver check rc $?" | tee -a $R/steps.log
    grep -E "^\S.*\[(eager|graphs)\]|mtp_k|Error|error" $R/driver_check.log | cut -c1-220 ;;
  before|after)
    dir=$PWD
    if [ $1 = before ]; then  # the old driver timed by this tree's script (613a903 interleaves the modes)
      dir=/tmp/before_py; mkdir -p $dir && tar -C $dir -xzf .devlib/before_py.tgz && cp bench/e2e_27b.py $dir/bench/
    fi
    st e2e $1
    (cd $dir && OUT=$R timeout 500 python3 bench/e2e_27b.py --configurations ours --prompts 4 --new-tokens 256 \
      --repetitions 2 --skip-identity --phases --temperatures 0.7) > $R/e2e.log 2>&1; echo "e2e rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/e2e.log | tail -16 | cut -c1-300 ;;
  side)
    st side by side
    OUT=$R timeout 585 python3 bench/e2e_27b.py --configurations ours,ort,genai --prompts 4 --new-tokens 256 \
      --repetitions 3 --ort-repetitions 1 --phases --skip-identity > $R/e2e.log 2>&1; echo "e2e rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/e2e.log | tail -24 ;;
  profile)
    st kernel profile
    OUT=$R timeout 150 python3 bench/kernel_profile_27b.py --json profile.json > $R/profile.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
    grep -E "GPU kernels|round by phase|^  [a-z]|argmax" $R/profile.log | cut -c1-150 ;;
  *) echo "stage must be check, before, after, side or profile"; exit 2 ;;
esac
st done
pack
