# ncu stall breakdown of the wgmma tiles (no tests, no bench)
. bench/probe/common.sh
fm_probe_build
for T in ${NCU_TILES:-wgmma_w8m2n16k64s4 wgmma_w8m1n32k64s4}; do
  echo "== ncu $T EP8-FC1 m=${NCU_M:-128}"
  timeout 150 ncu --clock-control none --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    -k regex:wgmma --launch-skip 2 --launch-count 1 build-gpu/bench/bench_gemm --shape EP8-FC1 --m ${NCU_M:-128} --tile $T --reps 2 > $OUT/ncu_$T.log 2>&1
  grep -E "ratio|pct|sum" $OUT/ncu_$T.log | awk '{ if ($NF+0 >= 0.05 || $0 ~ /pct|sum/) print }' | sed 's/smsp__average_warps_issue_stalled_//' | head -30
done
