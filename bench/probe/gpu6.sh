# The small-batch regime's limit: the load pattern alone (stream_probe.cu, no compute)
# vs the swapab kernel (ncu: DRAM throughput + stall breakdown), EP8-FC1 1 row/expert.
OUT=${OUT:-/tmp/out}
[ -n "${SKIP_PROBE:-}" ] || nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/probe/stream_probe.cu -o /tmp/sp >$OUT/sp_build.log 2>&1 || tail $OUT/sp_build.log
[ -n "${SKIP_PROBE:-}" ] || /tmp/sp | tee $OUT/stream_probe.txt
SYS=/tmp/sysroot; for f in .debs/*.deb; do dpkg -x "$f" "$SYS"; done
export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
cmake -S . -B build-gpu -DFM_WERROR=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" >/dev/null 2>&1
cmake --build build-gpu -j16 --target bench_gemm >$OUT/build.log 2>&1 || tail -20 $OUT/build.log
for T in ${NCU_TILES:-swapab_w4m1n1k256s4}; do
  echo "== ncu $T ${NCU_SHAPE:-EP8-FC1} m=${NCU_M:-1}"
  timeout 150 ncu --clock-control none --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.per_cycle_active,gpu__time_duration.sum,dram__bytes_read.sum \
    -k regex:swapab --launch-skip 2 --launch-count 1 build-gpu/bench/bench_gemm --shape ${NCU_SHAPE:-EP8-FC1} --m ${NCU_M:-1} --tile $T --reps 2 > $OUT/ncu_$T.log 2>&1
  grep -E "ratio|pct|sum|per_cycle" $OUT/ncu_$T.log | awk '{ if ($NF+0 >= 0.05 || $0 ~ /pct|sum|per_cycle/) print }' | sed 's/smsp__average_warps_issue_stalled_//' | head -30
done
