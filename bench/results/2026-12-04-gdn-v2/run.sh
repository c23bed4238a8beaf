#!/usr/bin/env bash
# GatedDeltaNet v2 (bench/results/2026-12-02-gdn-speed/v2-unmeasured.patch, merged onto 863ab08):
# build, its three GPU groups (64, 8, 128 columns per block), the per-layer bench against ORT's subgraph.
set -u
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
st build
( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && timeout 330 ninja -C /tmp/b -j16 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so
st gdn-groups
timeout 120 python3 -m pytest tests/gpu -k gated-delta-net --gpu-jobs 3 -v -rA --gpu-logs $R/gdn_logs > $R/gdn_groups.log 2>&1; echo "groups rc $?" | tee -a $R/steps.log
grep -E "passed|failed|FAIL" $R/gdn_groups.log | tail -6
st bench
timeout 120 python3 bench/gated_delta_net.py --reps 11 --out $R > $R/bench.log 2>&1; echo "bench rc $?" | tee -a $R/steps.log
tail -14 $R/bench.log
st done
