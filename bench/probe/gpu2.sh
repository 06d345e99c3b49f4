# one device call: build, GPU tests (errors only), quick bench, ncu of two wgmma tiles
OUT=${OUT:-/tmp/out}
# (probe: bench/probe/wgmma_rs_probe.cu)
FM_WERROR=OFF bash bench/gpu-check.sh perf 2>&1 | tail -24
grep -E "^ERROR|FAILED" $OUT/ctest.log | head -12
for T in ${NCU_TILES:-wgmma_w8m2n16k64s4}; do break
  echo "== ncu $T EP8-FC1 m=128"
  timeout 120 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section Occupancy --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:wgmma --launch-skip 2 --launch-count 1 build-gpu/bench/bench_gemm --shape EP8-FC1 --m 128 --tile $T --reps 2 \
    > $OUT/ncu_$T.log 2>&1
  grep -E "Duration|Compute \(SM\) Thr|Memory Thr|L1/TEX Cache Thr|L2 Cache Thr|DRAM Thr|Registers Per|Achieved Occ|Theoretical Occ|No Eligible|Issued Warp|Warp Cycles Per Issued|hmma_cycles|Executed Ipc A|Stall|stall" $OUT/ncu_$T.log | head -24
done
echo "== EP8-FC1 m=512, every tile"
build-gpu/bench/bench_gemm --shape EP8-FC1 --m 512 --reps 10 | grep -E "^csv" | sort -t, -k6 -n | head -8
echo "== ncu stalls, packed wgmma_w8m2n16k64s4 EP8-FC1 m=128"
NCU_TILES="wgmma_w8m2n16k64s4" bash bench/probe/gpu3.sh 2>&1 | tail -18
