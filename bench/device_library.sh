# Sourced by the device scripts (bench/device_run.sh, bench/results/*/run.sh): device_library BUILD LOG
# exports ORT_MTP_LIBRARY=BUILD/libort_mtp_ops.so and puts the library there: a library built on the
# development machine and carried (PREBUILT, default .devlib/libort_mtp_ops.so.xz: the build on the
# device takes ~290 s of device time, ~80 s on the development machine) when it loads, else a build
# (cmake, CUDA for sm_90, BUILD_TIMEOUT seconds, default 400). Output goes to LOG; the status is the
# build's. Make the carried library with
#   cmake -S . -B /tmp/bgpu -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real && ninja -C /tmp/bgpu
#   mkdir -p .devlib && strip --strip-unneeded -o .devlib/l.so /tmp/bgpu/libort_mtp_ops.so \
#     && xz -c .devlib/l.so > .devlib/libort_mtp_ops.so.xz && rm .devlib/l.so   # .devlib/ in .git/info/exclude
# and name .devlib in the run's carry (2 MB). Write the tree's revision beside it,
#   echo "$(git rev-parse --short HEAD)$(git status --porcelain --untracked-files=no | grep -q . && echo -dirty)" > .devlib/revision
# which device_run_start exports as ORT_MTP_REVISION, the revision the benchmarks' JSON records (the device
# copy's git history is not this tree's: it named the session's first commit).
device_library() {
  local build=$1 log=$2 prebuilt=${PREBUILT:-.devlib/libort_mtp_ops.so.xz}
  export ORT_MTP_LIBRARY="$build/libort_mtp_ops.so"
  if [ -f "$prebuilt" ] && mkdir -p "$build" && xz -dc "$prebuilt" > "$ORT_MTP_LIBRARY" \
      && python3 -c "import onnxruntime as o; o.SessionOptions().register_custom_ops_library('$ORT_MTP_LIBRARY')" \
      > "$log" 2>&1; then
    echo "using the carried library $prebuilt (no build)"
    return 0
  fi
  echo "building the library in $build"
  { cmake -S . -B "$build" -G Ninja -DORT_MTP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
      && timeout "${BUILD_TIMEOUT:-400}" ninja -C "$build"; } >> "$log" 2>&1
}

# device_run_start NAME: the opening the pending device scripts (bench/results/*/run.sh) share. Results go
# to R=/tmp/r/NAME; `st TEXT` logs a step with the seconds since the start ($R/steps.log); `pack` puts
# $R into $OUT/r.tgz (what comes back, so call it after every step); the GPU's clocks go to $R/gpu.txt;
# the tiles layout's cache to /tmp/tiles-cache; then the library (device_library /tmp/b): if neither the
# carried one loads nor a build succeeds, the build log's tail is printed, packed, and the script exits.
device_run_start() {
  R=/tmp/r/$1
  RUN_NAME=$1
  mkdir -p "$R"
  T0=$(date +%s)
  st() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a "$R/steps.log"; }
  pack() { tar -C /tmp/r -czf "$OUT/r.tgz" "$RUN_NAME"; }
  export ORT_MTP_CACHE_DIR=/tmp/tiles-cache
  [ -f .devlib/revision ] && export ORT_MTP_REVISION=$(cat .devlib/revision)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,driver_version --format=csv \
    > "$R/gpu.txt" 2>&1
  st library
  device_library /tmp/b "$R/build.log" || { tail -40 "$R/build.log"; pack; exit 1; }
}

# driver_check: the stage that goes first in a device run that changes the driver's CUDA path:
# bench/driver_cuda_check.py on the tiny and small presets (greedy eager == graphs, MTP == greedy at
# k = 1..3 and with the replay commit), its log in $R/driver_check.log, a summary printed.
driver_check() {
  st driver check
  timeout 200 python3 bench/driver_cuda_check.py run --presets tiny,small --fixtures /tmp/no-genai-fixtures --out "$R" \
    > "$R/driver_check.log" 2>&1; echo "driver check rc $?" | tee -a "$R/steps.log"
  grep -E "^\S.*\[(eager|graphs)\]|mtp_k|Error|error" "$R/driver_check.log" | cut -c1-220
}

# side_by_side: the README's end-to-end table (bench/e2e_27b.py: ours, the driver on ORT's ops,
# onnxruntime-genai; 4 prompts x 256 new tokens, 3 repetitions, 1 for ORT's ops, --phases), ~460 s.
side_by_side() {
  st side by side
  OUT=$R timeout 585 python3 bench/e2e_27b.py --configurations ours,ort,genai --prompts 4 --new-tokens 256 \
    --repetitions 3 --ort-repetitions 1 --phases --skip-identity > "$R/e2e.log" 2>&1
  echo "e2e rc $?" | tee -a "$R/steps.log"
  grep -v "W:onnxruntime" "$R/e2e.log" | tail -24
}
