#!/usr/bin/env bash
# probe.sh - the one probe script: look inside a kernel launch (ncu, per-CTA timeline,
# power under load, the layer's kernels) on the GPU machine, or at the kernels' SASS on
# any machine with nvcc. Replaces the per-session scripts bench/probe/gpu1..14.sh (git
# history; bench/HISTORY.md quotes their results). Run from the repository root; logs and
# outputs go to $OUT (default /tmp/out). On the GPU machine carry ".debs" (cmocka, cJSON).
#
#   probe.sh ncu SHAPE M TILE [KERNEL_REGEX [LAUNCH_SKIP]]
#       ncu of one bench_gemm launch (--clock-control none): throughputs (DRAM, L2, SM,
#       tensor pipes gmma / hmma, ALU, FMA), issue, SM clock, warps, stall ratios >= 0.1.
#       KERNEL_REGEX defaults from the tile's name (mma | wgmma), LAUNCH_SKIP 3.
#       METRICS="a,b,..." replaces the metric list; SECTIONS="SpeedOfLight Occupancy ..."
#       uses ncu sections instead.
#   probe.sh fp8 SHAPE M KERNEL
#       the same metrics for one W4A8 launch of bench_fp8mma (SHAPE OSS8-FC1 | EP8-FC1, M rows
#       per expert 8 .. 256, KERNEL pipe16 .. ws128): how busy the issue slots, the tensor pipe
#       and the ALU / FMA pipes are while FP4 is decoded to E4M3 in the loop (issue 34).
#   probe.sh timeline SHAPE M TILE [queued|chain|pdl]
#       every CTA's SM, start and end over 4 launches (an mma tile; a probe build of
#       bench_gemm, -DFM_PROBE_TIMELINE=ON, in build-probe, or the carried
#       build-probe-bin/bench_gemm_tl), summarized by bench/probe/timeline.py.
#   probe.sh layer-timeline [T]
#       the same per-CTA record for the layer's own GEMM launches at EP8 T tokens (work
#       list, split K, the PDL chain; bench_layer --timeline in a probe build; T = 4).
#   probe.sh power SHAPE M TILE
#       nvidia-smi every 100 ms (SM clock, power, temperature, throttle reasons) while
#       bench_gemm runs that point.
#   probe.sh layer [TOKENS...]
#       per-kernel times (ncu) of one `fp4moe run` forward, GLM-5 EP8 defaults (1,024 tokens).
#   probe.sh decode [TOKENS...]
#       ncu of the one-launch decode kernel in one `fp4moe run --decode on` forward (GLM-5 EP8
#       defaults; T = 1 4 8): time, DRAM bytes and throughput, occupancy, warp stall reasons,
#       and the chain's kernels of the same forward (`--decode off`) beside it; then the
#       routing kernels' (internal routing) time, throughput and stall reasons. RUN_ARGS: more
#       `fp4moe run` flags, e.g. "--global-experts 256 --shard 32:32" (GLM-5's EP8 shard).
#   probe.sh sass [mma|wgmma|all]
#       cuobjdump -sass of src/cuda/gemm_<family>.cu (sm_90a and sm_80, the library's
#       flags) into $OUT/<family>.sass, with the instruction count per kernel; no GPU needed.
#   probe.sh sass-diff A.sass B.sass
#       whether two SASS dumps have the same instructions, kernel by kernel, ignoring the
#       kernels' (mangled) names and symbol names in operands: the check of a refactor.
#   probe.sh prog wgmma_rs|stream
#       build and run bench/probe/wgmma_rs_probe.cu (wgmma fragment / descriptor
#       conventions) or stream_probe.cu (the cp.async load pattern alone).
#
# Examples (the seventh session's probes, bench/HISTORY.md):
#   probe.sh ncu EP8-FC2 1 mma_w4m4n1k128s3
#   probe.sh timeline EP8-FC1 8 mma_w4m2n1k256s3 pdl
#   probe.sh power EP8-FC1 128 wgmma_w8m2n16k64s8
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
MODE=${1:-}
shift || true

