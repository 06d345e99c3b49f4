#!/usr/bin/env bash
# `fp4moe run` on the cuda backend (issue 17, item 7): the device path (fm_layer_run on device
# buffers and a stream of its own), eager and CUDA-graph-replay times, the replay equal to the
# eager run bit for bit, --routing external with device ids/weights, --shard / --global-experts,
# --check against the CPU reference holding the same shard and routing. Label gpu: skips (77)
# without a device.
set -u
FM=$1
PY=${PYTHON:-python3}
if ! "$FM" devices >/dev/null 2>&1; then
  echo "skipped: no usable CUDA device ('fp4moe devices' failed): run_cli_gpu needs a GPU"; exit 77
fi
fails=0 n=0
expect() { # expect CODE PATTERN -- ARGS...
  local code=$1 pat=$2; shift 3
  n=$((n+1))
  out=$("$FM" "$@" 2>&1); rc=$?
  if [ "$rc" != "$code" ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: fp4moe $* -> rc=$rc (want $code), output:"; echo "$out" | head -12; fails=$((fails+1))
  else echo "ok: fp4moe $* -> $rc"; echo "$out" | grep -E "time|graph|check" | sed 's/^/    /'; fi
}
gs=(--topk 4 --hidden 256 --inter 128 --tokens 9 --iters 3 --backend cuda)
sh=(--experts 16 "${gs[@]}")
expect 0 "equals the eager output bit for bit" -- run "${sh[@]}" --check
expect 0 "passed" -- run "${sh[@]}" --check --routing external
expect 0 "passed" -- run "${sh[@]}" --check --format mxfp4 --tokens 64
expect 0 "experts \[4, 8) held, internal routing" -- run "${sh[@]}" --shard 4:4 --check
expect 0 "experts \[8, 12) held, external routing" -- run "${gs[@]}" --global-experts 64 --shard 8:4 --routing external --check
# GLM-5 EP8 defaults: all local (top-8 of 32), and rank 1 of 256 global experts with the engine's routing
expect 0 "CUDA graph replay" -- run --tokens 1 --iters 20 --check
expect 0 "plan  *bucket of 5 tokens, tiles for .*FC1 [a-z]*_w.*FC2 [a-z]*_w" -- run "${sh[@]}" --tokens 5
expect 0 "experts \[32, 64) held, external routing" -- run --tokens 4 --iters 20 --global-experts 256 --shard 32:32 --routing external --check
# the tuning options: the work list in every bucket or none, tiles for the 0.9-quantile of the rows
expect 0 "passed" -- run --tokens 2 --iters 5 --global-experts 256 --shard 0:32 --routing external --work-list on --check
expect 0 "passed" -- run "${sh[@]}" --tokens 128 --work-list off --row-quantile 0.9 --check
expect 0 "passed" -- run "${sh[@]}" --tokens 128 --row-quantile mean --check
# --plan (fm_layer_set_plan): another plan of T's bucket runs, passes the check and is the one printed;
# one the GEMM cannot run (no SwiGLU pairs in FC1's tile) is refused before any run
expect 0 "FC1 mma_w4m2n1k256s3 (K split 8), FC2 mma_w4m1n1k256s3 (K split 4)" -- run --tokens 1 --iters 5 --global-experts 256 --shard 0:32 --routing external --plan fc1=mma_w4m2n1k256s3/8,fc2=mma_w4m1n1k256s3/4,list --check
expect 1 "SwiGLU needs an even mt" -- run "${sh[@]}" --tokens 4 --plan fc1=mma_w4m1n1k256s3
# --tune (fm_layer_tune): the search runs before the timed runs, the kept plan passes the check
expect 0 "tune  *[0-9][0-9]* plans tried" -- run --tokens 2 --iters 5 --global-experts 256 --shard 0:32 --routing external --tune --check
# --json carries the device path's fields
n=$((n+1))
if "$FM" run "${gs[@]}" --global-experts 64 --shard 16:16 --routing external --check --json | "$PY" -c '
import json,sys; j=json.load(sys.stdin)
assert j["backend"] == "cuda" and j["path"] == "device", j
assert j["eager_ms"] > 0 and j["graph_ms"] > 0 and j["time_ms"] == j["eager_ms"], j
assert j["graph_matches_eager"] is True and j["check_passed"] is True, j
assert j["experts"] == 64 and j["shard_first"] == 16 and j["shard_count"] == 16, j
p = j["plan"]; assert p["bucket_tokens"] == 9 and p["expected_rows"] >= 1, p
assert all(p[g]["tile"].startswith(("mma_w", "wgmma_w")) and p[g]["k_splits"] >= 1 for g in ("fc1", "fc2")), p'; then echo "ok: --json (cuda)"
else echo "FAIL: --json (cuda)"; fails=$((fails+1)); fi
# shards summed = the layer, external routing = internal, on the GPU (FP32 sums in another order: NMSE)
n=$((n+1))
d=$(mktemp -d)
ok=1
"$FM" run "${sh[@]}" --output "$d/all.npy" >/dev/null 2>&1 || ok=0
"$FM" run "${sh[@]}" --routing external --output "$d/ext.npy" >/dev/null 2>&1 || ok=0
for q in 0:4 4:4 8:4 12:4; do "$FM" run "${sh[@]}" --shard $q --output "$d/s${q%%:*}.npy" >/dev/null 2>&1 || ok=0; done
"$FM" run "${gs[@]}" --global-experts 16 --shard 12:4 --output "$d/g12.npy" >/dev/null 2>&1 || ok=0
if [ $ok = 1 ] && "$PY" -c '
import sys, numpy as np
d = sys.argv[1]
L = lambda f: np.load(f"{d}/{f}.npy").astype(np.float64)
a = L("all")
assert np.isfinite(a).all() and (a != 0).any()
nm = lambda x: ((x - a) ** 2).sum() / (a ** 2).sum()
e = nm(L("ext"))
assert e <= 1e-10, f"external vs internal routing: NMSE {e}"
s = sum(L(f"s{q}") for q in (0, 4, 8, 12))
assert nm(s) <= 1e-10, f"shards summed vs the layer: NMSE {nm(s)}"
assert (np.load(f"{d}/g12.npy") == np.load(f"{d}/s12.npy")).all(), "--global-experts 16 --shard 12:4 != --shard 12:4"
' "$d"; then echo "ok: 4 shards summed = the layer, external = internal routing, --global-experts = the shard (cuda)"
else echo "FAIL: shards / external routing / --global-experts through --output (cuda)"; fails=$((fails+1)); fi
rm -rf "$d"
echo "$((n-fails)) passed, $fails failed"
[ "$fails" = 0 ]
