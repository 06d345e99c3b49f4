# Seventh session: where a 1-8-row launch loses its last 10-40 % against bytes / copy
# bandwidth. The fastest tiles at 1 row: t = 13.3 us + bytes / 4.15 TB/s fits EP8-FC1 and
# EP8-FC2 (RESULTS, sixth session), so the loss looks like a fixed cost per launch, not
# bandwidth. Measures: the queued interval of an empty launch, a plain read of each shape's
# weight set in one launch (same size, same method), and (probe build of bench_gemm,
# carried as build-probe-bin/bench_gemm_tl: -DFM_PROBE_TIMELINE=ON) every CTA's SM and
# start/end of 4 queued launches -> ramp, tail and gap between launches (timeline.py).
# Usage (repo root, GPU machine): bash bench/probe/gpu10.sh     carry [".debs", "build-probe-bin"]
. bench/probe/common.sh
B=build-probe-bin/bench_gemm_tl
tl() { $B --shape $1 --m $2 --tile $3 --timeline $OUT/tl_$1_$2.csv --reps 15 | grep -E "^#|^csv" ; python3 bench/probe/timeline.py $OUT/tl_$1_$2.csv; }
tl EP8-FC1 1 swapab_w4m2n1k256s3
tl EP8-FC2 1 swapab_w4m4n1k128s3
tl TP8-FC2 1 swapab_w4m4n1k128s3
tl EP8-FC1 8 swapab_w4m2n1k256s3
tl TP8-FC1 1 swapab_w4m2n1k256s3
(cd $OUT && tar czf timelines.tgz tl_*.csv && rm -f tl_*.csv)