deps() { # the carried .debs (the GPU image has no cmocka / cJSON)
  SYS=/tmp/sysroot
  for f in .debs/*.deb; do [ -f "$f" ] && dpkg -x "$f" "$SYS"; done
  export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
  export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
}
build() { # build DIR TARGET [cmake args...]: warnings not fatal (a probe, not a check)
  local dir=$1 target=$2
  shift 2
  [ -x "$dir/bench/$target" ] || [ -x "$dir/$target" ] && return 0
  cmake -S . -B "$dir" -DFM_WERROR=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" "$@" \
    >"$OUT/cmake_$target.log" 2>&1
  cmake --build "$dir" -j"$(nproc)" --target "$target" >"$OUT/build_$target.log" 2>&1 ||
    { tail -20 "$OUT/build_$target.log"; exit 1; }
}
bench_gemm() { # the bench_gemm binary: build-gpu's (gpu-check.sh built it) or a fresh build
  if [ -x build-probe-bin/bench_gemm ]; then echo build-probe-bin/bench_gemm; return; fi
  build build-gpu bench_gemm >&2
  echo build-gpu/bench/bench_gemm
}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)} # needs nvdisasm beside it or on PATH

case "$MODE" in
ncu | fp8)
  [ $# -ge 3 ] || { sed -n '/^#   probe.sh ncu/,/^#   probe.sh timeline/p' "$0" | head -10; exit 2; }
  deps
  shape=$1 m=$2 tile=$3 regex=${4:-"(^|::)${3%%_*}_"} skip=${5:-3}
  if [ "$MODE" = fp8 ]; then # bench_fp8mma's one point: 5 warm-up launches, then --reps
    [ -x build-gpu/bench/bench_fp8mma ] || build build-gpu bench_fp8mma
    regex="fp8mma_"
    run=(build-gpu/bench/bench_fp8mma --shape "$shape" --m "$m" --kernel "$tile" --reps 5)
  else
    B=$(bench_gemm)
    run=("$B" --shape "$shape" --m "$m" --tile "$tile" --reps 2)
  fi
  def="gpu__time_duration.sum,smsp__cycles_elapsed.avg.per_second,sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
  def+=",dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed"
  def+=",sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
  def+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
  def+=",sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
  def+=",smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active"
  def+=",l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,launch__grid_size"
  def+=",launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem"
  stalls="regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
  log=$OUT/ncu_${shape}_${m}_${tile}.log
  if [ -n "${SECTIONS:-}" ]; then
    what=(); for s in $SECTIONS; do what+=(--section "$s"); done
  else
    what=(--metrics "${METRICS:-$def},$stalls")
  fi
  echo "== ncu $shape m=$m $tile"
  timeout 200 "$NCU" --clock-control none "${what[@]}" -k "regex:$regex" --launch-skip "$skip" --launch-count 1 \
    "${run[@]}" >"$log" 2>&1
  if [ -n "${SECTIONS:-}" ]; then grep -E "^    [A-Z]" "$log" | head -60
  else
    grep -E "ratio|pct|sum|per_second|launch__" "$log" | awk '{ if ($NF+0 >= 0.1 || $0 !~ /ratio/) print }' |
      sed 's/smsp__average_warps_issue_stalled_//' | head -40
  fi
  ;;
timeline)
  [ $# -ge 3 ] || { echo "usage: probe.sh timeline SHAPE M TILE [queued|chain|pdl]" >&2; exit 2; }
  deps
  shape=$1 m=$2 tile=$3 how=${4:-queued}
  if [ -x build-probe-bin/bench_gemm_tl ]; then B=build-probe-bin/bench_gemm_tl
  else build build-probe bench_gemm -DFM_PROBE_TIMELINE=ON; B=build-probe/bench/bench_gemm; fi
  flag=""; [ "$how" = chain ] && flag=--chain; [ "$how" = pdl ] && flag=--pdl
  csv=$OUT/tl_${shape}_${m}_${how}.csv
  "$B" --shape "$shape" --m "$m" --tile "$tile" --timeline "$csv" $flag --reps 15 | grep -E "^#|^csv"
  python3 bench/probe/timeline.py "$csv"
  ;;
layer-timeline)
  # the layer's own GEMM launches (work list, split K, PDL chain): bench_layer --timeline
  deps
  T=${1:-4}
  build build-probe bench_layer -DFM_PROBE_TIMELINE=ON
  csv=$OUT/tl_layer_ep8_$T.csv
  build-probe/bench/bench_layer --ts "$T" --reps 16 --timeline "$csv" | grep -E "^# timeline|^ep8"
  python3 bench/probe/timeline.py "$csv"
  ;;
power)
  [ $# -ge 3 ] || { echo "usage: probe.sh power SHAPE M TILE" >&2; exit 2; }
  deps
  B=$(bench_gemm)
  smi=$OUT/smi_$1_$2.csv
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 100 >"$smi" 2>&1 &
  pid=$!
  "$B" --shape "$1" --m "$2" --tile "$3" | grep -E "^csv"
  kill "$pid"; sleep 0.2
  echo "-- $1 $2: SM MHz / W / C / reasons over the run (every 5th sample)"
  awk -F', ' 'NR % 5 == 1 { printf "%s %s %s %s | ", $2, $4, $5, $6 } END { print "" }' "$smi" | cut -c1-1500
  ;;
layer)
  deps
  build build-gpu fp4moe_cli
  for tk in "${@:-1024}"; do
    echo "== tokens $tk"
    build-gpu/fp4moe run --tokens "$tk" --iters 3 | grep -E "time"
    "$NCU" --metrics gpu__time_duration.sum --launch-skip 0 --launch-count 40 \
      build-gpu/fp4moe run --tokens "$tk" --iters 1 2>/dev/null |
      awk '/^  [a-zA-Z_].*\(/ {k=$1} /gpu__time_duration.sum/ {printf "%-40s %10s %s\n", substr(k,1,40), $(NF), $(NF-1)}' |
      head -40
  done
  ;;
decode)
  deps
  [ -x build-gpu/fp4moe ] || build build-gpu fp4moe_cli
  for tk in "${@:-1 4 8}"; do
    echo "== tokens $tk: the chain's kernels (--decode off), then the decode kernel"
    "$NCU" --metrics gpu__time_duration.sum,dram__bytes_read.sum --launch-skip 0 --launch-count 40 \
      build-gpu/fp4moe run --tokens "$tk" --iters 1 --decode off ${RUN_ARGS:-} 2>/dev/null |
      awk '/^  [a-zA-Z_].*\(/ {k=$1} /gpu__time_duration.sum|dram__bytes_read.sum/ {printf "%-40s %-24s %10s %s\n", substr(k,1,40), $1, $(NF), $(NF-1)}' |
      head -40
    "$NCU" -k regex:decode_kernel -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section LaunchStats build-gpu/fp4moe run --tokens "$tk" --iters 1 --decode on ${RUN_ARGS:-} \
      >"$OUT/ncu_decode_T$tk.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Grid Size|Stall|Warp Cycles Per Issued|L2 Hit|Compute \(SM\) Throughput|Block Limit" \
      "$OUT/ncu_decode_T$tk.txt" | head -30
    # the router (internal routing's premium, issue 31): logits + top-k in one launch at T <= 4
    "$NCU" -k regex:"route_fused|router_logits|route_kernel" -c 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section LaunchStats build-gpu/fp4moe run --tokens "$tk" --iters 1 --decode on ${RUN_ARGS:-} \
      >"$OUT/ncu_route_T$tk.txt" 2>&1
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles Per Issued|L2 Hit|Grid Size" \
      "$OUT/ncu_route_T$tk.txt" | head -24
  done
  ;;
sass)
  fams=${1:-all}; [ "$fams" = all ] && fams="mma wgmma"
  for f in $fams; do
    o=$OUT/gemm_$f.o
    nice "$NVCC" -DFM_HAVE_CUDA=1 -Iinclude -Isrc -O3 -DNDEBUG -Xcompiler=-fPIC \
      -gencode=arch=compute_90a,code=sm_90a "-gencode=arch=compute_80,code=[sm_80,compute_80]" \
      --expt-relaxed-constexpr -lineinfo ${NVCC_FLAGS:-} -x cu -c "src/cuda/gemm_$f.cu" -o "$o" ||
      { echo "nvcc failed: src/cuda/gemm_$f.cu" >&2; exit 1; }
    "$CUOBJDUMP" -sass "$o" >"$OUT/gemm_$f.sass" || { echo "cuobjdump failed ($CUOBJDUMP)" >&2; exit 1; }
    echo "== $OUT/gemm_$f.sass: $(grep -c 'Function :' "$OUT/gemm_$f.sass") kernels"
    awk '/Function :/ {if (n) printf "%6d %s\n", n, k; k=$3; n=0} /^ +\/\*[0-9a-f]+\*\// {n++}
         END {if (n) printf "%6d %s\n", n, k}' "$OUT/gemm_$f.sass" | sort -k2 | head -80
  done
  ;;
sass-diff)
  [ $# -eq 2 ] || { echo "usage: probe.sh sass-diff A.sass B.sass" >&2; exit 2; }
  # per kernel: the instruction lines only (no addresses, no encodings), symbol names masked;
  # kernels sorted by their instructions, since their order and names may change
  norm() {
    awk '/Function :/ {if (body != "") print body; body=""; next}
         /^ +\/\*[0-9a-f]+\*\// {l=$0; sub(/^ +\/\*[0-9a-f]+\*\/ +/, "", l); sub(/ *\/\*.*$/, "", l);
                                  gsub(/[_A-Za-z][_A-Za-z0-9$.]*[0-9][_A-Za-z0-9$.]{6,}/, "SYM", l); body = body l "|"}
         /arch = / {if (body != "") print body; body=""; print $0}
         END {if (body != "") print body}' "$1" | sort
  }
  a=$(norm "$1" | md5sum) b=$(norm "$2" | md5sum)
  na=$(grep -c 'Function :' "$1") nb=$(grep -c 'Function :' "$2")
  if [ "$a" = "$b" ]; then echo "SASS identical: $na kernels each (names ignored)"; exit 0; fi
  echo "SASS differs ($na vs $nb kernels)"
  diff <(norm "$1" | tr '|' '\n') <(norm "$2" | tr '|' '\n') | head -40
  exit 1
  ;;
prog)
  case "${1:-}" in
  wgmma_rs) "$NVCC" -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/probe/wgmma_rs_probe.cu -o /tmp/wgmma_rs_probe &&
              /tmp/wgmma_rs_probe ;;
  stream) "$NVCC" -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/probe/stream_probe.cu -o /tmp/stream_probe &&
            /tmp/stream_probe | tee "$OUT/stream_probe.txt" ;;
  *) echo "usage: probe.sh prog wgmma_rs|stream" >&2; exit 2 ;;
  esac
  ;;
*)
  sed -n '2,/^set -uo/p' "$0" | sed '$d'
  exit 2
  ;;
esac
