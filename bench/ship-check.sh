#!/usr/bin/env bash
# ship-check.sh - the shipping issue's device runs (carry .debs: cmocka and cJSON, which
# the device image lacks). Logs under $OUT; a short table last.
#   all      the `all` build timed (-j16), ctest -L gpu (CTEST_R: a -R filter) + test_kernel_resources,
#            test_plan_*, test_layer_supports (cpu-labelled; its cuda cases need the device) on it,
#            fp4moe devices, cold start with the driver cache off, cubin bytes per target,
#            bench_layer (the usual table) on it
#   native   the `native` build timed, the rebuild after touching one kernel header,
#            bench_layer on it (the no-regression check against `all`)
#   refuse   a build of sm_80 SASS only (no code this device runs: refused at open) and one
#            of compute_80 PTX only (JIT at open, no wgmma, every --check passes)
# Usage (repo root): bench/ship-check.sh all|native|refuse
set -uo pipefail
MODE=${1:-all}
. bench/device_env.sh
J=${J:-16}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/nvidia-smi.txt"
nvcc --version | tail -2
conf() { # dir archs [targets...]
  local d=$1 a=$2; shift 2
  cmake -S . -B "$d" -DFM_CUDA_ARCHS="$a" -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="-I$SYS/usr/include" >"$OUT/conf-$a.log" 2>&1 || { tail -20 "$OUT/conf-$a.log"; return 1; }
}
timed_build() { # dir label targets...
  local d=$1 l=$2; shift 2
  local t0=$(date +%s%N)
  cmake --build "$d" -j$J ${1:+--target "$@"} >"$OUT/build-$l.log" 2>&1 || { tail -30 "$OUT/build-$l.log"; echo "BUILD $l FAILED"; return 1; }
  local t1=$(date +%s%N)
  printf "build %-12s %5d.%01d s (-j%s)\n" "$l" $(( (t1 - t0) / 1000000000 )) $(( (t1 - t0) / 100000000 % 10 )) "$J" | tee -a "$OUT/table.txt"
}
units_table() { # the longest CUDA units of a build (scripts/nvcc-resources.sh writes OBJ.secs)
  find "$1/CMakeFiles/fp4moe.dir" -name '*.o.secs' -exec sh -c 'printf "%s %s\n" "$(cat "$1")" "$(basename "$1" .o.secs)"' _ {} \; |
    sort -rn | awk 'NR <= 8 { printf "unit %-22s %6.1f s\n", $2, $1 / 1000 } { s += $1 } END { printf "units %d, %.0f s of compiler time in all\n", NR, s / 1000 }' |
    tee -a "$OUT/table.txt"
}
if [ "$MODE" = all ]; then
  conf build-all all && timed_build build-all all || exit 1
  ls -la build-all/libfp4moe.a build-all/python/libfp4moe.so | tee -a "$OUT/table.txt"
  units_table build-all
  (mkdir -p /tmp/cubins && cd /tmp/cubins && cuobjdump -xelf all "$OLDPWD/build-all/python/libfp4moe.so" >/dev/null 2>&1
   ls | sed 's/.*\.\(sm_[0-9a-z]*\)\.cubin$/\1/' | sort | uniq -c | tr '\n' ' '; echo
   for a in $(ls | sed 's/.*\.\(sm_[0-9a-z]*\)\.cubin$/\1/' | sort -u); do
     printf "cubins %-8s %8d KB in %3d files\n" $a $(( $(cat *.$a.cubin | wc -c) / 1024 )) $(ls *.$a.cubin | wc -l)
   done) | tee -a "$OUT/table.txt"
  build-all/fp4moe devices | tee "$OUT/devices.txt"
  echo "== cold start, driver cache off"
  for i in 1 2; do
    /usr/bin/time -f "wall %e s" env CUDA_CACHE_DISABLE=1 build-all/fp4moe run --tokens 1 --check --iters 5 2>&1 |
      grep -E "startup|check|wall|error" | tee -a "$OUT/table.txt"
  done
  echo "== ctest -L gpu (all build)"
  (cd build-all && timeout ${CTEST_S:-300} ctest -L gpu ${CTEST_R:+-R "$CTEST_R"} -j${CTEST_J:-1} --output-on-failure --timeout 240) >"$OUT/ctest.log" 2>&1
  grep -E "tests passed|Failed|\*\*\*|SKIP|Test +#" "$OUT/ctest.log" | tail -40
  (cd build-all && ctest -R 'test_kernel_resources|test_plan|test_layer_supports' --output-on-failure) >"$OUT/ctest-res.log" 2>&1
  grep -E "tests passed|Failed|checked" "$OUT/ctest-res.log" | tail -5
  cp build-all/kernel_resources.csv "$OUT/" 2>/dev/null
  if [ "${BENCH:-1}" = 1 ]; then
    echo "== bench_layer (all)"
    timeout ${LAYER_S:-200} build-all/bench/bench_layer ${LAYER_ARGS:-} >"$OUT/bench_layer_all.log" 2>&1 || tail -5 "$OUT/bench_layer_all.log"
    grep -v "^csv" "$OUT/bench_layer_all.log" | tail -25
  fi
