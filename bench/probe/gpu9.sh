# Sixth session: why TP8-FC2 (256 experts, K = 256) at 1 row per expert takes ~20 %
# longer than EP8-FC2 (32 experts, K = 2,048) with the same tile and the same weight
# bytes (RESULTS.md, fifth session: 80.5 vs 66.9 us, swapab_w4m4n1k128s3), and where
# the FC1 1-row kernel (w4m2n1k256s3) loses its last ~10 %: SM clock, SM active
# share (the tail / launch gaps), DRAM throughput, issue, occupancy, stall reasons.
# Usage (repo root, GPU machine, after gpu-check.sh built build-gpu): bash bench/probe/gpu9.sh
. bench/probe/common.sh
[ -x build-gpu/bench/bench_gemm ] || fm_probe_build
M="gpu__time_duration.sum,smsp__cycles_elapsed.avg.per_second,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
run() { fm_ncu swapab 3 "$@"; } # shape m tile
run TP8-FC2 1 swapab_w4m4n1k128s3
run EP8-FC2 1 swapab_w4m4n1k128s3
run EP8-FC1 1 swapab_w4m2n1k256s3
