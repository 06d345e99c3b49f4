# Seventh session: does the GPU slow down under sustained load? (gpu12/results: the same tile,
# queued, read 292.9 us in bench_gemm's tile sweep and 350.4 us in the interleaved launch
# modes that follow it at EP8-FC1 128 rows). nvidia-smi every 100 ms (SM clock, power,
# temperature, throttle reasons) while bench_gemm runs that point, then at 1 row.
# Usage (repo root, GPU machine, after gpu-check.sh built build-gpu): bash bench/probe/gpu13.sh
. bench/probe/common.sh
for pt in "EP8-FC1 128 wgmma_w8m2n16k64s8" "EP8-FC1 1 swapab_w4m2n1k256s3"; do
  set -- $pt
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 100 > $OUT/smi_$1_$2.csv 2>&1 &
  SMI=$!
  build-gpu/bench/bench_gemm --shape $1 --m $2 --tile $3 | grep -E "^csv"
  kill $SMI; sleep 0.2
  echo "-- $1 $2: SM MHz / W / C / reasons over the run (every 5th sample)"
  awk -F', ' 'NR % 5 == 1 { printf "%s %s %s %s | ", $2, $4, $5, $6 } END { print "" }' $OUT/smi_$1_$2.csv | cut -c1-1500
done
