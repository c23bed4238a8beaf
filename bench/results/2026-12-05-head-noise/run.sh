#!/usr/bin/env bash
# What the issue-18 targets that depend on acceptance (best MTP >= 300 tok/s, >= 2x our greedy) read at a
# higher acceptance than the qwen35-27b folder's default head (--mtp-noise 0.1: 0.673 / 0.554 / 0.466 /
# 0.392 at k = 1..4). --mtp-noise 0 is the synthetic head's highest (on the small preset, teacher-forced:
# 0.848 against 0.744 at 0.1, docs/models.md), nearer the trained default model's 0.85 / 0.77 / 0.69 / 0.65
# (bench/results/cpu/default_model.json). One stage on the device, after the setup chunks:
#   bash bench/results/2026-12-05-head-noise/run.sh noise0
# builds a second qwen35-27b folder with --mtp-noise 0 and times ours, greedy and MTP k = 1..4 (4 prompts x
# 256 new tokens, 2 repetitions, the same prompts as every e2e_27b run).
set -u
export PYTHONUNBUFFERED=1
source bench/device_library.sh
device_run_start $1
case $1 in
  noise0)
    st e2e at mtp-noise 0
    OUT=$R timeout 560 python3 bench/e2e_27b.py --folder /tmp/models_qwen35_27b_noise0 --mtp-noise 0 \
      --configurations ours --prompts 4 --new-tokens 256 --repetitions 2 --skip-identity > $R/e2e.log 2>&1
    echo "e2e rc $?" | tee -a $R/steps.log
    grep -v "W:onnxruntime" $R/e2e.log | tail -8 | cut -c1-300 ;;
  *) echo "stage must be noise0"; exit 2 ;;
esac
st done
pack
