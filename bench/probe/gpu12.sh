# Seventh session, full run with PDL: gpu-check.sh results (ctest -L gpu, torch peer with its
# chained timing, the full bench with csvq / csvc lines, the CLI), the layer at 16-1,024
# tokens, then the timelines of EP8-FC1 at 8 rows chained plain and with PDL (gpu11.sh: its
# plain chain was slower than the queued launches, 128.3 vs 121.6 us).
# Usage (repo root, GPU machine): bash bench/probe/gpu12.sh   carry [".debs", "build-probe-bin"]
. bench/probe/common.sh
FM_WERROR=ON MEMCHECK_S=0 bench/gpu-check.sh results > $OUT/results.txt 2>&1
grep -E "tests passed|Failed|^# |^copy" $OUT/results.txt | head -12
sed -n '/^| shape/,$p' $OUT/results.txt | grep -E "^\||^chained|ms|NMSE|rc=" | cut -c1-230
for tk in 16 64 256 1024; do echo "tokens $tk: $(timeout 90 build-gpu/fp4moe run --tokens $tk 2>&1 | grep -E 'time')"; done
grep -E "^csvq" $OUT/bench.log | head -50 > $OUT/csvq.txt
for mode in chain pdl; do
  build-probe-bin/bench_gemm_tl --shape EP8-FC1 --m 8 --tile swapab_w4m2n1k256s3 --timeline $OUT/tl_$mode.csv --$mode --reps 5 >/dev/null
  python3 bench/probe/timeline.py $OUT/tl_$mode.csv
done
(cd $OUT && tar czf logs.tgz *.log *.txt *.json *.md tl_*.csv 2>/dev/null && rm -f *.log tl_*.csv results.txt csvq.txt table.md)
