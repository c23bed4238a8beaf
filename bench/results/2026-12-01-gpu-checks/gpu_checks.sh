#!/usr/bin/env bash
# Device run for issues 21/22 at the committed HEAD: build (sm_90), the GPU pytest suite, then memcheck
# on the kernel smoke groups, CopySlots and the op fuzz cases.
set -u
python3 -c "import pytest" 2>/dev/null || pip install -q --no-index --no-deps .device/extra/*.whl > $OUT/pip.log 2>&1
python3 -c "import pytest; print('pytest', pytest.__version__)"
mkdir -p /tmp/head && tar -x -C /tmp/head -f .device/head.tar && cd /tmp/head
SECONDS=0
{ cmake -S . -B /tmp/b -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C /tmp/b; } > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build ${SECONDS}s"
export ORT_MTP_LIBRARY=/tmp/b/libort_mtp_ops.so
timeout 30 python3 bench/sass_lint.py $ORT_MTP_LIBRARY > $OUT/sass_lint.log 2>&1; echo "sass_lint rc=$?"; tail -3 $OUT/sass_lint.log
SECONDS=0
# memcheck of the op fuzz in the background (its own process, 150 cases), while the plain suite runs
( timeout 420 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 tests/op_fuzz.py --provider cuda --cases 150 --seed 2 > $OUT/fuzz_memcheck.log 2>&1; echo "fuzz memcheck rc=$?" >> $OUT/fuzz_memcheck.log ) &
timeout 260 python3 -m pytest tests/gpu --gpu-jobs 4 -q -rs -p no:cacheprovider --gpu-logs $OUT/gpu_logs --junitxml $OUT/gpu.xml > $OUT/gpu.log 2>&1
echo "gpu suite rc=$? ${SECONDS}s"; tail -15 $OUT/gpu.log
SECONDS=0
timeout 200 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider --gpu-jobs 4 --sanitizer memcheck --gpu-logs $OUT/memcheck_logs --junitxml $OUT/memcheck.xml -k "smoke-mma or smoke-tiles or copy_slots or smoke-generic" > $OUT/memcheck.log 2>&1
echo "memcheck groups rc=$? ${SECONDS}s"; tail -8 $OUT/memcheck.log
wait
tail -3 $OUT/fuzz_memcheck.log; grep -c '"case"' $OUT/fuzz_memcheck.log; grep -E "ERROR SUMMARY|Invalid|failure" $OUT/fuzz_memcheck.log | head -5
