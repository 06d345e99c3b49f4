#!/usr/bin/env bash
# wip/next-call.sh - the next session's first device call (wip/README.md): the five patches of
# wip/ applied to the device's copy in order, their tests, then their timings, in one call:
#   run: bash wip/next-call.sh      carry [".debs"], timeout 600 (about 420 s on an H100)
# Every log lands in $OUT (packed into one logs-<pid>.tgz at exit by bench/device_env.sh).
set -uo pipefail
T0=$SECONDS
. bench/device_env.sh
for p in decode-gptoss router-oneshot-auto w4a8-auto-ws128 route-smem route-fused; do
  patch -p1 --forward -s < wip/$p.patch || { echo "PATCH $p FAILED"; exit 1; }
done
echo "== patched: decode-gptoss router-oneshot-auto w4a8-auto-ws128 route-smem route-fused"
# 1. the tests the patches touch (decode: the gpt-oss twin; route: oneshot as the pick, the
#    routing kernel's shared-memory working set; layer: internal routing through both, W4A8 auto)
MUTANTS=OFF CTEST_J=4 CTEST_S=200 BENCH=0 \
  TARGETS="fp4moe bench_layer bench_route test_cuda_decode test_cuda_route test_cuda_layer test_cuda_gptoss" \
  CTEST_ARGS="-R decode|route|test_cuda_layer$|gptoss" bash bench/gpu-check.sh w4a8
grep -E "Failed|FAIL" "$OUT/ctest.log" | head
# 2. router logits by kind (oneshot now auto at T <= 4)
echo "== bench_route"; timeout 40 build-gpu/bench/bench_route --ts 1,2,4,8,16 --reps 30 2>&1 | tail -6
# 3. decode and internal routing (the "int" columns: at T <= 4 the fused logits + routing launch)
for m in glm5 gpt-oss-120b; do
  echo "== $m --decode"
  timeout 60 build-gpu/bench/bench_layer --model $m --decode --ts 1,2,4,8,16 >"$OUT/dec_$m.log" 2>&1
  grep "^decode" "$OUT/dec_$m.log" | cut -c1-170
done
# 4. the routing kernels' own times under ncu (router logits, route_kernel; GLM-5, T = 1)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 90 "$NCU" --clock-control none -k regex:route --launch-count 12 --metrics gpu__time_duration.sum,launch__grid_size \
  build-gpu/bench/bench_layer --ts 1 --reps 3 >"$OUT/ncu_int.log" 2>&1
awk '/^  [a-zA-Z_].*\(/ {k=$1} /gpu__time_duration.sum/ {printf "%-40s %s %s\n", substr(k,1,40), $(NF-1), $NF}' "$OUT/ncu_int.log" | head -30
# 5. W4A8 on gpt-oss: the automatic pick (ws128 from 96 rows per expert) against wg64 and W4A16
for k in w4a16 wg64 auto; do
  act="--act-fp8 block128"; [ $k = w4a16 ] && act=""
  echo "== gpt-oss-120b $k"
  FM_W4A8_KERNEL=$([ $k = w4a16 ] || [ $k = auto ] || echo $k) timeout 60 build-gpu/bench/bench_layer \
    --model gpt-oss-120b --ts 256,1024,4096 --reps 10 $act >"$OUT/oss_$k.log" 2>&1
  grep -v "^csv" "$OUT/oss_$k.log" | tail -8 | cut -c1-200
done
echo "== done in $((SECONDS - T0)) s"
