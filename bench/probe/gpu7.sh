# The persistent wgmma kernel (session 5): what binds TP8-FC2 (K = 256) at 256 rows,
# and EP8-FC2 (K = 2,048) at 512 rows where it is slower than the per-tile kernel:
# ncu throughputs (SM, tensor pipe, L2, DRAM) and the consumers' stall reasons.
# Usage (repo root, GPU machine): bash bench/probe/gpu7.sh      carry=[".debs"]
. bench/probe/common.sh
fm_probe_build
M="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
run() { fm_ncu wgmma 2 "$@"; } # shape m tile
run TP8-FC2 256 wgmma_w8m1n32k64s4p
run TP8-FC2 256 wgmma_w8m1n32k64s6
run EP8-FC2 512 wgmma_w8m1n32k64s4p
run EP8-FC2 512 wgmma_w8m1n32k64s4
