#!/usr/bin/env bash
# wip/next-call-5.sh - issue 32 (wip/planner-waves.patch): the planner's cost model with a partial
# last wave, the bandwidth share under one wave and X bytes from L2, refitted on GLM-5 (H200) and
# gpt-oss-120b (H100) tile timings, against main's model in the whole layer, in one call:
#   1. A = main: bench_layer and its libfp4moe_dev.so copied
#   2. B = the patch applied (host C only: cost_fp4moe.c and the .inc), rebuilt, copied; the patch
#      taken back and its files touched when the call ends (wip/README.md)
#   3. test_plan_rank (CPU: the C model's picks = the fit's) in B's build
#   4. bench_layer (graph replay, the planner's plans; T = 1 / 2 at EP shards run the decode
#      kernel either way) rounds A B B A for GLM-5 at T = 4, 16, 64, 256 and gpt-oss-120b at
#      T = 4, 64, 256 (ep8 and all-local rows); the plan lines say which tiles each picked
#   run: bash wip/next-call-5.sh      carry [".debs"], timeout 600
set -uo pipefail
T0=$SECONDS
. bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
B=$OUT/../ab-bin
PATCH=wip/planner-waves.patch
FILES=$(grep -E '^\+\+\+ b/' $PATCH | sed 's|^+++ b/||')
patched=0
unpatch() { [ $patched = 1 ] && { patch -p1 -R -s <$PATCH; touch $FILES; patched=0; }; return 0; }
trap 'unpatch; type fm_pack_out >/dev/null 2>&1 && fm_pack_out' EXIT
build() { # $1: name
  cmake -S . -B build-gpu -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="-I$SYS/usr/include" -DFM_DECODE_DEFS= >"$OUT/cfg-$1.log" 2>&1 &&
    cmake --build build-gpu -j16 --target bench_layer test_plan_rank >"$OUT/build-$1.log" 2>&1 ||
    { tail -30 "$OUT/build-$1.log"; echo "BUILD $1 FAILED"; exit 1; }
  mkdir -p "$B/$1" && cp build-gpu/bench/bench_layer build-gpu/libfp4moe_dev.so "$B/$1/"
  echo "== built $1 at $((SECONDS - T0)) s: $(LD_PRELOAD="$B/$1/libfp4moe_dev.so" ldd "$B/$1/bench_layer" | grep fp4moe_dev)"
}
build A
patch -p1 --forward -s <$PATCH || { echo "PATCH FAILED"; exit 1; }
patched=1
build B
(cd build-gpu && timeout 120 ctest -R test_plan_rank --output-on-failure) >"$OUT/plan_rank.log" 2>&1
echo "test_plan_rank (B): $(grep -E 'tests passed|Failed' "$OUT/plan_rank.log" | tail -1)"
unpatch
run() { local v=$1; shift; timeout 150 env LD_PRELOAD="$B/$v/libfp4moe_dev.so" "$B/$v/bench_layer" "$@"; }
for m in glm5 gpt-oss-120b; do
  ts=4,16,64,256; [ $m = glm5 ] || ts=4,64,256
  for v in A B B A; do
    [ $((SECONDS - T0)) -gt 540 ] && { echo "== out of time at $m $v"; break; }
    run $v --model $m --ts $ts >"$OUT/layer_${m}_$v.log" 2>&1
    echo "== $m $v"; grep -E "^(ep|local) " "$OUT/layer_${m}_$v.log" | cut -c1-100
  done
  for v in A B; do echo "-- $v's plans"; grep -E "^#   plan:" "$OUT/layer_${m}_$v.log" | cut -c1-150; done
done
echo "== done in $((SECONDS - T0)) s"
