#!/usr/bin/env bash
# gpu-check.sh - everything the GPU machine is for, in one call (device time is scarce):
#   1. unpack the carried .debs (cmocka, cJSON: the device image has neither) into /tmp/sysroot
#   2. configure + build (build-gpu, -DFM_WERROR=ON): library, GPU tests, bench_gemm
#   3. ctest -L gpu (with the mutation tests, tests/mutants.cmake: test_cuda_pdl against the
#      kernels without their grid-dependency wait must fail), then compute-sanitizer memcheck + racecheck on test_cuda_gemm (and test_cuda_pdl)
#   4. ceilings + torch._grouped_mm BF16 peer (bench/torch_peer.py), then bench_gemm
#   5. ncu speed-of-light of one mma launch (EP8 FC1, 1 row/expert)
#   6. full: the CLI on the GPU (`fp4moe devices`, `fp4moe run --check`, GLM-5 EP8
#      defaults at 1, 4 and 64 tokens)
#   7. the short table last; logs in $OUT (or ./out when run elsewhere)
# Usage (repo root):  bench/gpu-check.sh [quick|full|test|perf|results|verify|layer|session]      carry=[".debs"]
#   TARGETS="a b ...": build only those targets (the full build of every test is skipped)
#   w4a8: bench_fp8mma, then bench_layer W4A16 and W4A8 on each kernel of W4A8_KERNELS (default
#         auto staged16 staged32 staged64; issue 34; CTEST_ARGS for the tests first, BENCH=0: tests
#         only; GPU_CMAKE_ARGS=-DFM_CUDA_W4A8_DISPATCH=ON for the W4A8 dispatched rows; the wgmma
#         kernels wg32 wg64 wg128 ws64 ws128 take MXFP4 only: W4A8_LAYER_ARGS="--model gpt-oss-120b ...")
#   decode-delay: test_cuda_decode on decode.cu rebuilt with random CTA delays (FM_DECODE_DELAY),
#            plain and under memcheck / racecheck (issue 31's flag-protocol test; CTEST=0 skips ctest)
#   nccl-ep1: build + ctest as usual, then examples/nccl_ep against the carried .ncclep and this
#            machine's NCCL, --world 1, LL and HT (carry [".debs", ".ncclep"]; CTEST=0 to skip ctest)
#   session: build, ctest -L gpu (CTEST_ARGS), then what DISP / W4A8 / DECODE (+ VARIANTS) ask for
#            (see the block below; e.g. CTEST_ARGS="-R fp8" W4A8=1 bench/gpu-check.sh session)
#   layer: build, ctest -L gpu (CTEST_LAST=1: after the benches), memcheck + racecheck of test_cuda_layer, bench_layer, torch_layer
#   verify: build, ctest -L gpu, bench_gemm --quick, fp4moe run (--check at 1 and 4 tokens;
#           16-1,024 tokens timed), memcheck + racecheck of test_cuda_gemm's quick subset
#   results: build, ctest -L gpu, torch peer + ceilings, the full bench, the CLI on the
#            GPU, the table, then memcheck + racecheck of test_cuda_gemm's quick subset
#   test: steps 1-3 only (correctness + sanitizers, no timing)
#   perf: build, ctest -L gpu, bench_gemm --quick (no sanitizers, torch or ncu: the
#         cheapest call that still checks a kernel change before timing it)
set -uo pipefail
MODE=${1:-quick}
. bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/nvidia-smi.txt"
echo "== build"
{ cmake -S . -B build-gpu -DFM_CUDA_ARCHS=${ARCHS:-native} -DFM_WERROR=${FM_WERROR:-ON} -DFM_TEST_MUTANTS=${MUTANTS:-ON} -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" \
    -DFM_DECODE_DEFS= ${GPU_CMAKE_ARGS:-} &&
  cmake --build build-gpu -j16 --target ${TARGETS:-fp4moe fp4moe_cli bench_gemm bench_layer test_cuda_gemm test_cuda_prepack \
    test_cuda_backend test_cuda_layer test_cuda_route test_cuda_pdl}; } \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
