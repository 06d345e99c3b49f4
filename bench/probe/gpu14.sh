# Seventh session: the profiler's evidence for the regimes that miss issue 4's targets
# (16-64 rows, TP8-FC2 32-256 rows, 1,024 rows against torch): ncu of the fastest tile at
# EP8-FC1 32 and 64 rows, TP8-FC2 32 and 128 rows, EP8-FC2 1,024 rows, and the 1-row
# kernel at EP8-FC2 (SM active share: the tail). Throughputs (DRAM, L2, SM, tensor pipe
# (gmma / hmma), ALU, FMA), issue, SM clock, warps, stall reasons.
# Usage (repo root, GPU machine): bash bench/probe/gpu14.sh      carry=[".debs", "build-probe-bin"]
. bench/probe/common.sh
# a bench_gemm built here (carry build-probe-bin) saves the device the build
if [ -x build-probe-bin/bench_gemm ]; then mkdir -p build-gpu/bench && cp build-probe-bin/bench_gemm build-gpu/bench/; else fm_probe_build; fi
M="gpu__time_duration.sum,smsp__cycles_elapsed.avg.per_second,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,launch__grid_size"
fm_ncu wgmma 3 EP8-FC1 32 wgmma_w8m2n4k128s6
fm_ncu wgmma 3 EP8-FC1 64 wgmma_w8m2n8k64s8
fm_ncu swapab 3 TP8-FC2 32 swapab_w4m4n2k128s3
fm_ncu wgmma 3 TP8-FC2 128 wgmma_w8m2n8k64s8p
fm_ncu wgmma 3 EP8-FC2 1024 wgmma_w8m2n16k64s8
fm_ncu swapab 3 EP8-FC2 1 swapab_w4m4n1k128s3
(cd $OUT && tar czf ncu.tgz ncu_*.log build.log 2>/dev/null && rm -f ncu_*.log build.log)
