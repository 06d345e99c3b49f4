# common.sh - sourced by the probe scripts (repo root, GPU machine): unpack the carried
# .debs (cmocka, cJSON) into /tmp/sysroot and export the paths the build needs;
# fm_probe_build builds bench_gemm in build-gpu (warnings not fatal).
OUT=${OUT:-/tmp/out}
SYS=/tmp/sysroot; for f in .debs/*.deb; do dpkg -x "$f" "$SYS"; done
export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fm_probe_build() {
  cmake -S . -B build-gpu -DFM_WERROR=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" >/dev/null 2>&1
  cmake --build build-gpu -j16 --target bench_gemm >$OUT/build.log 2>&1 || tail -20 $OUT/build.log
}
# fm_ncu KERNEL_REGEX LAUNCH_SKIP SHAPE M TILE: ncu of one bench_gemm launch with the metrics
# in $M (set by the caller) and the stall ratios $S, log in $OUT, the throughputs and stalls
# (>= 0.1) printed
S="regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
fm_ncu() {
  echo "== ncu $3 m=$4 $5"
  timeout 120 ncu --clock-control none --metrics $M,$S -k regex:$1 --launch-skip $2 --launch-count 1 \
    build-gpu/bench/bench_gemm --shape $3 --m $4 --tile $5 --reps 2 > $OUT/ncu_$3_$4_$5.log 2>&1
  grep -E "ratio|pct|sum|per_second|launch__" $OUT/ncu_$3_$4_$5.log | awk '{ if ($NF+0 >= 0.1 || $0 !~ /ratio/) print }' |
    sed 's/smsp__average_warps_issue_stalled_//' | head -40
}