# other GPU tests of the tree, if they build (not fatal: someone else's file may be half-written);
# TARGETS=... (a short call: only those targets, e.g. the W4A8 tests and benchmarks) skips it
[ -n "${TARGETS:-}" ] || cmake --build build-gpu -j16 -- -k >>"$OUT/build.log" 2>&1 || echo "(full build failed; see build.log)"
echo "== built in ${SECONDS} s"
run_ctest() {
  [ "${CTEST:-1}" = 0 ] && { echo "== ctest -L gpu: skipped (CTEST=0)"; return; }
  echo "== ctest -L gpu"
  (cd build-gpu && timeout ${CTEST_S:-400} ctest -L gpu ${CTEST_J:+-j$CTEST_J} ${CTEST_ARGS:-} --output-on-failure --timeout 300) >"$OUT/ctest.log" 2>&1
  grep -E "tests passed|Test +#|Failed|SKIP" "$OUT/ctest.log" | tail -20
}
# CTEST_LAST=1 (layer mode): the benchmarks first, the GPU tests at the end of the call
[ "${CTEST_LAST:-0}" = 1 ] && [ "$MODE" = layer ] || run_ctest
# the PDL chains (test_cuda_pdl, small) under memcheck and racecheck
pdl_sanitize() {
  local cs; cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 120 "$cs" --tool memcheck --error-exitcode 9 build-gpu/tests/test_cuda_pdl >"$OUT/memcheck_pdl.log" 2>&1
  echo "memcheck test_cuda_pdl rc=$?  $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_pdl.log" | tail -1)"
  timeout 150 "$cs" --tool racecheck --error-exitcode 9 build-gpu/tests/test_cuda_pdl >"$OUT/racecheck_pdl.log" 2>&1
  echo "racecheck test_cuda_pdl rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck_pdl.log" | tail -1)"
}
if [ "$MODE" = layer ]; then
  # the device-resident layer (issue 17): its GPU test under memcheck + racecheck, the layer
  # benchmark (graph replay / eager / GEMMs alone vs the floor) and the torch BF16 layer peer
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  echo "== bench_layer ${LAYER_ARGS:-}"
  timeout ${LAYER_S:-240} build-gpu/bench/bench_layer ${LAYER_ARGS:-} >"$OUT/bench_layer.log" 2>&1 || tail -5 "$OUT/bench_layer.log"
  grep -v "^csv" "$OUT/bench_layer.log"
  if [ -n "${LAYER_ARGS2:-}" ]; then
    echo "== ${LAYER_ENV2:-} bench_layer $LAYER_ARGS2"
    # LAYER_ARGS2="... --no-pdl-chain" (or LAYER_ENV2): the second run with a switch (an A/B in one call)
    timeout ${LAYER_S:-240} env ${LAYER_ENV2:-} build-gpu/bench/bench_layer $LAYER_ARGS2 >"$OUT/bench_layer2.log" 2>&1 || tail -5 "$OUT/bench_layer2.log"
    grep -v "^csv" "$OUT/bench_layer2.log"
  fi
  if [ "${TORCH_S:-240}" != 0 ]; then
    echo "== torch_layer"
    PYTHONUNBUFFERED=1 timeout ${TORCH_S:-240} python3 bench/torch_layer.py ${LAYER_ARGS:-} --out "$OUT/torch_layer.json" >"$OUT/torch_layer.log" 2>&1 || tail -5 "$OUT/torch_layer.log"
    cat "$OUT/torch_layer.log"
  fi
  if [ -n "${PY_OVERHEAD:-}" ]; then
    echo "== py_overhead"
    FP4MOE_LIBRARY=$PWD/build-gpu/python/libfp4moe.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 timeout ${PY_S:-90} \
      python3 bench/py_overhead.py --gpu --json "$OUT/py_overhead.json" >"$OUT/py_overhead.log" 2>&1 || tail -5 "$OUT/py_overhead.log"
    tail -25 "$OUT/py_overhead.log"
  fi
  if [ "${MEMCHECK_S:-200}" != 0 ]; then
    timeout ${MEMCHECK_S:-200} "$CS" --tool memcheck --error-exitcode 9 build-gpu/tests/test_cuda_layer >"$OUT/memcheck_layer.log" 2>&1
    echo "memcheck test_cuda_layer rc=$?  $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_layer.log" | tail -1)"
  fi
  if [ "${RACECHECK_S:-200}" != 0 ]; then
    timeout ${RACECHECK_S:-200} "$CS" --tool racecheck --error-exitcode 9 build-gpu/tests/test_cuda_layer >"$OUT/racecheck_layer.log" 2>&1
    echo "racecheck test_cuda_layer rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck_layer.log" | tail -1)"
  fi
  # ROUTE_BENCH=1: the router-logits kernels alone (bench_route: warp16 / warp48 / tiled / the layer's pick)
  if [ -n "${ROUTE_BENCH:-}" ]; then
    echo "== bench_route"
    timeout ${ROUTE_S:-90} build-gpu/bench/bench_route ${ROUTE_ARGS:-} 2>&1 | tee "$OUT/bench_route.log"
  fi
  # WL_SANITIZE=1: the work-list / split-K GEMM tests (FM_TEST_FILTER) under memcheck + racecheck
  if [ -n "${WL_SANITIZE:-}" ]; then
    for t in test_k_split test_expert_list; do for tool in memcheck racecheck; do
      FM_QUICK=1 FM_TEST_FILTER=$t timeout ${WL_S:-120} "$CS" --tool $tool --error-exitcode 9 build-gpu/tests/test_cuda_gemm >"$OUT/${tool}_$t.log" 2>&1
      echo "$tool test_cuda_gemm $t rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/${tool}_$t.log" | tail -1)"
    done; done
  fi
  # NCU_LAYER="1 8": per-kernel time, grid, DRAM throughput, registers, occupancy limits,
  # achieved occupancy and waves of the layer's first graph replays at those T (ep8 routing,
  # external ids): where a small-batch forward spends its time
  for tk in ${NCU_LAYER:-}; do
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    echo "== ncu bench_layer --ts $tk (ep8, first graph replays)"
    timeout ${NCU_S:-90} "$NCU" --clock-control none --launch-count ${NCU_COUNT:-24} \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,launch__waves_per_multiprocessor \
      build-gpu/bench/bench_layer --ts "$tk" --reps 3 >"$OUT/ncu_layer_$tk.log" 2>&1
    awk '/^  [a-zA-Z_].*\(/ {k=$1} /gpu__time_duration.sum|launch__grid_size|dram__throughput|dram__bytes_read|registers_per_thread|occupancy_limit|warps_active|waves_per/ {printf "%-34s %-48s %s %s\n", substr(k,1,34), $1, $(NF-1), $NF}' \
      "$OUT/ncu_layer_$tk.log" | head -${NCU_LINES:-100}
  done
  [ "${CTEST_LAST:-0}" = 1 ] && run_ctest
  for tk in 1 64; do echo "-- fp4moe run --check --tokens $tk: $(timeout 90 build-gpu/fp4moe run --check --tokens $tk 2>&1 | grep -E 'time|check|graph|ms' | tr '\n' ' ')"; done
  for tk in 1 8; do echo "-- fp4moe run EP8 rank 0 (--global-experts 256 --shard 0:32 --routing external) --tokens $tk: $(timeout 90 build-gpu/fp4moe run --check --global-experts 256 --shard 0:32 --routing external --tokens $tk --iters 50 2>&1 | grep -E 'time|check|graph|ms' | tr '\n' ' ')"; done
  exit 0
