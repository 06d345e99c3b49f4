#!/usr/bin/env bash
# wip/next-call-3.sh - issue 31: the decode kernel with its units taken from a counter
# (FM_DECODE_DYNAMIC, decode_parts.cuh; on main as a build-time knob, off, never run) against the
# default build, in one call:
#   1. the default build (A): bench_layer, test_cuda_decode; binaries and libfp4moe_dev.so copied
#   2. the knob's builds, B = FM_DECODE_DYNAMIC=1 (the next unit taken as one starts) and
#      C = 2 (as one ends): the same, copied; their test_cuda_decode (decode = chain bit for bit,
#      graph replays = eager: a counter left non-zero would show there)
#   3. bench_layer --decode, GLM-5 rounds A B C C B A, gpt-oss-120b A B C, T = 1..16 (each run
#      preloads its own library: wip/README.md's lesson)
#   4. if time is left, the faster knob with random CTA delays: gpu-check.sh decode-delay
#      (plain x2; memcheck and racecheck as time allows); else that is the next call
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
build C "FM_DECODE_DYNAMIC=2"
for v in B C; do
  run $v test_cuda_decode >"$OUT/test_decode_$v.log" 2>&1
  echo "test_cuda_decode ($v): rc=$?  $(grep -E 'PASSED|FAILED' "$OUT/test_decode_$v.log" | tail -2 | tr '\n' ' ')"
done
for m in glm5 gpt-oss-120b; do
  vs="A B C C B A"; [ $m = glm5 ] || vs="A B C"
  for v in $vs; do
    run $v bench_layer --model $m --decode --ts 1,2,4,8,16 >"$OUT/dec_${m}_$v.log" 2>&1
    echo "== $m $v"; grep "^decode" "$OUT/dec_${m}_$v.log" | sed 's/ graph ext: chain/ ext/; s/| [0-9]* CTAs.*//' | cut -c1-130
  done
done
left=$((560 - (SECONDS - T0)))
echo "== decode-delay with FM_DECODE_DYNAMIC=${DYN:-2} at $((SECONDS - T0)) s ($left s left)"
[ $left -gt 200 ] && TARGETS=test_cuda_decode DELAY_EXTRA="FM_DECODE_DYNAMIC=${DYN:-2}" DELAY_S=90 DELAY_SAN_S=$(((left - 200) / 2)) CTEST=0 \
  bash bench/gpu-check.sh decode-delay 2>&1 | grep -E "delayed|test_cuda_decode|FAILED" | grep -v "^--"
echo "== done in $((SECONDS - T0)) s"
