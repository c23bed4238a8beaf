#!/usr/bin/env bash
# GDN speed run 2: build v2, GPU checks, bench 64/128, ncu S=1/S=4, kernel profile, memcheck.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res2; mkdir -p $R
T0=$(date +%s); st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a $R/steps.log; }
pip install --no-deps --no-index --target /tmp/site .device/extra/*.whl > $R/pip.log 2>&1 || true
st build
( cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C /tmp/b ) > $R/build.log 2>&1 || { tail -40 $R/build.log; tar -C /tmp -czf $OUT/res2.tar.gz res2; exit 1; }
st built
NEW=/tmp/b/libort_mtp_ops.so
export ORT_MTP_LIBRARY=$NEW
cuobjdump -sass $NEW 2>/dev/null | awk '/Function : .*GdnKernelI6__halfS2_Li16ELi128ELi128ELi4ELi64E/{p=1;next} p&&/Function : /{p=0} p' | grep -c "^        /\*[0-9a-f]*\*/" > $R/sass_hot64_count.txt
cuobjdump -res-usage $NEW 2>&1 | grep -A1 "Li128ELi128ELi4E" | grep -o "REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*" > $R/res_usage.txt
echo "hot64 sass instructions: $(cat $R/sass_hot64_count.txt); $(cat $R/res_usage.txt | tr '\n' ' ')" | tee -a $R/steps.log
st tests
timeout 200 python3 -m pytest tests/gpu -k gated-delta-net --gpu-jobs 3 --gpu-logs $R/gdnlogs > $R/gdn_tests.log 2>&1; echo "tests rc $?" | tee -a $R/steps.log
tail -4 $R/gdn_tests.log; grep -h -o '"problem": "[^"]*"' $R/gdnlogs/*.json 2>/dev/null | sort | uniq -c | head -5
st bench
timeout 100 python3 bench/gated_delta_net.py --reps 11 --out $R/new64 > $R/bench_new64.log 2>&1; tail -10 $R/bench_new64.log
ORT_MTP_GDN_COLS=128 timeout 100 python3 bench/gated_delta_net.py --reps 11 --out $R/new128 > $R/bench_new128.log 2>&1; tail -9 $R/bench_new128.log | head -8
st ncu
NCU="ncu --clock-control none -k regex:GdnKernel|FinishKernel --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
timeout 60 $NCU --launch-skip 4 --launch-count 2 python3 .device/ncu_gdn.py > $R/ncu_new_s1.log 2>&1
timeout 60 $NCU --launch-skip 16 --launch-count 2 python3 .device/ncu_gdn.py > $R/ncu_new_s4.log 2>&1
grep -E "GdnKernel|FinishKernel|Duration|Executed Instructions  |Warp Cycles Per Issued" $R/ncu_new_s1.log $R/ncu_new_s4.log | sed 's/  */ /g' | cut -c1-140
st kprof
OUT=$R timeout 150 python3 bench/kernel_profile_27b.py > $R/kprof.log 2>&1; echo "kprof rc $?"
grep -E "ms/token|GdnKernel|FinishKernel" $R/kprof.log | cut -c1-120 | head -12
st memcheck
timeout 170 python3 -m pytest tests/gpu -k gated-delta-net --gpu-jobs 3 --sanitizer memcheck --gpu-logs $R/memcheck > $R/memcheck.log 2>&1; echo "memcheck rc $?" | tee -a $R/steps.log
tail -4 $R/memcheck.log
st ncu-full
timeout 45 ncu --clock-control none -k regex:GdnKernel --set full --import-source yes --launch-skip 2 --launch-count 1 -o $R/ncu_full_s1 python3 .device/ncu_gdn.py > $R/ncu_full.log 2>&1
timeout 30 ncu -i $R/ncu_full_s1.ncu-rep --page source --csv --print-source sass > $R/ncu_full_s1_source.csv 2>&1; rm -f $R/ncu_full_s1.ncu-rep
st done
tar -C /tmp -czf $OUT/res2.tar.gz res2
cp $R/steps.log $OUT/
