#!/usr/bin/env bash
# Call A: build, the GQA GPU group (the CUDA kernel registered by default), the per-layer GQA bench.
set -u
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.txt 2>&1
st build
( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C /tmp/b -j16 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
st built
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so
st bench
timeout 150 python3 bench/group_query_attention.py --out $R > $R/gqa_bench.log 2>&1; echo "bench rc $?" | tee -a $R/steps.log
tail -16 $R/gqa_bench.log
st tests
timeout 240 python3 -m pytest tests/gpu -k group-query-attention -v -rA --gpu-logs $R/group_logs > $R/gqa_group.log 2>&1; echo "tests rc $?" | tee -a $R/steps.log
grep -E "passed|failed|FAIL|problem" $R/gqa_group.log | tail -15
st done
