#!/usr/bin/env bash
# The first GPU run of ort_mtp::GatedAttention's CUDA kernel (H200), after the device setup chunks:
#   bash bench/results/2026-12-05-gated-attention-cuda/run.sh a   # library, GPU group, memcheck, e2e default
#   bash bench/results/2026-12-05-gated-attention-cuda/run.sh b   # GPU group again, op fuzz and e2e with the kernel, kernel profiles
#   bash bench/results/2026-12-05-gated-attention-cuda/run.sh c   # (the kernel on by default) GPU group, op fuzz, e2e A/B at 128 tokens
# The library is built on this machine (cmake -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real, Release),
# stripped and carried xz-compressed as .devlib/libort_mtp_ops.so.xz; built there if it does not load.
# Everything lands in /tmp/r and comes back as one archive ($OUT/r_<stage>.tgz: $OUT returns 8 files at most).
set -u
export PYTHONUNBUFFERED=1
R=/tmp/r/$1; mkdir -p $R; T0=$(date +%s)
st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
pack() { tar -C /tmp/r -czf $OUT/r_$1.tgz $1; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so ORT_MTP_CACHE_DIR=/tmp/tiles-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,driver_version --format=csv > $R/gpu.txt 2>&1
if [ ! -f $ORT_MTP_LIBRARY ]; then
  st library
  mkdir -p /tmp/b && xz -dc .devlib/libort_mtp_ops.so.xz > $ORT_MTP_LIBRARY
  if ! python3 -c "import onnxruntime as o; o.SessionOptions().register_custom_ops_library('$ORT_MTP_LIBRARY'); print('carried library loads')"; then
    st build
    ( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && timeout 400 ninja -C /tmp/b -j16 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; pack $1; exit 1; }
  fi
fi
st gated-attention group
timeout 200 python3 -m pytest tests/gpu -k gated-attention -v -rA --gpu-logs $R/ga_logs > $R/ga.log 2>&1; echo "ga rc $?" | tee -a $R/steps.log
grep -hE "^(ok|FAIL)" $R/ga_logs/*.log | cut -c1-300
if [ "$1" = a ]; then
  st gated-attention memcheck
  timeout 150 python3 -m pytest tests/gpu -k gated-attention --sanitizer memcheck -v -rA --gpu-logs $R/ga_memcheck_logs > $R/ga_memcheck.log 2>&1; echo "ga memcheck rc $?" | tee -a $R/steps.log
  tail -3 $R/ga_memcheck.log | cut -c1-400
  st e2e default
  OUT=$R timeout 330 python3 bench/e2e_27b.py --configurations ours --prompts 4 --new-tokens 256 --repetitions 3 --phases > $R/e2e_default.log 2>&1; echo "e2e default rc $?" | tee -a $R/steps.log
  mv $R/e2e_27b.json $R/e2e_default.json 2>/dev/null; tail -14 $R/e2e_default.log
elif [ "$1" = c ]; then
  st op fuzz: GatedAttention on its CUDA kernel by default now
  timeout 120 python3 -m pytest tests/gpu -k op_fuzz --gpu-jobs 2 -v -rA --gpu-logs $R/fuzz_logs > $R/fuzz.log 2>&1; echo "fuzz rc $?" | tee -a $R/steps.log
  sed -n '/short test summary/,$p' $R/fuzz.log | cut -c1-300 | tail -4; grep -h "^FAIL" $R/fuzz_logs/*.log | cut -c1-250 | head -12
  grep -h '"summary"\|GatedAttention nan\|cases,' $R/fuzz_logs/*.log | head -4; pack c  # kept if the lease ends early
  for ga in 0 1; do
    st e2e ORT_MTP_GATED_ATTENTION_CUDA=$ga, 128 new tokens
    ORT_MTP_GATED_ATTENTION_CUDA=$ga OUT=$R timeout 150 python3 bench/e2e_27b.py --configurations ours --prompts 4 --new-tokens 128 --repetitions 2 --skip-identity > $R/e2e_ga$ga.log 2>&1; echo "e2e ga=$ga rc $?" | tee -a $R/steps.log
    mv $R/e2e_27b.json $R/e2e_ga$ga.json 2>/dev/null; grep -E "^ours " $R/e2e_ga$ga.log; pack c
  done
else
  st op fuzz with the GatedAttention CUDA kernel
  ORT_MTP_GATED_ATTENTION_CUDA=1 timeout 130 python3 -m pytest tests/gpu -k op_fuzz --gpu-jobs 2 -v -rA --gpu-logs $R/fuzz_logs > $R/fuzz.log 2>&1; echo "fuzz rc $?" | tee -a $R/steps.log
  sed -n '/short test summary/,$p' $R/fuzz.log | cut -c1-300 | tail -6; grep -h "^FAIL" $R/fuzz_logs/*.log | cut -c1-250 | head -12
  st e2e gated-attention
  ORT_MTP_GATED_ATTENTION_CUDA=1 OUT=$R timeout 300 python3 bench/e2e_27b.py --configurations ours --prompts 4 --new-tokens 256 --repetitions 3 --phases > $R/e2e_ga.log 2>&1; echo "e2e ga rc $?" | tee -a $R/steps.log
  mv $R/e2e_27b.json $R/e2e_ga.json 2>/dev/null; tail -14 $R/e2e_ga.log
  st profile default
  OUT=$R timeout 85 python3 bench/kernel_profile_27b.py --json profile_default.json > $R/profile_default.log 2>&1; echo "profile rc $?" | tee -a $R/steps.log
  st profile gated-attention
  ORT_MTP_GATED_ATTENTION_CUDA=1 OUT=$R timeout 85 python3 bench/kernel_profile_27b.py --json profile_ga.json > $R/profile_ga.log 2>&1; echo "profile ga rc $?" | tee -a $R/steps.log
  grep -E "GPU kernels|^  [a-z]" $R/profile_default.log $R/profile_ga.log | cut -c1-150
fi
st done
pack $1