fi
if [ "$MODE" = session ]; then
  # the issue-31/34/35 call of 2026-12-06 (was an ad-hoc script): each part when its variable is set
  #   DISP="1,4,16,64,256"   bench_layer --dispatched (the layer on dispatched rows vs the run)
  #   W4A8=1                 bench_fp8mma (the E4M3 GEMM alone) + bench/probe/mma_rate_probe.cu
  #   DECODE="1,2,4,8"       bench_layer --decode (DECODE_SPLITS="auto,6/4,12/8": the decode kernel at
  #                          each of those FC1 / FC2 K splits too), then for each of VARIANTS="4x4 6x3"
  #                          (FM_DECODE_STAGES x FM_DECODE_MIN_BLOCKS) decode.cu alone rebuilt
  #                          (-DFM_DECODE_DEFS) and the same run; the defaults restored last
  # run ctest first with CTEST_ARGS="-R dispatch|act_fp8|fp8mma" for a subset
  if [ -n "${DISP:-}" ]; then
    echo "== bench_layer --dispatched --ts $DISP"
    timeout ${DISP_S:-240} build-gpu/bench/bench_layer --dispatched --ts "$DISP" >"$OUT/bench_disp.log" 2>&1 || tail -5 "$OUT/bench_disp.log"
    grep -E "^dispatched.*graph|^dispatched.*sums" "$OUT/bench_disp.log"
  fi
  if [ -n "${W4A8:-}" ]; then
    echo "== bench_fp8mma"
    timeout 120 build-gpu/bench/bench_fp8mma ${FP8_ARGS:-} 2>&1 | tee "$OUT/bench_fp8mma.log"
    nvcc -O3 -arch=native -o "$OUT/mma_rate" bench/probe/mma_rate_probe.cu && "$OUT/mma_rate" | tee "$OUT/mma_rate.log"
    rm -f "$OUT/mma_rate"
  fi
  if [ -n "${DECODE:-}" ]; then
    echo "== bench_layer --decode --ts $DECODE (defaults)"
    timeout ${DECODE_S:-200} build-gpu/bench/bench_layer --decode --ts "$DECODE" ${DECODE_SPLITS:+--decode-splits "$DECODE_SPLITS"} \
      >"$OUT/bench_decode.log" 2>&1 || tail -5 "$OUT/bench_decode.log"
    grep "^decode" "$OUT/bench_decode.log"
    for v in ${VARIANTS:-}; do
      st=${v%x*}; mb=${v#*x}
      cmake -S . -B build-gpu -DFM_DECODE_DEFS="FM_DECODE_STAGES=$st;FM_DECODE_MIN_BLOCKS=$mb" >"$OUT/build-v$v.log" 2>&1 &&
        cmake --build build-gpu -j16 --target bench_layer >>"$OUT/build-v$v.log" 2>&1 || { tail -20 "$OUT/build-v$v.log"; continue; }
      echo "== decode variant: $st stages, $mb CTAs/SM: $(grep decode_kernel build-gpu/kernel_resources.csv | grep -v sm_1 | head -1)"
      timeout 200 build-gpu/bench/bench_layer --decode --ts "$DECODE" >"$OUT/bench_decode_v$v.log" 2>&1 || tail -5 "$OUT/bench_decode_v$v.log"
      grep "^decode" "$OUT/bench_decode_v$v.log"
    done
    [ -n "${VARIANTS:-}" ] && cmake -S . -B build-gpu -DFM_DECODE_DEFS= >/dev/null 2>&1 && cmake --build build-gpu -j16 --target bench_layer >/dev/null 2>&1
  fi
  exit 0
fi
if [ "$MODE" = w4a8 ]; then
  [ "${BENCH:-1}" = 0 ] && { echo "== benchmarks: skipped (BENCH=0)"; exit 0; }
  # issue 34: the W4A8 GEMM alone (bench_fp8mma: every kernel, MXFP4 gpt-oss and NVFP4 GLM-5
  # shapes), then the GLM-5 layer W4A16 and W4A8 (per 128) in the same call, graph replay
  # (run ctest first with CTEST_ARGS="-R fp8|cuda_layer|contract" for the W4A8 layer's tests)
  echo "== bench_fp8mma"
  timeout ${FP8_S:-120} build-gpu/bench/bench_fp8mma ${FP8_ARGS:-} >"$OUT/bench_fp8mma.log" 2>&1 || tail -5 "$OUT/bench_fp8mma.log"
  grep -v "^csv" "$OUT/bench_fp8mma.log"
  # the layer: W4A16, then W4A8 on each GEMM kernel named in W4A8_KERNELS (FM_W4A8_KERNEL, read
  # at create; "auto" = the default pick)
  for run in w4a16 ${W4A8_KERNELS:-auto staged16 staged32 staged64}; do
    act=""; [ "$run" = w4a16 ] || act="--act-fp8 block128"
    echo "== bench_layer ${W4A8_LAYER_ARGS:---ts 16,256,1024,4096 --reps 16} $act (${run})"
    FM_W4A8_KERNEL=$([ "$run" = w4a16 ] || echo "$run") timeout ${W4A8_LAYER_S:-100} build-gpu/bench/bench_layer \
      ${W4A8_LAYER_ARGS:---ts 16,256,1024,4096 --reps 16} $act >"$OUT/bench_layer_$run.log" 2>&1 || tail -5 "$OUT/bench_layer_$run.log"
    grep -v "^csv" "$OUT/bench_layer_$run.log" | grep -v "^#"
  done
  exit 0
fi
if [ "$MODE" = decode-delay ]; then
  # issue 31's flag-protocol test: decode.cu rebuilt with random CTA delays (FM_DECODE_DELAY,
  # FM_DECODE_DELAY_NS), test_cuda_decode (decode = chain bit for bit) plain, then under
  # memcheck and racecheck; the defaults restored last
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # DELAY_EXTRA: more definitions for the same build (e.g. FM_DECODE_STAGES=6); both unit forms
  # (strides at T = 1, the counter from T = 2, fm_decode_params.dynamic) run in test_cuda_decode
  cmake -S . -B build-gpu -DFM_DECODE_DEFS="FM_DECODE_DELAY=1${DELAY_NS:+;FM_DECODE_DELAY_NS=$DELAY_NS}${DELAY_EXTRA:+;$DELAY_EXTRA}" >"$OUT/build-delay.log" 2>&1 &&
    cmake --build build-gpu -j16 --target test_cuda_decode >>"$OUT/build-delay.log" 2>&1 || { tail -20 "$OUT/build-delay.log"; exit 1; }
  for rep in 1 2; do
    timeout ${DELAY_S:-300} build-gpu/tests/test_cuda_decode >"$OUT/decode_delay_$rep.log" 2>&1
    echo "test_cuda_decode, delayed CTAs, run $rep: rc=$?  $(grep -E 'PASSED|FAILED' "$OUT/decode_delay_$rep.log" | tail -1)"
  done
  # --report-api-errors no: test_decode_grid_guard makes the launch fail on purpose (error 720)
  for tool in memcheck racecheck; do
    FM_QUICK=1 timeout ${DELAY_SAN_S:-400} "$CS" --tool $tool --report-api-errors no --error-exitcode 9 build-gpu/tests/test_cuda_decode >"$OUT/decode_delay_$tool.log" 2>&1
    echo "$tool test_cuda_decode (delayed) rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/decode_delay_$tool.log" | tail -1)"
  done
  cmake -S . -B build-gpu -DFM_DECODE_DEFS= >/dev/null 2>&1 && cmake --build build-gpu -j16 --target test_cuda_decode >/dev/null 2>&1
  exit 0
