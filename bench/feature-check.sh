#!/usr/bin/env bash
# feature-check.sh - one device call for a new feature's first GPU run, in priority order under
# one deadline (a call may run 600 s): build (native, everything), the feature's GPU tests, the
# feature's tests under memcheck / racecheck, its benchmarks, then the rest of ctest -L gpu.
# Each step gets what is left of the deadline; what did not run is said, never skipped silently.
# Usage (repo root, carry [".debs"]):
#   TESTS='test_cuda_gptoss|test_cuda_decode' SAN='test_cuda_decode:test_decode_layer' \
#   BENCHES='--decode --ts 1,2,4,8,16,32,64 --reps 64;--model gpt-oss-120b --reps 32' bash bench/feature-check.sh
#   TESTS   ctest -R regex run first (default: the GPU tests of the gpt-oss and dispatch features)
#   SAN     space-separated test:filter pairs run under memcheck then racecheck (FM_TEST_FILTER)
#   BENCHES ';'-separated bench_layer argument lists
#   REST=0  skip the rest of ctest -L gpu;  DEADLINE (s, default 585)
#   BUILD_DIR (default build-gpu; build-all with ARCHS=all reuses what ship-check.sh all left on a warm machine)
#   CTEST_J parallel GPU tests (default 1)
set -uo pipefail
. bench/device_env.sh
T0=$SECONDS
BD=${BUILD_DIR:-build-gpu}
DEADLINE=${DEADLINE:-585}
left() { local l=$((DEADLINE - (SECONDS - T0))); [ $l -lt 1 ] && l=1; [ -n "${1:-}" ] && [ "$1" -lt $l ] && l=$1; echo $l; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader | tee "$OUT/nvidia-smi.txt"
python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"triton\", triton.__version__, \"cuda\", torch.version.cuda)" 2>&1 | tail -1
python3 -c "import transformers; print(\"transformers\", transformers.__version__)" 2>&1 | tail -1
python3 -c "import triton_kernels, os; print(\"triton_kernels at\", os.path.dirname(triton_kernels.__file__))" 2>&1 | tail -1
pip list 2>/dev/null | grep -i -E "^(vllm|flashinfer|triton|sglang|kernels)" | tr "\n" " "; echo
echo "== build (FM_CUDA_ARCHS=${ARCHS:-native})"
B0=$SECONDS
{ cmake -S . -B $BD -DFM_CUDA_ARCHS=${ARCHS:-native} -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="-I$SYS/usr/include" && timeout $(left) cmake --build $BD -j16; } >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build: $((SECONDS - B0)) s"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
TESTS=${TESTS:-test_cuda_gptoss|test_cuda_dispatch|test_cuda_backend|test_layer_contract}
echo "== ctest -R '$TESTS' (at $((SECONDS - T0)) s)"
(cd $BD && timeout $(left) ctest -R "$TESTS" -j${CTEST_J:-1} --output-on-failure --timeout 300) >"$OUT/ctest_feature.log" 2>&1
grep -E "tests passed|Test +#|Failed|SKIP|FAIL|ERROR|nmse|NMSE" "$OUT/ctest_feature.log" | tail -40
for pair in ${SAN:-}; do
  t=${pair%%:*}; f=${pair#*:}
  for tool in memcheck racecheck; do
    [ $(left) -le 60 ] && { echo "$tool $t $f: NOT RUN (deadline)"; continue; }
    FM_TEST_FILTER=$f timeout $(left 150) "$CS" --tool $tool --error-exitcode 9 $BD/tests/$t >"$OUT/${tool}_$t.log" 2>&1
    echo "$tool $t ($f) rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/${tool}_$t.log" | tail -1)"
  done
done
i=0
IFS=';' read -r -a BL <<<"${BENCHES:-}"
for args in "${BL[@]}"; do
  i=$((i + 1))
  [ $(left) -le 30 ] && { echo "bench_layer $args: NOT RUN (deadline)"; continue; }
  echo "== bench_layer $args (at $((SECONDS - T0)) s)"
  timeout $(left 200) $BD/bench/bench_layer $args >"$OUT/bench_layer$i.log" 2>&1 || echo "(rc=$?)"
  grep -v "^csv" "$OUT/bench_layer$i.log" | tail -60
done
if [ "${REST:-1}" != 0 ]; then
  if [ $(left) -le 30 ]; then echo "== rest of ctest -L gpu: NOT RUN (deadline)"
  else
    echo "== ctest -L gpu -E '$TESTS' (at $((SECONDS - T0)) s, $(left) s left)"
    (cd $BD && timeout $(left) ctest -L gpu -j${CTEST_J:-1} -E "$TESTS" --output-on-failure --timeout 300) >"$OUT/ctest_rest.log" 2>&1
    grep -E "tests passed|Test +#|Failed|SKIP" "$OUT/ctest_rest.log" | tail -30
  fi
fi
echo "== done at $((SECONDS - T0)) s"
