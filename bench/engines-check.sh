#!/usr/bin/env bash
# engines-check.sh - issue 33's device run: the transformers integration's tests (tests/engines,
# ctest engine_transformers) on the GPU with the device image's torch and transformers, then
# bench/transformers_decode.py (decode tokens/s and memory, fp4moe experts against transformers'
# own). Reuses BUILD_DIR (default build-all, as ship-check.sh all leaves it on a warm machine),
# else builds the shared library for the native GPU. pytest: the image's if it has one, else
# the carried .pydeps (scripts/requirements.txt's pins, `pip install --no-deps --target .pydeps`),
# said in the log. Logs under $OUT; carry [".debs", ".pydeps"].
#   TD_ARGS   arguments of transformers_decode.py;  TESTS=0 / BENCH=0 skip a step
set -uo pipefail
. bench/device_env.sh
BD=${BUILD_DIR:-build-all}
LIB=$BD/python/libfp4moe.so
if [ ! -f "$LIB" ]; then
  BD=build-eng
  LIB=$BD/python/libfp4moe.so
  echo "== build $BD (native, the shared library only)"
  { cmake -S . -B $BD -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_FLAGS="-I$SYS/usr/include" && cmake --build $BD -j16 --target fp4moe_shared; } >"$OUT/build-eng.log" 2>&1 ||
    { tail -30 "$OUT/build-eng.log"; echo "BUILD FAILED"; exit 1; }
fi
PP=$PWD/python
if python3 -c "import pytest" 2>/dev/null; then echo "pytest: the image's ($(python3 -c 'import pytest; print(pytest.__version__)'))"
else PP=$PP:$PWD/.pydeps; echo "pytest: not in the image, the carried .pydeps ($(PYTHONPATH=.pydeps python3 -c 'import pytest; print(pytest.__version__)'))"; fi
export PYTHONPATH=$PP FP4MOE_LIBRARY=$PWD/$LIB PYTHONDONTWRITEBYTECODE=1
python3 -c "import torch, transformers, fp4moe; print('torch', torch.__version__, 'transformers', transformers.__version__, 'fp4moe', fp4moe.__version__, 'device', torch.cuda.get_device_name())"
if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests/engines on the GPU (engine_transformers)"
  t0=$SECONDS
  timeout ${TESTS_S:-300} python3 tests/engines/run.py >"$OUT/engines.log" 2>&1
  echo "engine_transformers exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/table.txt"
  grep -E "passed|failed|error|SKIP|skipped|nmse|NMSE|FP4MOE_TEST_SEED" "$OUT/engines.log" | tail -30
fi
if [ "${BENCH:-1}" = 1 ]; then
  echo "== bench/transformers_decode.py ${TD_ARGS:-}"
  timeout ${BENCH_S:-400} python3 bench/transformers_decode.py --csv "$OUT/transformers_decode.csv" ${TD_ARGS:-} \
    >"$OUT/transformers_decode.log" 2>&1 || { echo "transformers_decode exit $?"; tail -20 "$OUT/transformers_decode.log"; }
  grep -v "^Setting\|warn" "$OUT/transformers_decode.log" | tail -20 | tee -a "$OUT/table.txt"
fi