fi
if [ "$MODE" = nccl-ep1 ]; then
  # issue 35 item 4: the NCCL EP example with a world of one rank, LL and HT. Carry .ncclep
  # (scripts/ncclep-carry.sh: nccl-extensions' libnccl_ep.so and headers); NCCL is the one the
  # machine's torch brings (nvidia/nccl of its site-packages), linked into .ncclep/ here, so
  # FM_NCCL_EP_ROOT=.ncclep holds both as the example's cmake expects.
  [ -d .ncclep/nccl/ep ] || { echo "nccl-ep1: no .ncclep (run scripts/ncclep-carry.sh, carry .ncclep)"; exit 1; }
  NV=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null || true)
  # NCCL 2.30 carried in parts (scripts/ncclep-carry.sh --nccl: torch's NCCL is too old for
  # libnccl_ep.so): joined here when every part is on the machine and the SHA-256 matches
  if [ -f .ncclep-nccl-1/SHA256 ] && [ -d .ncclep-nccl/include ]; then
    mkdir -p .ncclep-nccl/lib && cat $(ls -d .ncclep-nccl-[0-9]* | sort -t- -k3 -n | sed 's|$|/part|') >.ncclep-nccl/lib/libnccl.so.2
    if [ "$(sha256sum .ncclep-nccl/lib/libnccl.so.2 | cut -d' ' -f1)" = "$(cat .ncclep-nccl-1/SHA256)" ]; then
      NV=$PWD/.ncclep-nccl; echo "nccl-ep1: the carried NCCL, joined from $(ls -d .ncclep-nccl-[0-9]* | wc -l) parts"
    else
      echo "nccl-ep1: the carried NCCL parts do not match their SHA-256 (a part missing?): $(ls -d .ncclep-nccl-[0-9]* | tr '\n' ' ')"
    fi
  fi
  [ -n "$NV" ] && [ -d "$NV" ] || { echo "nccl-ep1: no NCCL: this machine's python has no nvidia.nccl (torch's NCCL) and no parts were carried"; exit 1; }
  mkdir -p .ncclep/nvidia && ln -sfn "$NV" .ncclep/nvidia/nccl
  echo "NCCL of this machine: $NV: $(grep -hE '#define NCCL_(MAJOR|MINOR|PATCH) ' "$NV"/include/nccl.h 2>/dev/null | awk '{print $3}' | tr '\n' '.' ) (nccl-extensions pins 2.30.7)"
  ls "$NV"/lib | head -5
  cmake -S . -B build-gpu -DFM_NCCL_EP=ON -DFM_NCCL_EP_ROOT="$PWD/.ncclep" >"$OUT/nccl_ep_cmake.log" 2>&1 &&
    cmake --build build-gpu -j16 --target fm_nccl_ep_step >"$OUT/nccl_ep_build.log" 2>&1 ||
    { tail -n 20 "$OUT/nccl_ep_cmake.log" "$OUT/nccl_ep_build.log"; exit 1; }
  for m in ll ht; do
    for args in "--hidden 1024 --inter 512 --experts 16 --topk 4 --tokens 8" "--tokens ${NCCL_T:-16}"; do
      echo "== fm_nccl_ep_step --world 1 --mode $m $args"
      NCCL_NVLS_ENABLE=0 timeout ${NCCL_S:-180} build-gpu/fm_nccl_ep_step --rank 0 --world 1 --mode $m $args 2>&1 | tail -12
    done
  done
  exit 0
