#!/usr/bin/env bash
# wip/next-call-prof.sh - issue 31's profile of the one-launch decode kernel, GLM-5's EP8 shard,
# with $PATCHES applied to the device's copy (default: decode-units, decode-shared, decode-tl;
# taken back and the files touched at the end):
#   1. the phase timeline (a FM_DECODE_TL probe build of decode.cu; bench_layer --decode prints
#      decode-tl lines: span, entry / routed / FC1 done / FC2 done / exit, FC2's flag waits) at
#      T = 1, 2, 4 (TL_TS)
#   2. ncu of the decode kernel and the chain's kernels at T = 1 and 4 (probe.sh decode, the
#      default build; RUN_ARGS the shard: --global-experts 256 --shard 32:32)
#   run: bash wip/next-call-prof.sh      carry [".debs"], timeout <= 420; LIMIT= its budget (s)
set -uo pipefail
T0=$SECONDS
LIMIT=${LIMIT:-400}
. bench/device_env.sh
PATCHES=${PATCHES-wip/decode-shared.patch}
FILES=$(cat /dev/null $PATCHES | grep -E '^\+\+\+ b/' | sed 's|^+++ b/||' | sort -u)
NEWF=$(for f in $FILES; do [ -e "$f" ] || echo "$f"; done)
tar -cf /tmp/prepatch.tar $(for f in $FILES; do [ -e "$f" ] && echo "$f"; done) /dev/null 2>/dev/null
unpatch() {
  tar -xf /tmp/prepatch.tar 2>/dev/null; [ -n "$NEWF" ] && rm -f $NEWF
  [ -n "$FILES" ] && touch -c $FILES
  cmake -S . -B build-gpu -DFM_DECODE_DEFS= >/dev/null 2>&1 # a warm machine's next build: the default decode.cu
  type fm_pack_out >/dev/null 2>&1 && fm_pack_out
  return 0
}
trap unpatch EXIT
for q in $PATCHES; do patch -p1 --forward -s <$q || { echo "PATCH $q FAILED"; exit 1; }; done
echo "== patched: ${PATCHES:-none}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B build-gpu -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="-I$SYS/usr/include" -DFM_DECODE_DEFS="FM_DECODE_TL=1" >"$OUT/cfg-tl.log" 2>&1 &&
  cmake --build build-gpu -j16 --target bench_layer >"$OUT/build-tl.log" 2>&1 ||
  { tail -30 "$OUT/build-tl.log"; echo "BUILD (TL) FAILED"; exit 1; }
echo "== TL build at $((SECONDS - T0)) s"
timeout 90 build-gpu/bench/bench_layer --model glm5 --decode --ts ${TL_TS:-1,2,4} --reps 10 >"$OUT/tl.log" 2>&1
echo "bench_layer (TL): rc=$?"
grep -E "^decode" "$OUT/tl.log" | grep -v local | cut -c1-400
cmake -S . -B build-gpu -DFM_DECODE_DEFS= >"$OUT/cfg-def.log" 2>&1
rm -f build-gpu/fp4moe # probe.sh builds it when absent: the default decode.cu
left=$((LIMIT - (SECONDS - T0)))
echo "== ncu at $((SECONDS - T0)) s ($left s left)"
[ $left -gt 60 ] && RUN_ARGS=${RUN_ARGS-"--global-experts 256 --shard 32:32"} timeout $((left - 15)) \
  bash bench/probe/probe.sh decode ${TS:-1 4}
# issue 34's evidence: one W4A8 launch at 256 rows per expert under ncu (issue slots, pipes)
left=$((LIMIT - (SECONDS - T0)))
echo "== W4A8 ncu at $((SECONDS - T0)) s ($left s left)"
[ $left -gt 100 ] && timeout $((left - 10)) bash bench/probe/probe.sh fp8 EP8-FC1 256 staged64
left=$((LIMIT - (SECONDS - T0)))
[ $left -gt 40 ] && timeout $((left - 5)) bash bench/probe/probe.sh fp8 OSS8-FC1 256 ws128
echo "== done in $((SECONDS - T0)) s"
