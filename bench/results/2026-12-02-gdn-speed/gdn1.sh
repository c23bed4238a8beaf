#!/usr/bin/env bash
# GDN speed run 1: build new + baseline, GPU checks, per-layer bench (new 64/128/32, baseline), ncu both, kernel profile new.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R
T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
pip install --no-deps --no-index --target /tmp/site .device/extra/*.whl > $R/pip.log 2>&1 || true
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.txt 2>&1
st build
mkdir -p /tmp/src0 && tar --exclude=./.device --exclude=./.git -cf - . | tar -C /tmp/src0 -xf - && cp .device/orig/gated_delta_net_cuda.cu /tmp/src0/csrc/gated_delta_net/gated_delta_net_cuda.cu
( cmake -S /tmp/src0 -B /tmp/b0 -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C /tmp/b0 -j8 ) > $R/build0.log 2>&1 &
P0=$!
( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C /tmp/b -j8 ) > $R/build.log 2>&1 || { tail -40 $R/build.log; tar -C /tmp -czf $OUT/res.tar.gz res; exit 1; }
wait $P0 || echo "baseline build failed" | tee -a $R/steps.log
st built
NEW=/tmp/b/libort_mtp_ops.so; OLD=/tmp/b0/libort_mtp_ops.so
cuobjdump -res-usage $NEW 2>&1 | grep -A1 GdnKernel | grep -o "REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*" | head -4 > $R/res_usage.txt
cuobjdump -sass $NEW 2>/dev/null | awk '/Function : .*GdnKernelI6__halfS2_Li16/{p=1} p&&/Function : /&&!/GdnKernelI6__halfS2_Li16/{p=0} p' > $R/sass_new_gdn_half16.txt
cuobjdump -sass $OLD 2>/dev/null | awk '/Function : .*GdnKernelI6__halfS2_Li16/{p=1} p&&/Function : /&&!/GdnKernelI6__halfS2_Li16/{p=0} p' > $R/sass_old_gdn_half16.txt
wc -l $R/sass_*.txt | tee -a $R/steps.log
export ORT_MTP_LIBRARY=$NEW
st tests
timeout 240 python3 -m pytest tests/gpu -k gated-delta-net --gpu-jobs 3 --gpu-logs $R/gdnlogs > $R/gdn_tests.log 2>&1; echo "tests rc $?" | tee -a $R/steps.log
tail -5 $R/gdn_tests.log
st bench-new
timeout 100 python3 bench/gated_delta_net.py --reps 11 --out $R/new64 > $R/bench_new64.log 2>&1; tail -10 $R/bench_new64.log
st bench-old
ORT_MTP_LIBRARY=$OLD timeout 100 python3 bench/gated_delta_net.py --reps 11 --out $R/old64 > $R/bench_old64.log 2>&1; tail -10 $R/bench_old64.log
st bench-new128
ORT_MTP_GDN_COLS=128 timeout 100 python3 bench/gated_delta_net.py --reps 11 --out $R/new128 > $R/bench_new128.log 2>&1; tail -10 $R/bench_new128.log
st ncu
NCU="ncu --clock-control none -k regex:GdnKernel|FinishKernel --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
timeout 90 $NCU --launch-skip 4 --launch-count 2 python3 .device/ncu_gdn.py > $R/ncu_new_s1.log 2>&1
timeout 90 $NCU --launch-skip 16 --launch-count 2 python3 .device/ncu_gdn.py > $R/ncu_new_s4.log 2>&1
ORT_MTP_LIBRARY=$OLD timeout 90 $NCU --launch-skip 4 --launch-count 2 python3 .device/ncu_gdn.py > $R/ncu_old_s1.log 2>&1
ORT_MTP_LIBRARY=$OLD timeout 90 $NCU --launch-skip 16 --launch-count 2 python3 .device/ncu_gdn.py > $R/ncu_old_s4.log 2>&1
timeout 90 ncu --clock-control none -k regex:GdnKernel --set full --import-source yes --launch-skip 2 --launch-count 1 -o $R/ncu_new_full_s1 python3 .device/ncu_gdn.py > $R/ncu_new_full.log 2>&1
timeout 60 ncu -i $R/ncu_new_full_s1.ncu-rep --page source --csv --print-source sass > $R/ncu_new_full_s1_source.csv 2>&1
ORT_MTP_LIBRARY=$OLD timeout 90 ncu --clock-control none -k regex:GdnKernel --set full --import-source yes --launch-skip 2 --launch-count 1 -o $R/ncu_old_full_s1 python3 .device/ncu_gdn.py > $R/ncu_old_full.log 2>&1
timeout 60 ncu -i $R/ncu_old_full_s1.ncu-rep --page source --csv --print-source sass > $R/ncu_old_full_s1_source.csv 2>&1
grep -E "GdnKernel|FinishKernel|Duration|Elapsed Cycles|SM Frequency|Warp Cycles Per Issued|Executed Ipc A|Issued Warp Per Sched" $R/ncu_new_s1.log $R/ncu_old_s1.log $R/ncu_new_s4.log $R/ncu_old_s4.log | sed 's/  */ /g' | cut -c1-150
st kprof
timeout 200 python3 bench/kernel_profile_27b.py > $R/kprof.log 2>&1; echo "kprof rc $?"; cp $OUT/kernel_profile_27b.json $R/ 2>/dev/null; ls bench/results/*.json 2>/dev/null | head -3
grep -i -E "gated delta|total|family" $R/kprof.log | head -12
st done
tar -C /tmp -czf $OUT/res.tar.gz res
cp $R/steps.log $OUT/
