#!/usr/bin/env bash
# ad-hoc session script (untracked): build, GPU tests, bench_layer --dispatched
set -uo pipefail
. bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
T0=$(date +%s)
cmake -S . -B build-gpu -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" >"$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j16 >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
if [ "${CTEST:-1}" = 1 ]; then
  (cd build-gpu && timeout 330 ctest -L gpu ${CTEST_R:+-R $CTEST_R} -V --timeout 300 -j2) >"$OUT/ctest.log" 2>&1
  grep -E "tests passed|Test +#|Failed|SKIP|^[0-9]+:   (n=|buckets|expert-|too many)" "$OUT/ctest.log" | tail -40
  echo "ctest done $(( $(date +%s) - T0 )) s"
fi
if [ -n "${DISP:-}" ]; then
  timeout 200 build-gpu/bench/bench_layer --dispatched --ts $DISP >"$OUT/bench_disp.log" 2>&1 || tail -5 "$OUT/bench_disp.log"
  grep -v "^csv" "$OUT/bench_disp.log" | grep -v "^#   plan"
fi
if [ "${RATE:-0}" = 1 ]; then
  nvcc -O3 -arch=native -o /tmp/mma_rate bench/probe/mma_rate_probe.cu && /tmp/mma_rate | tee "$OUT/mma_rate.log"
fi
if [ -n "${DECODE:-}" ]; then
  timeout 150 build-gpu/bench/bench_layer --decode --ts $DECODE >"$OUT/bench_decode.log" 2>&1 || tail -5 "$OUT/bench_decode.log"
  grep "^decode" "$OUT/bench_decode.log"
fi
# VARIANTS="4x4 6x3": FM_DECODE_STAGESxFM_DECODE_MIN_BLOCKS, decode.cu alone rebuilt, decode A/B each
for v in ${VARIANTS:-}; do
  st=${v%x*}; mb=${v#*x}
  cmake -S . -B build-gpu -DFM_DECODE_DEFS="FM_DECODE_STAGES=$st;FM_DECODE_MIN_BLOCKS=$mb" >"$OUT/build-v$v.log" 2>&1 &&
    cmake --build build-gpu -j16 --target bench_layer >>"$OUT/build-v$v.log" 2>&1 || { tail -20 "$OUT/build-v$v.log"; continue; }
  grep decode_kernel build-gpu/kernel_resources.csv | head -2
  echo "== variant stages $st min_blocks $mb"
  timeout 150 build-gpu/bench/bench_layer --decode --ts ${DECODE:-1,4,16} >"$OUT/bench_decode_v$v.log" 2>&1 || tail -5 "$OUT/bench_decode_v$v.log"
  grep "^decode" "$OUT/bench_decode_v$v.log"
done
echo "total $(( $(date +%s) - T0 )) s"
