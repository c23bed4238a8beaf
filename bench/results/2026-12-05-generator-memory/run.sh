#!/usr/bin/env bash
# Run 2026-12-05 on an H100 (README.md here). The memory each Generator adds on the 27B-class folder (bench/e2e_27b.py's memory_bytes, b8aeef1): the
# device peak the side-by-side runs reported since a252e78 (44-50 GB) held the MTP and the greedy
# Generator at once, two copies of the main weights. Predicted: each ~17-23 GB (17.1 GB of main weights,
# the head's 0.3 GB, activations, CUDA graphs), the two together near the old peak.
# On the device, after the setup chunks:
#   bash bench/results/2026-12-05-generator-memory/run.sh memory
#   bash bench/results/2026-12-05-generator-memory/run.sh breakdown   # run the same day (README.md): breakdown.py
#       (the growth after each step of loading and warming up: greedy, MTP k = 1..4 with graphs, MTP without
#       graphs; ~3 min with the folder built)
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start $1
case $1 in
  memory)
    st generator memory
    OUT=$R timeout 400 python3 bench/e2e_27b.py --configurations ours --prompts 1 --new-tokens 16 \
      --repetitions 1 --skip-identity > $R/e2e.log 2>&1
    echo "e2e rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/e2e.log | grep -E "memory|tok/s" | tail -8 | cut -c1-300 ;;
  breakdown)
    st memory breakdown
    OUT=$R timeout 400 python3 bench/results/2026-12-05-generator-memory/breakdown.py > $R/breakdown.log 2>&1
    echo "breakdown rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/breakdown.log | tail -14 | cut -c1-200 ;;
  *) echo "stage must be memory or breakdown"; exit 2 ;;
esac
st done
pack
