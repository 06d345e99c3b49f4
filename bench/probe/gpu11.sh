# Seventh session: programmatic dependent launch (fm_cuda_gemm_args.pdl). gpu10.sh found
# ~4.2 us between one launch's last CTA and the next one's first, and a ~10-14 us tail in
# which an SM after another runs out of CTAs. With PDL the next GEMM's CTAs take the slots
# the last ones free, prefetch their first weight bytes into L2 and wait for the grid.
#  1. gpu-check.sh perf: build, ctest -L gpu (test_cuda_pdl among them), the quick bench
#     (csvc lines: the best tile chained, plain and with PDL)
#  2. FM_PDL_PREFETCH (bytes per CTA) swept at 1 row, chained with PDL
#  3. the timeline of 4 PDL launches (probe build, carried)
#  4. test_cuda_pdl built with the grid-dependency wait compiled out (carried): must fail
# Usage (repo root, GPU machine): bash bench/probe/gpu11.sh   carry [".debs", "build-probe-bin"]
. bench/probe/common.sh
FM_WERROR=ON bench/gpu-check.sh perf 2>&1 | tail -40
grep -E "^csvc|^# (read|empty)" $OUT/bench.log
echo "== prefetch sweep (chain us plain / PDL)"
for pf in 0 16384 65536 131072; do
  for st in "EP8-FC2 1 swapab_w4m4n1k128s3" "EP8-FC1 1 swapab_w4m2n1k256s3" "TP8-FC2 1 swapab_w4m4n1k128s3"; do
    set -- $st
    echo "pf=$pf $(FM_PDL_PREFETCH=$pf build-gpu/bench/bench_gemm --shape $1 --m $2 --tile $3 --reps 15 | grep ^csvc)"
  done
done
echo "== timeline, 4 launches with PDL"
build-probe-bin/bench_gemm_tl --shape EP8-FC2 --m 1 --tile swapab_w4m4n1k128s3 --timeline $OUT/tl_pdl.csv --pdl --reps 5 >/dev/null
python3 bench/probe/timeline.py $OUT/tl_pdl.csv
echo "== test_cuda_pdl without the grid-dependency wait (must fail)"
build-probe-bin/test_cuda_pdl_nowait 2>&1 | grep -E "FAILED|PASSED|NMSE|nmse|OK|Error" | head -12
(cd $OUT && tar czf logs.tgz *.log tl_*.csv 2>/dev/null && rm -f *.log tl_*.csv)
