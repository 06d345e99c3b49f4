#!/usr/bin/env bash
# wip/next-call-4.sh - issue 31 (wip/decode-units.patch): the decode kernel's units by strides
# (T = 1) or from its counter (T >= 2), now a run-time choice of one kernel (fm_decode_params.dynamic; $FM_DECODE_UNITS =
# static / counter / auto, read at create) after the build-time knob's A/B (2026-12-07: the
# counter 1.0-1.3 us slower at T = 1, faster from T = 2). One build, in one call:
#   1. test_cuda_decode (test_decode_units: counter = strides bit for bit, vs cpu-ref, rest
#      state; the layer tests run strides at T = 1 and the counter from T = 2)
#   2. bench_layer --decode, GLM-5 static auto, gpt-oss-120b static auto, then GLM-5 auto static
#      where time is left
#      (the same binary and library: the knob is read at create)
#   3. time allowing: decode.cu rebuilt with random CTA delays (FM_DECODE_DELAY), the delayed
#      test_cuda_decode once (both unit forms run in it)
#   then (decode-tl.patch) the phase timeline of a FM_DECODE_TL probe build at T = 1, 2, 4
#   run: bash wip/next-call-4.sh      carry [".debs"], timeout <= 560
set -uo pipefail
T0=$SECONDS
LIMIT=${LIMIT:-470}
. bench/device_env.sh
# the change (wip/decode-units.patch) applied to the device's copy, and taken back when the call
# ends with its files touched, so that a warm machine's next build recompiles them (wip/README.md)
# wip/decode-shared.patch (on top: test_cuda_decode's shared-expert case, AUTO with it) too
PATCHES=${PATCHES:-wip/decode-shared.patch}
FILES=$(cat $PATCHES | grep -E '^\+\+\+ b/' | sed 's|^+++ b/||' | sort -u)
# the files as they were, restored at the end (patch -R of a two-commit patch that touches one
# file twice fails), files the patches create removed
NEWF=$(for f in $FILES; do [ -e "$f" ] || echo "$f"; done)
tar -cf /tmp/prepatch.tar $(for f in $FILES; do [ -e "$f" ] && echo "$f"; done)
unpatch() {
  tar -xf /tmp/prepatch.tar; [ -n "$NEWF" ] && rm -f $NEWF
  touch -c $FILES
  cmake -S . -B build-gpu -DFM_DECODE_DEFS= >/dev/null 2>&1 # a warm machine's next build: the default decode.cu
}
trap 'unpatch; type fm_pack_out >/dev/null 2>&1 && fm_pack_out' EXIT
for q in $PATCHES; do patch -p1 --forward -s <$q || { echo "PATCH $q FAILED"; exit 1; }; done
echo "== patched: $PATCHES ($(echo $FILES | wc -w) files)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B build-gpu -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="-I$SYS/usr/include" -DFM_DECODE_DEFS= >"$OUT/cfg.log" 2>&1 &&
  cmake --build build-gpu -j16 --target bench_layer test_cuda_decode test_cuda_layer fp4moe_cli >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
echo "== built at $((SECONDS - T0)) s"
timeout 150 build-gpu/tests/test_cuda_decode >"$OUT/test_decode.log" 2>&1
echo "test_cuda_decode: rc=$?  $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_decode.log" | tr '\n' ' ')"
grep -E "counter = strides|shared expert T=( 1| 4|32)|FAILED|ERROR|LINE" "$OUT/test_decode.log" | head -16
FM_TEST_FILTER=test_layer_plans timeout 90 build-gpu/tests/test_cuda_layer >"$OUT/test_plans.log" 2>&1
echo "test_cuda_layer (test_layer_plans: the plan file, 1e300 refused): rc=$?  $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_plans.log" | tr '\n' ' ')"
echo "== tests done at $((SECONDS - T0)) s"
bl() { # $1 model, $2 units
  FM_DECODE_UNITS=$2 timeout 60 build-gpu/bench/bench_layer --model $1 --decode --ts ${TS:-1,2,4,8,16} >"$OUT/dec_$1_$2_$3.log" 2>&1
  echo "== $1 FM_DECODE_UNITS=$2"
  grep "^decode" "$OUT/dec_$1_$2_$3.log" | grep -v local | sed 's/ graph ext: chain/ ext/; s/| [0-9]* CTAs.*//' | cut -c1-130
}
bl glm5 static 1; bl glm5 auto 1
TS=1,2 bl deepseek-v3 auto 1
[ $((LIMIT - (SECONDS - T0))) -gt 40 ] && { bl gpt-oss-120b static 1; bl gpt-oss-120b auto 1; }
# ncu of the decode kernel, the chain's kernels and the routing kernels at the EP8 shard, T = 1 and 4
# (probe.sh decode; the default build's fp4moe, built above, so probe.sh builds nothing)
left=$((LIMIT - (SECONDS - T0)))
echo "== ncu at $((SECONDS - T0)) s ($left s left)"
[ "${NCU_STEP:-1}" = 1 ] && [ $left -gt 200 ] && RUN_ARGS="--global-experts 256 --shard 32:32" \
  timeout $((left > 260 ? 120 : left - 140)) bash bench/probe/probe.sh decode ${NCU_TS:-1 4}
# the decode kernel's phase timeline (decode-tl.patch: a FM_DECODE_TL probe build of decode.cu)
left=$((LIMIT - (SECONDS - T0)))
echo "== phase timeline at $((SECONDS - T0)) s ($left s left)"
if [ $left -gt 130 ]; then
  cmake -S . -B build-gpu -DFM_DECODE_DEFS="FM_DECODE_TL=1" >"$OUT/cfg-tl.log" 2>&1 &&
    timeout $((left - 50)) cmake --build build-gpu -j16 --target bench_layer >"$OUT/build-tl.log" 2>&1 &&
    { echo "== TL build at $((SECONDS - T0)) s"
      timeout 60 build-gpu/bench/bench_layer --model glm5 --decode --ts ${TL_TS:-1,2,4} --reps 10 >"$OUT/tl.log" 2>&1
      echo "bench_layer (TL): rc=$?"; grep -E "^decode" "$OUT/tl.log" | grep -v local | cut -c1-420; }
  cmake -S . -B build-gpu -DFM_DECODE_DEFS= >/dev/null 2>&1
fi
# the second GLM-5 round (auto, static) where 80 s are left (the default decode.cu rebuilt)
[ $((LIMIT - (SECONDS - T0))) -gt 120 ] && cmake --build build-gpu -j16 --target bench_layer >"$OUT/build-2.log" 2>&1 &&
  { bl glm5 auto 2; bl glm5 static 2; }
left=$((LIMIT - (SECONDS - T0)))
echo "== delayed CTAs at $((SECONDS - T0)) s ($left s left)"
if [ $left -gt 200 ]; then
  cmake -S . -B build-gpu -DFM_DECODE_DEFS="FM_DECODE_DELAY=1" >"$OUT/build-delay.log" 2>&1 &&
    timeout $((left - 90)) cmake --build build-gpu -j16 --target test_cuda_decode >>"$OUT/build-delay.log" 2>&1 &&
    { echo "== delay build at $((SECONDS - T0)) s";
      timeout $((LIMIT - (SECONDS - T0) - 5)) build-gpu/tests/test_cuda_decode >"$OUT/decode_delay.log" 2>&1
      echo "test_cuda_decode, delayed CTAs: rc=$?  $(grep -E '^\[  (PASSED|FAILED) |OK \]' "$OUT/decode_delay.log" | tr '\n' ' ')"; }
fi
echo "== done in $((SECONDS - T0)) s"
