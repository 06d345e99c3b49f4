#!/usr/bin/env bash
# wip/next-call-3.sh - issue 31: the decode kernel with its units taken from a counter
# (FM_DECODE_DYNAMIC, decode_parts.cuh; on main as a build-time knob, off, never run) against the
# default build, in one call:
#   1. the default build (A): bench_layer, test_cuda_decode; binaries and libfp4moe_dev.so copied
#   2. the knob's build (B): the same, copied; B's test_cuda_decode (decode = chain bit for bit)
#   3. bench_layer --decode, GLM-5 and gpt-oss-120b, T = 1..16, rounds A B B A (each run preloads
#      its own library: wip/README.md's lesson)
#   4. the knob with random CTA delays: gpu-check.sh decode-delay (plain x2, memcheck, racecheck)
#   run: bash wip/next-call-3.sh      carry [".debs"], timeout 600
set -uo pipefail
T0=$SECONDS
. bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
B=$OUT/../ab-bin
build() { # $1: name, $2: FM_DECODE_DEFS
  cmake -S . -B build-gpu -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="-I$SYS/usr/include" -DFM_DECODE_DEFS="$2" >"$OUT/cfg-$1.log" 2>&1 &&
    cmake --build build-gpu -j16 --target bench_layer test_cuda_decode >"$OUT/build-$1.log" 2>&1 ||
    { tail -30 "$OUT/build-$1.log"; echo "BUILD $1 FAILED"; exit 1; }
  mkdir -p "$B/$1" && cp build-gpu/bench/bench_layer build-gpu/tests/test_cuda_decode build-gpu/libfp4moe_dev.so "$B/$1/"
  echo "== built $1 at $((SECONDS - T0)) s: $(LD_PRELOAD="$B/$1/libfp4moe_dev.so" ldd "$B/$1/bench_layer" | grep fp4moe_dev)"
}
run() { local v=$1; shift; timeout 120 env LD_PRELOAD="$B/$v/libfp4moe_dev.so" "$B/$v/$@"; }
build A ""
build B "FM_DECODE_DYNAMIC=1"
run B test_cuda_decode >"$OUT/test_decode_B.log" 2>&1
echo "test_cuda_decode (B, units from a counter): rc=$?  $(grep -E 'PASSED|FAILED' "$OUT/test_decode_B.log" | tail -2 | tr '\n' ' ')"
for m in glm5 gpt-oss-120b; do
  for v in A B B A; do
    run $v bench_layer --model $m --decode --ts 1,2,4,8,16 >"$OUT/dec_${m}_$v.log" 2>&1
    echo "== $m $v"; grep "^decode" "$OUT/dec_${m}_$v.log" | sed 's/ graph ext: chain/ ext/; s/| [0-9]* CTAs.*//' | cut -c1-130
  done
done
echo "== decode-delay with the knob at $((SECONDS - T0)) s"
TARGETS=test_cuda_decode DELAY_EXTRA="FM_DECODE_DYNAMIC=1" DELAY_S=120 DELAY_SAN_S=$((560 - (SECONDS - T0) > 300 ? 150 : 60)) CTEST=0 \
  bash bench/gpu-check.sh decode-delay 2>&1 | grep -E "delayed|test_cuda_decode|FAILED" | grep -v "^--"
echo "== done in $((SECONDS - T0)) s"
