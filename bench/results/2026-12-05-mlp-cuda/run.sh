#!/usr/bin/env bash
# The gated MLP fused on CUDA (ort_mtp::MatMulNBits activation="swiglu", two launches), H200, after the
# device setup chunks:
#   bash bench/results/2026-12-05-mlp-cuda/run.sh a   # library; GPU groups pair, smoke-tiles, decode; pair under
#                                                     # memcheck; e2e with and without the MLP fusion (one process)
#   bash bench/results/2026-12-05-mlp-cuda/run.sh b   # the side by side: ours, ORT's own ops, onnxruntime-genai
#   bash bench/results/2026-12-05-mlp-cuda/run.sh c   # kernel profile; op fuzz (the pair cases now run on CUDA)
# The library is built on the development machine (cmake -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real,
# Release), stripped and carried xz-compressed as .devlib/libort_mtp_ops.so.xz; built here if it does not load.
# Everything lands in /tmp/r and comes back as one archive ($OUT/r_<stage>.tgz).
set -u
export PYTHONUNBUFFERED=1
R=/tmp/r/$1; mkdir -p $R; T0=$(date +%s)
st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
pack() { tar -C /tmp/r -czf $OUT/r_$1.tgz $1; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so ORT_MTP_CACHE_DIR=/tmp/tiles-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,driver_version --format=csv > $R/gpu.txt 2>&1
git log -1 --format=%H > $R/revision.txt 2>/dev/null
if [ ! -f $ORT_MTP_LIBRARY ]; then
  st library
  mkdir -p /tmp/b && xz -dc .devlib/libort_mtp_ops.so.xz > $ORT_MTP_LIBRARY
  if ! python3 -c "import onnxruntime as o; o.SessionOptions().register_custom_ops_library('$ORT_MTP_LIBRARY'); print('carried library loads')"; then
    st build
    ( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && timeout 400 ninja -C /tmp/b -j16 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; pack $1; exit 1; }
  fi
fi
if [ "$1" = a ]; then
  st GPU groups pair, smoke-tiles, decode
  timeout 150 python3 -m pytest tests/gpu -k "pair or smoke-tiles or matmul_nbits_group and decode" --gpu-jobs 3 -v -rA --gpu-logs $R/groups_logs > $R/groups.log 2>&1; echo "groups rc $?" | tee -a $R/steps.log
  sed -n '/short test summary/,$p' $R/groups.log | cut -c1-300 | tail -8; grep -h "^FAIL" $R/groups_logs/*.log | cut -c1-300 | head -12
  st pair under memcheck
  timeout 150 python3 -m pytest tests/gpu -k pair --sanitizer memcheck -v -rA --gpu-logs $R/pair_memcheck_logs > $R/pair_memcheck.log 2>&1; echo "pair memcheck rc $?" | tee -a $R/steps.log
  tail -3 $R/pair_memcheck.log | cut -c1-400; pack a
  st e2e with and without the MLP fusion, 256 new tokens
  OUT=$R timeout 360 python3 bench/e2e_27b.py --configurations ours,ours_nomlp --prompts 4 --new-tokens 256 --repetitions 2 > $R/e2e_ab.log 2>&1; echo "e2e ab rc $?" | tee -a $R/steps.log
  mv $R/e2e_27b.json $R/e2e_ab.json 2>/dev/null; grep -v "W:onnxruntime" $R/e2e_ab.log | tail -16
elif [ "$1" = b ]; then
  st side by side
  OUT=$R timeout 585 python3 bench/e2e_27b.py --configurations ours,ort,genai --prompts 4 --new-tokens 256 --repetitions 3 --ort-repetitions 1 --phases --skip-identity > $R/e2e.log 2>&1; echo "e2e rc $?" | tee -a $R/steps.log
  grep -v "W:onnxruntime" $R/e2e.log | tail -24
else
  st kernel profile
  OUT=$R timeout 100 python3 bench/kernel_profile_27b.py --json profile.json > $R/profile.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
  grep -E "GPU kernels|^  [a-z]" $R/profile.log | cut -c1-150; pack c
  st op fuzz
  timeout 120 python3 -m pytest tests/gpu -k op_fuzz --gpu-jobs 2 -v -rA --gpu-logs $R/fuzz_logs > $R/fuzz.log 2>&1; echo "fuzz rc $?" | tee -a $R/steps.log
  sed -n '/short test summary/,$p' $R/fuzz.log | cut -c1-300 | tail -4; grep -h "^FAIL" $R/fuzz_logs/*.log | cut -c1-250 | head -12
fi
st done
pack $1