fi
if [ "$MODE" = native ]; then
  conf build-nat native && timed_build build-nat native fp4moe fp4moe_cli bench_layer || exit 1
  units_table build-nat
  touch src/cuda/wgmma_ws.cuh
  timed_build build-nat touch-wgmma fp4moe && echo "rebuilt after touching wgmma_ws.cuh: $(grep -c 'Building CUDA' "$OUT/build-touch-wgmma.log") units" | tee -a "$OUT/table.txt"
  touch src/cuda/gemm_mma.cuh
  timed_build build-nat touch-mma fp4moe && echo "rebuilt after touching gemm_mma.cuh: $(grep -c 'Building CUDA' "$OUT/build-touch-mma.log") units" | tee -a "$OUT/table.txt"
  for b in nat all; do # the same table on both builds, in one call (all: left by the `all` call, if still here)
    [ -x build-$b/bench/bench_layer ] || { echo "(no build-$b here)"; continue; }
    echo "== bench_layer ($b)"
    timeout ${LAYER_S:-150} build-$b/bench/bench_layer ${LAYER_ARGS:-} >"$OUT/bench_layer_$b.log" 2>&1 || tail -5 "$OUT/bench_layer_$b.log"
    grep -v "^csv" "$OUT/bench_layer_$b.log" | tail -25
  done
fi
if [ "$MODE" = refuse ]; then
  conf build-80 80 && conf build-ptx compute_80 || exit 1
  J=8 timed_build build-80 sm80-only fp4moe_cli & J=8 timed_build build-ptx ptx-only fp4moe_cli & wait
  echo "== sm_80 SASS only on this GPU"
  build-80/fp4moe devices 2>&1 | tee "$OUT/devices-80.txt" | grep -E "build|code"
  build-80/fp4moe run --tokens 1 --check >"$OUT/run-80.log" 2>&1; echo "sm80-only: fp4moe run exit $? (want 1, no run): $(tail -1 "$OUT/run-80.log")" | tee -a "$OUT/table.txt"
  echo "== compute_80 PTX only on this GPU"
  t0=$(date +%s); build-ptx/fp4moe devices 2>&1 | grep -E "build|code" | tee -a "$OUT/table.txt"; echo "ptx: devices (first open, JIT) $(( $(date +%s) - t0 )) s" | tee -a "$OUT/table.txt"
  for T in ${PTX_TS:-1 16 256 1024 4096}; do
    # one log for every T: the device tool returns at most 8 files
    timeout 150 build-ptx/fp4moe run --tokens $T --check --iters 2 >/tmp/run-ptx.log 2>&1
    echo "ptx T=$T exit $? $(grep -E 'check|startup|plan ' /tmp/run-ptx.log | tr -s ' ' | tr '\n' ' ')" | tee -a "$OUT/table.txt"
    grep -q "wgmma" /tmp/run-ptx.log && echo "  WGMMA IN PLAN (must not be)" | tee -a "$OUT/table.txt"
    cat /tmp/run-ptx.log >>"$OUT/run-ptx.log"
  done
fi
echo "==== table"
cat "$OUT/table.txt"
