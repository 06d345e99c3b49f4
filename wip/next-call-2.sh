#!/usr/bin/env bash
# wip/next-call-2.sh - a second device call (issue 32's all-local gap): every tile on gpt-oss-120b's
# MXFP4 GEMMs (bench_gemm --model gpt-oss-120b: 128 experts and the EP8 shard's 16, FC1 N 5,760 /
# FC2 N 2,880, K 2,880, 1..256 rows per expert; written 2026-12-06, never run), the data to refit
# the planner's per-tile factors, which were fitted on GLM-5's NVFP4 shapes only (the 12-warp
# wgmma tile's packed-X estimate undercuts the mma tiles at 8-32 rows per expert; fm_layer_tune
# found mma_w4m2n2k128s4 10.6-11 % faster in the whole layer at local T = 256, twice).
#   run: bash wip/next-call-2.sh      carry [".debs"], timeout 600
# Afterwards, here (the log from files_at):
#   python3 bench/tiles_to_csv.py gemm_oss.log --gpu h100 --date ... --command "bash wip/next-call-2.sh" \
#     -o bench/h100_fp4moe_tiles_gptoss.csv
#   python3 bench/fit_tile_model.py --csv bench/h200_fp4moe_tiles.csv --csv bench/h100_fp4moe_tiles_gptoss.csv --cv
# (fit_tile_model.py prices each timing at its GPU's memory rate and format's scale bytes, and
# prints the regret per CSV); keep the refit only if GLM-5's regret does not grow (ctest
# test_plan_rank), and say so in bench/RESULTS.md.
set -uo pipefail
T0=$SECONDS
. bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B build-gpu -DFM_CUDA_ARCHS=native -DFM_WERROR=ON -DFM_TEST_MUTANTS=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="-I$SYS/usr/include" >"$OUT/cfg.log" 2>&1 &&
  cmake --build build-gpu -j16 --target bench_gemm >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "== built at $((SECONDS - T0)) s"
timeout $((560 - (SECONDS - T0))) build-gpu/bench/bench_gemm --model gpt-oss-120b --reps 10 >"$OUT/gemm_oss.log" 2>&1
echo "rc=$?"
grep -v "^csv" "$OUT/gemm_oss.log" | tail -45
echo "== done in $((SECONDS - T0)) s"
