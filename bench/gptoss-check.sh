#!/usr/bin/env bash
# gptoss-check.sh - issue 32's comparison in one device call: fp4moe's gpt-oss-120b layer
# (bench_layer --model gpt-oss-120b) and OpenAI's triton_kernels as vLLM calls it
# (bench/gptoss_peer.py), same machine, same call; then fm_layer_tune against the planner on the
# all-local buckets where fp4moe is slowest (--sweep). Run from the repository root on the GPU
# machine with carry [".debs", ".triton_kernels"] (.triton_kernels: triton_kernels at the
# device triton's tag, see bench/gptoss_peer.py; never committed). Logs in $OUT.
#   TS (bench + peer token counts), SWEEP_TS (default 64,256; empty: no sweep), REPS (16)
set -uo pipefail
. bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
TS=${TS:-1,4,16,64,256,1024,4096}
cmake -S . -B build-gpu -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="-I$SYS/usr/include" >"$OUT/cfg.log" 2>&1 &&
  cmake --build build-gpu -j16 --target bench_layer test_cuda_gptoss >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build $(($(date +%s) - t0)) s"
(cd build-gpu && ctest -R test_cuda_gptoss --output-on-failure --timeout 200 2>&1 | grep -E "tests passed|Failed")
echo "== fp4moe gpt-oss-120b"
timeout 240 build-gpu/bench/bench_layer --model gpt-oss-120b --reps "${REPS:-16}" --ts "$TS" >"$OUT/bl_gptoss.log" 2>&1
grep -v '^csv' "$OUT/bl_gptoss.log" | tail -40
echo "== peer: triton_kernels matmul_ogs"
PYTHONPATH=$PWD/python:$PWD/.triton_kernels timeout 300 python3 bench/gptoss_peer.py --ts "$TS" \
  --csv "$OUT/gptoss_peer.csv" >"$OUT/peer.log" 2>&1
echo "rc=$?"; tail -40 "$OUT/peer.log"
if [ -n "${SWEEP_TS-64,256}" ]; then
  echo "== fm_layer_tune vs the planner, all-local"
  timeout 200 build-gpu/bench/bench_layer --model gpt-oss-120b --local --sweep --reps 12 --ts "${SWEEP_TS-64,256}" \
    >"$OUT/sweep.log" 2>&1
  grep -E "^sweep|^local" "$OUT/sweep.log"
fi
echo "total $(($(date +%s) - t0)) s"
