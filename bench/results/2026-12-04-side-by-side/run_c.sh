#!/usr/bin/env bash
# Call C: build; ort_mtp::MatMul's GPU group and bench (the unrolled M=1 loop, R = 8 for M >= 2);
# the GroupQueryAttention group under compute-sanitizer memcheck (the prefill kernel's first run there).
set -u
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.txt 2>&1
st build
( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C /tmp/b -j16 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so
st fm-group
timeout 120 python3 -m pytest tests/gpu -k float-matmul -v -rA --gpu-logs $R/fm_logs > $R/fm_group.log 2>&1; echo "fm group rc $?" | tee -a $R/steps.log
grep -E "passed|failed" $R/fm_group.log | tail -3
st fm-bench
timeout 120 python3 bench/float_matmul.py --out $R > $R/fm_bench.log 2>&1; echo "fm bench rc $?" | tee -a $R/steps.log
tail -12 $R/fm_bench.log
st gqa-memcheck
timeout 200 python3 -m pytest tests/gpu -k group-query-attention --sanitizer memcheck -v -rA --gpu-logs $R/gqa_memcheck_logs > $R/gqa_memcheck.log 2>&1; echo "gqa memcheck rc $?" | tee -a $R/steps.log
grep -E "passed|failed|ERROR SUMMARY" $R/gqa_memcheck.log | tail -5
st done
