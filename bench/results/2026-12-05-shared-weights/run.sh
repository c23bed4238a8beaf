#!/usr/bin/env bash
# Prepared 2026-12-05: driver.shared_weights, the MTP head's session reading the main session's device copy
# of the embedding and lm_head instead of loading its own (mtp.onnx.data holds both again). Predicted on
# the 27B-class folder: the MTP Generator's load 3.3 GB lower (2.54 GB fp16 embedding, 0.72 GB int4
# lm_head and scales in the tiles layout; 2026-12-05-generator-memory/breakdown: 28.4 GB at 4d8b620), the
# same tokens (MTP == greedy), the same speed (same kernels, other pointers). Also measured: ONNX
# Runtime's CUDA arena growing by what is asked (kSameAsRequested) instead of doubling, which may reserve
# memory no tensor uses (greedy's load read 19.6 GB against 17.1 GB of weights; the MTP Generator's
# memory moved by ~3.2 GB between runs of the same code).
# On the device, after the setup chunks, one call:
#   bash bench/results/2026-12-05-shared-weights/run.sh all   # check (driver_cuda_check tiny, small: MTP ==
#       greedy with graphs and eager), then breakdown.py with ORT's default arena and with kSameAsRequested
#       (~5 min)
#   bash bench/results/2026-12-05-shared-weights/run.sh arena  # arena_ab.py: kSameAsRequested against ORT's
#       default arena, two MTP Generators interleaved in one process (decode tok/s, prefill, tokens, memory)
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start $1
case $1 in
  all)
    driver_check
    pack
    for arena in default same; do
      st memory breakdown, arena $arena
      OUT=$R timeout 200 python3 bench/results/2026-12-05-generator-memory/breakdown.py --arena-extend $arena \
        > $R/breakdown_$arena.log 2>&1
      echo "breakdown $arena rc $?" | tee -a $R/steps.log
      grep -v "W:onnxruntime" $R/breakdown_$arena.log | tail -14 | cut -c1-200
      pack
    done ;;
  arena)
    st arena a/b
    OUT=$R timeout ${ARENA_TIMEOUT:-400} python3 bench/results/2026-12-05-shared-weights/arena_ab.py ${ARENA_ARGS:-} \
      > $R/arena_ab.log 2>&1; echo "arena a/b rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/arena_ab.log | tail -6 | cut -c1-200 ;;
  *) echo "stage must be all or arena"; exit 2 ;;
esac
st done
pack
