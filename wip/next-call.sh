#!/usr/bin/env bash
# wip/next-call.sh - the next session's first device call (wip/README.md): wip/decode-auto.patch
# applied to the device's copy, the GPU tests it touches (AUTO now takes the decode kernel at
# <= 1 expected local routed slot on sm_90, so every layer test's T = 1-2 shard buckets run it),
# then each model's chain against the decode kernel at T = 1, 2, 4 (is the rule's pick the faster
# one, DeepSeek-V3 EP8 T = 1 included, never timed on this kernel body), the internal routing's
# local experts (bench_layer's new "# internal routing" line), and an ncu listing of one
# internal-routing layer call's kernels by name.
#   run: bash wip/next-call.sh      carry [".debs"], timeout 600 (about 6 min on an H100)
set -uo pipefail
T0=$SECONDS
. bench/device_env.sh
patch -p1 --forward -s < wip/decode-auto.patch || { echo "PATCH decode-auto FAILED"; exit 1; }
echo "== patched: decode-auto"
MUTANTS=OFF CTEST_J=4 CTEST_S=240 BENCH=0 \
  TARGETS="fp4moe bench_layer test_cuda_decode test_cuda_layer test_cuda_gptoss test_cuda_gate_up test_cuda_dispatch test_cuda_route test_cuda_backend" \
  CTEST_ARGS="-R decode|test_cuda_layer$|gptoss|gate_up|dispatch|route|backend" bash bench/gpu-check.sh w4a8
grep -E "tests passed|Failed|FAIL" "$OUT/ctest.log" | head
grep -E "T=[ 0-9]+: ON decode" "$OUT"/ctest.log | head -8
for m in glm5 deepseek-v3 qwen3-235b gpt-oss-120b; do
  echo "== $m (the table's graph_us: AUTO's plan)"
  timeout 90 build-gpu/bench/bench_layer --model $m --decode --ts 1,2,4 >"$OUT/dec_$m.log" 2>&1
  grep -E "^(ep|local|decode)|internal routing:" "$OUT/dec_$m.log" | sed 's/ graph ext: chain/ ext/; s/| [0-9]* CTAs.*//' | cut -c1-160
done
# one GLM-5 EP8 T = 1 layer call's kernels (eager external, graphs ext + int), by name
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 120 "$NCU" --clock-control none --csv --page raw --metrics gpu__time_duration.sum --launch-count 120 \
  build-gpu/bench/bench_layer --ts 1 --reps 2 >"$OUT/ncu_t1.csv" 2>"$OUT/ncu_t1.err"
python3 - "$OUT/ncu_t1.csv" <<'PY'
import csv, sys, collections, statistics
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if hdr is None: sys.exit("ncu: no table (see ncu_t1.err)")
h = rows[hdr]; k, t = h.index("Kernel Name"), h.index("gpu__time_duration.sum")
d = collections.OrderedDict()
for r in rows[hdr + 2:]:
    try: d.setdefault(r[k].split("(")[0][-70:], []).append(float(r[t]))
    except (ValueError, IndexError): pass
for name, v in d.items(): print(f"{name:70s} {len(v):4d} {statistics.median(v):9.2f}")
PY
echo "== done in $((SECONDS - T0)) s"
