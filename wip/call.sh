#!/usr/bin/env bash
# session driver (not committed): stage A validate, B decode-delay, C timings (patched vs main)
set -uo pipefail
ST=$1; T0=$SECONDS
PATCHES="decode-mbarrier w4a8-nvfp4-f16 w4a8-ws router-oneshot decode-gptoss"
. bench/device_env.sh
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "$ST" = C ]; then  # main's source, before patching, for the same-call baseline
  rm -rf /tmp/mainsrc && mkdir -p /tmp/mainsrc && tar --exclude='./build*' --exclude='./.ncclep*' --exclude=./out -cf - . | tar -xf - -C /tmp/mainsrc
fi
[ "$ST" = D ] || for p in $PATCHES; do patch -p1 --forward -s < wip/$p.patch || { echo "PATCH $p FAILED"; exit 1; }; done
echo "patched"
if [ "$ST" = A ]; then
  MUTANTS=OFF CTEST_J=3 CTEST_S=${CS_S:-280} BENCH=0 CTEST_ARGS="-R decode|gate_up|fp8|test_cuda_layer$|gptoss|dispatch|route" bash bench/gpu-check.sh w4a8
  grep -E "Failed|\*\*\*|FAIL" "$OUT/ctest.log" | head -20
  for k in ws64 ws128; do
    echo "== FM_W4A8_KERNEL=$k"
    FM_W4A8_KERNEL=$k timeout 60 build-gpu/tests/test_cuda_fp8mma >"$OUT/fp8mma_$k.log" 2>&1; echo "test_cuda_fp8mma rc=$? $(grep -E 'PASSED|FAILED' "$OUT/fp8mma_$k.log" | tail -2 | tr '\n' ' ')"
    FM_W4A8_KERNEL=$k timeout 90 build-gpu/tests/test_cuda_gptoss >"$OUT/gptoss_$k.log" 2>&1; echo "test_cuda_gptoss rc=$? $(grep -E 'PASSED|FAILED' "$OUT/gptoss_$k.log" | tail -2 | tr '\n' ' ')"
    FM_W4A8_KERNEL=$k timeout 90 build-gpu/tests/test_cuda_layer >"$OUT/layer_$k.log" 2>&1; echo "test_cuda_layer rc=$? $(grep -E 'PASSED|FAILED' "$OUT/layer_$k.log" | tail -2 | tr '\n' ' ')"
  done
  grep -h "oneshot" "$OUT/ctest.log" | head -3
  left=$((560 - SECONDS)); echo "== racecheck test_cuda_route (${left} s left)"
  [ $left -gt 40 ] && { FM_QUICK=1 timeout $((left-10)) "$CS" --tool racecheck --error-exitcode 9 build-gpu/tests/test_cuda_route >"$OUT/racecheck_route.log" 2>&1; echo "racecheck route rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_route.log")"; }
  left=$((560 - SECONDS)); [ $left -gt 40 ] && { FM_W4A8_KERNEL=ws64 FM_QUICK=1 timeout $((left-10)) "$CS" --tool racecheck --error-exitcode 9 build-gpu/tests/test_cuda_fp8mma >"$OUT/racecheck_ws.log" 2>&1; echo "racecheck fp8mma ws64 rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_ws.log")"; }
fi
if [ "$ST" = B ]; then
  DELAY_SAN_S=200 CTEST=0 MUTANTS=OFF bash bench/gpu-check.sh decode-delay
fi
if [ "$ST" = C ]; then
  ( cd /tmp/mainsrc && cmake -S . -B /tmp/build-main -DFM_CUDA_ARCHS=native -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" -DFM_DECODE_DEFS= >/tmp/bm.log 2>&1 && nice cmake --build /tmp/build-main -j12 --target bench_layer >>/tmp/bm.log 2>&1; echo "main build rc=$? at $SECONDS s" >>/tmp/bm.log ) &
  BM=$!
  MUTANTS=OFF CTEST=0 TARGETS="bench_layer bench_route bench_fp8mma" DECODE="1,2,4,8,16" DECODE_SPLITS="auto,12/8,6/4" bash bench/gpu-check.sh session
  echo "== bench_route"; timeout 60 build-gpu/bench/bench_route --ts 1,2,4,8,16 --reps 30 2>&1 | tee "$OUT/bench_route.log" | tail -30
  for m in deepseek-v3 qwen3-235b gpt-oss-120b; do echo "== $m decode (patched)"; timeout 60 build-gpu/bench/bench_layer --model $m --decode --ts 1,2,4,8,16,32 >"$OUT/dec_$m.log" 2>&1; grep "^decode" "$OUT/dec_$m.log"; done
  wait $BM; tail -2 /tmp/bm.log
  if [ -x /tmp/build-main/bench/bench_layer ]; then
    echo "== main: bench_layer --decode"; timeout 80 /tmp/build-main/bench/bench_layer --decode --ts 1,2,4,8,16 --decode-splits auto,12/8,6/4 >"$OUT/main_decode.log" 2>&1; grep "^decode" "$OUT/main_decode.log"
    for m in deepseek-v3 qwen3-235b; do echo "== $m decode (main)"; timeout 60 /tmp/build-main/bench/bench_layer --model $m --decode --ts 1,2,4,8,16,32 >"$OUT/main_dec_$m.log" 2>&1; grep "^decode" "$OUT/main_dec_$m.log"; done
    echo "== patched again: bench_layer --decode"; timeout 80 build-gpu/bench/bench_layer --decode --ts 1,2,4,8,16 --decode-splits auto,12/8,6/4 >"$OUT/bench_decode2.log" 2>&1; grep "^decode" "$OUT/bench_decode2.log"
  fi
  echo "== bench_fp8mma"; timeout 90 build-gpu/bench/bench_fp8mma >"$OUT/bench_fp8mma.log" 2>&1; grep -v "^csv" "$OUT/bench_fp8mma.log" | tail -40
fi
if [ "$ST" = D ]; then
  for p in decode-gptoss router-oneshot-auto w4a8-auto-ws128; do patch -p1 --forward -s < wip/$p.patch || { echo "PATCH $p FAILED"; exit 1; }; done
  MUTANTS=OFF CTEST_J=4 CTEST_S=110 TARGETS="fp4moe bench_layer bench_route test_cuda_decode test_cuda_route test_cuda_layer" CTEST_ARGS="-R decode|route|test_cuda_layer$" BENCH=0 bash bench/gpu-check.sh w4a8
  grep -E "Failed|FAIL" "$OUT/ctest.log" | head
  echo "== bench_route"; timeout 25 build-gpu/bench/bench_route --ts 1,2,4,8 --reps 20 2>&1 | tail -5
  echo "== gpt-oss decode"; timeout 30 build-gpu/bench/bench_layer --model gpt-oss-120b --decode --ts 1,2,4 >"$OUT/dec_oss.log" 2>&1; grep "^decode" "$OUT/dec_oss.log" | cut -c1-170
  for k in w4a16 wg64 auto; do act="--act-fp8 block128"; [ $k = w4a16 ] && act=""; echo "== gpt-oss $k"; FM_W4A8_KERNEL=$([ $k = w4a16 ] || echo $k) timeout 30 build-gpu/bench/bench_layer --model gpt-oss-120b --ts 4096 --reps 8 $act >"$OUT/oss_$k.log" 2>&1; grep -v "^csv" "$OUT/oss_$k.log" | tail -4 | cut -c1-200; done
fi
echo "== stage $ST done in $((SECONDS - T0)) s"