fi
if [ "$MODE" = perf ]; then
  echo "== bench_gemm --quick"
  build-gpu/bench/bench_gemm ${BENCH_ARGS:---quick} >"$OUT/bench.log" 2>&1 || tail -5 "$OUT/bench.log"
  grep -E "^#" "$OUT/bench.log"
  sed -n '/^shape/,$p' "$OUT/bench.log"
  exit 0
fi
if [ "$MODE" = verify ]; then
  # after a refit or a small change: the quick bench (launcher columns), the layer on the
  # GPU (fp4moe run, --check at 1 and 4 tokens), then memcheck + racecheck (quick subset)
  echo "== bench_gemm --quick"
  build-gpu/bench/bench_gemm --quick >"$OUT/bench.log" 2>&1 || tail -5 "$OUT/bench.log"
  grep -E "^#" "$OUT/bench.log"
  sed -n '/^shape/,$p' "$OUT/bench.log"
  echo "== fp4moe run (GLM-5 EP8 defaults)"
  for tk in 1 4; do timeout 90 build-gpu/fp4moe run --check --tokens $tk 2>&1 | grep -E "time|check"; done
  for tk in 16 64 256 1024; do echo "tokens $tk: $(timeout 90 build-gpu/fp4moe run --tokens $tk 2>&1 | grep -E 'time')"; done
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  FM_QUICK=1 timeout ${MEMCHECK_S:-150} "$CS" --tool memcheck --error-exitcode 9 build-gpu/tests/test_cuda_gemm >"$OUT/memcheck.log" 2>&1
  echo "memcheck (FM_QUICK) rc=$?  $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  FM_QUICK=1 timeout ${RACECHECK_S:-200} "$CS" --tool racecheck --error-exitcode 9 build-gpu/tests/test_cuda_gemm >"$OUT/racecheck.log" 2>&1
  echo "racecheck (FM_QUICK) rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
  pdl_sanitize
  exit 0
