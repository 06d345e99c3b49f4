# Fifth session: (a) the warp-specialized kernels' staged epilogue per warpgroup (own
# columns, own barrier: the persistent kernel's warpgroups stop waiting for each other),
# the default build: ctest -L gpu + TP8-FC2 at every row count; (b) the .L2::256B
# prefetch hint on the 16-byte cp.async copies (-DFM_CP_ASYNC_L2_256=1, a second build)
# against (a) at the 1-8 row points, interleaved A/B/A/B. Result (2026-11-30): (b) 1-3 %
# slower at 1-2 rows, the same elsewhere; the macro was removed from kernel_common.cuh
# afterwards (this script's second build now equals the first).
# Usage (repo root, GPU machine): bash bench/probe/gpu8.sh      carry=[".debs"]
. bench/probe/common.sh
( cmake -S . -B build-l2 -DFM_WERROR=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" \
    -DCMAKE_CUDA_FLAGS="-DFM_CP_ASYNC_L2_256=1" >/dev/null 2>&1 &&
  cmake --build build-l2 -j8 --target bench_gemm >$OUT/build-l2.log 2>&1 ) &
FM_WERROR=ON BENCH_ARGS="--shape TP8-FC2" bench/gpu-check.sh perf 2>&1 | tail -16
wait
for rep in 1 2; do
  for sm in "EP8-FC1 1 swapab_w4m2n1k256s3" "TP8-FC1 2 swapab_w4m2n1k256s3" "EP8-FC2 1 swapab_w4m4n1k128s3" "EP8-FC1 128 wgmma_w8m2n16k64s8"; do
    set -- $sm
    for b in build-gpu build-l2; do
      printf "%-9s %-8s " $b "$rep"; $b/bench/bench_gemm --shape $1 --m $2 --tile $3 2>&1 | grep "^csv" | head -1
    done
  done
done