fi
if [ "$MODE" = results ]; then
  # the figures for bench/RESULTS.md: ceilings + torch peer, the full bench, the CLI
  # on the GPU, then (last, time permitting) memcheck of the GEMM test's quick subset
  echo "== torch peer + ceilings"
  PYTHONUNBUFFERED=1 timeout 200 python3 bench/torch_peer.py --out "$OUT/torch_peer.json" >"$OUT/torch.log" 2>&1 || tail -5 "$OUT/torch.log"
  BF16=$(python3 -c "import json;print(json.load(open('$OUT/torch_peer.json'))['bf16_tflops'])" 2>/dev/null || echo 0)
  echo "== bench_gemm (full)"
  build-gpu/bench/bench_gemm --bf16-tflops "$BF16" >"$OUT/bench.log" 2>&1 || tail -5 "$OUT/bench.log"
  [ -n "${SKIP_CLI:-}" ] || { build-gpu/fp4moe devices
    for tk in 1 4; do echo "-- fp4moe run --check --tokens $tk"; timeout 90 build-gpu/fp4moe run --check --tokens $tk; echo "rc=$?"; done
  } >"$OUT/cli.log" 2>&1
  echo "== table ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader))"
  grep "^#" "$OUT/bench.log"
  python3 bench/gpu_table.py "$OUT/bench.log" "$OUT/torch_peer.json" | tee "$OUT/table.md"
  [ -f "$OUT/cli.log" ] && grep -E "^-- |ms|NMSE|nmse|rc=" "$OUT/cli.log" | head -30
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ "${MEMCHECK_S:-120}" = 0 ] && exit 0
  FM_QUICK=1 timeout ${MEMCHECK_S:-120} "$CS" --tool memcheck --error-exitcode 9 build-gpu/tests/test_cuda_gemm >"$OUT/memcheck.log" 2>&1
  echo "memcheck (FM_QUICK) rc=$?  $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  [ "${RACECHECK_S:-150}" = 0 ] && exit 0
  FM_QUICK=1 timeout ${RACECHECK_S:-150} "$CS" --tool racecheck --error-exitcode 9 build-gpu/tests/test_cuda_gemm >"$OUT/racecheck.log" 2>&1
  echo "racecheck (FM_QUICK) rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
  pdl_sanitize
  exit 0
fi
echo "== compute-sanitizer"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 240 "$CS" --tool memcheck --error-exitcode 9 build-gpu/tests/test_cuda_gemm >"$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?  $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
FM_QUICK=1 timeout 150 "$CS" --tool racecheck --error-exitcode 9 build-gpu/tests/test_cuda_gemm >"$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
pdl_sanitize
[ "$MODE" = test ] && exit 0
echo "== torch peer + ceilings"
Q=""; [ "$MODE" = quick ] && Q="--quick"
PYTHONUNBUFFERED=1 python3 bench/torch_peer.py --out "$OUT/torch_peer.json" $Q >"$OUT/torch.log" 2>&1 || tail -5 "$OUT/torch.log"
BF16=$(python3 -c "import json;print(json.load(open('$OUT/torch_peer.json'))['bf16_tflops'])" 2>/dev/null || echo 0)
echo "== bench_gemm"
build-gpu/bench/bench_gemm --bf16-tflops "$BF16" $Q >"$OUT/bench.log" 2>&1 || tail -5 "$OUT/bench.log"
if command -v ncu >/dev/null; then
  echo "== ncu"
  timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats \
    -k "regex:(^|::)mma_" --launch-skip 3 --launch-count 1 build-gpu/bench/bench_gemm --quick --reps 3 \
    >"$OUT/ncu.log" 2>&1
  grep -E "DRAM Throughput|Duration|Compute \(SM\)|L2 Cache Throughput|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued" "$OUT/ncu.log" | head -16
fi
if [ "$MODE" = full ]; then
  echo "== CLI on the GPU"
  [ -n "${SKIP_CLI:-}" ] || { build-gpu/fp4moe devices
    for tk in 1 4 64; do echo "-- fp4moe run --check --tokens $tk"; build-gpu/fp4moe run --check --tokens $tk; echo "rc=$?"; done
  } >"$OUT/cli.log" 2>&1
fi
echo "== table ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader))"
grep "^#" "$OUT/bench.log"
python3 bench/gpu_table.py "$OUT/bench.log" "$OUT/torch_peer.json" | tee "$OUT/table.md"
[ -f "$OUT/cli.log" ] && { echo "== CLI (fp4moe devices; fp4moe run --check, GLM-5 EP8 defaults)"; cat "$OUT/cli.log"; }
