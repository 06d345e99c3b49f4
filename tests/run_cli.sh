#!/usr/bin/env bash
# `fp4moe run` as a user drives it: exit codes, messages, --json, --check on a small layer.
set -u
FM=$1
fails=0 n=0
expect() { # expect CODE PATTERN -- ARGS...
  local code=$1 pat=$2; shift 3
  n=$((n+1))
  out=$("$FM" "$@" 2>&1); rc=$?
  if [ "$rc" != "$code" ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: fp4moe $* -> rc=$rc (want $code), output:"; echo "$out" | head -5; fails=$((fails+1))
  else echo "ok: fp4moe $* -> $rc"; fi
}
small=(--experts 8 --topk 2 --hidden 256 --inter 128 --tokens 3 --iters 2)
expect 0 "passed" -- run "${small[@]}" --check --backend cpu
expect 0 "passed" -- run "${small[@]}" --check --backend cpu-ref --format mxfp4
expect 0 "passed" -- run "${small[@]}" --check --backend cpu --format bf16 --score softmax --groups 4 --topk-group 2
expect 0 "passed" -- run "${small[@]}" --check --backend cpu --act-nvfp4 --shared-inter 64
expect 0 "FP8 activations (per 128)" -- run "${small[@]}" --check --backend cpu --act-fp8 block128
expect 0 "passed" -- run "${small[@]}" --check --backend cpu --act-fp8 token --shared-inter 64
expect 2 "act-fp8" -- run "${small[@]}" --act-fp8 e5m2
expect 2 "choose one" -- run "${small[@]}" --act-fp8 token --act-nvfp4
expect 2 "unknown or incomplete flag" -- run --bogus
expect 2 "expects an integer" -- run --tokens -3
expect 2 "expects an integer" -- run --experts ""
expect 2 "expects nvfp4, mxfp4 or bf16" -- run --format int3
# --routed-scale's stated range is all accepted: 1e30 was in it, then refused by the layer as
# "must be finite and > 0" (the layer takes < 1e30)
expect 2 "--routed-scale expects a number in \[1e-30, 1e+29\], got '1e30'" -- run --routed-scale 1e30
expect 0 "passed" -- run "${small[@]}" --check --backend cpu --routed-scale 1e29
expect 2 "top_k=9 must be in" -- run --experts 8 --topk 9
expect 2 "multiples of the nvfp4 block" -- run --hidden 100 --experts 8
expect 2 "takes from the checkpoint" -- run --weights /nonexistent --experts 4
expect 2 "needs --weights" -- run --layer 3
expect 2 "exceeds 2^31-1" -- run --tokens 1048576 --topk 4096 --experts 4096
expect 1 "FM_ERR_IO" -- run --weights /nonexistent/ckpt
# an empty path (a script's unset variable) is a usage error naming the flag, not an internal
# function's "empty path" with exit 1 (and --input '' no longer waits for the weights to be made)
expect 2 "--weights expects a file name" -- run --weights ""
expect 2 "--input expects a file name" -- run --input ""
expect 2 "--output expects a file name" -- run "${small[@]}" --output ""
expect 0 "usage: fp4moe run" -- run --help
# --backend cuda on a machine without a GPU (or a build without CUDA): exit 3, said at once
if ! "$FM" devices >/dev/null 2>&1; then expect 3 "FM_ERR_NO_" -- run --backend cuda; fi
# --json parses and carries the fields
n=$((n+1))
if "$FM" run "${small[@]}" --check --backend cpu --json | "${PYTHON:-python3}" -c '
import json,sys; j=json.load(sys.stdin)
need={"backend","format","time_ms","bytes","gbps","nmse","check_passed","active_experts"}
assert need <= set(j), need - set(j); assert j["check_passed"] is True and j["backend"] == "cpu"'; then echo "ok: --json"
else echo "FAIL: --json"; fails=$((fails+1)); fi
# expert shards (issue 17): each checked against the reference holding the same shard, the
# shards' outputs summed = the whole layer; external routing = internal; bad shard / routing flags
gs=(--topk 4 --hidden 256 --inter 128 --tokens 9 --iters 1 --backend cpu)
sh=(--experts 16 "${gs[@]}")
expect 0 "experts \[4, 8) held, external routing" -- run "${sh[@]}" --shard 4:4 --routing external --check
expect 0 "experts \[12, 16) held, internal routing" -- run "${sh[@]}" --shard 12:4 --check --backend cpu-ref
expect 2 "--shard expects FIRST:COUNT" -- run "${sh[@]}" --shard 4
expect 2 "--shard expects FIRST:COUNT" -- run "${sh[@]}" --shard 4:0
expect 2 "is not a range of the layer's 16 experts" -- run "${sh[@]}" --shard 12:5
expect 2 "--routing expects internal or external" -- run "${sh[@]}" --routing maybe
expect 0 "experts \[4, 8) held" -- run "${sh[@]}" --shard 4:4 --work-list off --row-quantile 0.9 --check
expect 2 "--work-list expects auto, on or off" -- run "${sh[@]}" --work-list sometimes
expect 0 "passed" -- run "${sh[@]}" --row-quantile mean --check
expect 0 "passed" -- run "${sh[@]}" --row-quantile auto --check
expect 2 "--row-quantile expects auto, mean or a quantile" -- run "${sh[@]}" --row-quantile 0.3
expect 2 "--row-quantile" -- run "${sh[@]}" --row-quantile 1
expect 2 "--row-quantile" -- run "${sh[@]}" --row-quantile 0.9x
# --plan: malformed specs are usage errors; a CPU layer has no plan to replace
expect 2 "unknown item 'fc3=x'" -- run "${sh[@]}" --plan fc3=x
expect 2 "'bogus' is not a tile name" -- run "${sh[@]}" --plan fc1=bogus
expect 2 "K splits must be an integer in \[1, 32\], got '0'" -- run "${sh[@]}" --plan fc1=mma_w4m2n1k256s3/0
expect 2 "list=N expects N >= 1" -- run "${sh[@]}" --plan fc2=mma_w4m1n1k256s3,list=0
expect 2 "the cpu backend has no tile plan" -- run "${sh[@]}" --backend cpu --plan fc1=mma_w4m2n1k256s3/2,list
expect 2 "--tune applies to the cuda backend (fm_layer_tune)" -- run "${sh[@]}" --backend cpu --tune
n=$((n+1))
d=$(mktemp -d)
ok=1
"$FM" run "${sh[@]}" --output "$d/all.npy" >/dev/null 2>&1 || ok=0
"$FM" run "${sh[@]}" --routing external --output "$d/ext.npy" >/dev/null 2>&1 || ok=0
for q in 0:4 4:4 8:4 12:4; do "$FM" run "${sh[@]}" --shard $q --output "$d/s${q%%:*}.npy" >/dev/null 2>&1 || ok=0; done
if [ $ok = 1 ] && "${PYTHON:-python3}" -c '
import sys, numpy as np
d = sys.argv[1]
a = np.load(d + "/all.npy").astype(np.float64)
assert np.isfinite(a).all() and (a != 0).any()
assert (np.load(d + "/ext.npy") == np.load(d + "/all.npy")).all(), "external != internal routing"
s = sum(np.load(f"{d}/s{q}.npy").astype(np.float64) for q in (0, 4, 8, 12))
e = ((s - a) ** 2).sum() / (a ** 2).sum()
assert e <= 1e-11, f"shards summed vs the layer: NMSE {e}"' "$d"; then echo "ok: 4 shards summed = the layer, external = internal routing"
else echo "FAIL: shards / external routing through --output"; fails=$((fails+1)); fi
rm -rf "$d"
# --global-experts N (issue 17): a shard of a bigger model holds only its experts' weights, each made
# as in the whole model, so it equals --experts N --shard F:C bit for bit; bad combinations exit 2
expect 0 "experts \[4, 8) held, external routing" -- run "${gs[@]}" --global-experts 32 --shard 4:4 --routing external --check
expect 2 "contradicts --shard 0:4" -- run "${gs[@]}" --global-experts 32 --experts 8 --shard 0:4
expect 2 "is not a range of the layer's 8 experts (--global-experts)" -- run "${gs[@]}" --global-experts 8 --shard 6:4
expect 2 "takes from the checkpoint" -- run --weights /nonexistent --global-experts 256
expect 2 "--global-experts expects an integer" -- run "${gs[@]}" --global-experts 0
n=$((n+1))
d=$(mktemp -d)
ok=1
"$FM" run "${sh[@]}" --shard 8:4 --output "$d/s.npy" >/dev/null 2>&1 || ok=0
"$FM" run "${gs[@]}" --global-experts 16 --shard 8:4 --output "$d/g.npy" >/dev/null 2>&1 || ok=0
"$FM" run "${sh[@]}" --shard 0:4 --routing external --output "$d/s0.npy" >/dev/null 2>&1 || ok=0
"$FM" run "${gs[@]}" --experts 4 --global-experts 16 --routing external --output "$d/g0.npy" >/dev/null 2>&1 || ok=0
if [ $ok = 1 ] && cmp -s "$d/s.npy" "$d/g.npy" && cmp -s "$d/s0.npy" "$d/g0.npy"; then
  echo "ok: --global-experts 16 --shard 8:4 = --experts 16 --shard 8:4, --global-experts 16 --experts 4 = --shard 0:4"
else echo "FAIL: --global-experts vs the whole model's shard"; fails=$((fails+1)); fi
rm -rf "$d"
# --output (issue 30): a symbolic link, a FIFO, a read-only file (refused for root too) or a
# device at the path is refused before the run, exit 1 naming it, and left exactly as it was
# (the old writer renamed a regular file over it and exited 0); no temporary stays behind
d=$(mktemp -d)
echo keep > "$d/target"; ln -s "$d/target" "$d/link.npy"; ln -s "$d/nowhere" "$d/dangling.npy"
mkfifo "$d/fifo.npy"; echo old > "$d/ro.npy"; chmod 444 "$d/ro.npy"
expect 1 "FM_ERR_IO: $d/link.npy: refusing to write: it is a symbolic link" -- run "${small[@]}" --backend cpu --output "$d/link.npy"
expect 1 "FM_ERR_IO: $d/dangling.npy: refusing to write: it is a symbolic link" -- run "${small[@]}" --backend cpu --output "$d/dangling.npy"
expect 1 "FM_ERR_IO: $d/fifo.npy: refusing to write: it is a FIFO" -- run "${small[@]}" --backend cpu --output "$d/fifo.npy"
expect 1 "FM_ERR_IO: $d/ro.npy: refusing to write: the file is read-only" -- run "${small[@]}" --backend cpu --output "$d/ro.npy"
expect 1 "FM_ERR_IO: $d/no/y.npy: cannot create a temporary" -- run "${small[@]}" --backend cpu --output "$d/no/y.npy"
n=$((n+1))
if [ -L "$d/link.npy" ] && [ "$(cat "$d/target")" = keep ] && [ -L "$d/dangling.npy" ] && [ ! -e "$d/nowhere" ] &&
   [ -p "$d/fifo.npy" ] && [ "$(cat "$d/ro.npy")" = old ] && [ "$(stat -c %a "$d/ro.npy")" = 444 ] &&
   [ -z "$(find "$d" -name '*.tmp')" ]; then echo "ok: refused --output targets unchanged, no temporary left"
else echo "FAIL: a refused --output target changed:"; ls -la "$d"; fails=$((fails+1)); fi
if [ "$(id -u)" = 0 ] && mknod "$d/full.npy" c 1 7 2>/dev/null; then # what /dev/full is, in our folder
  expect 1 "FM_ERR_IO: $d/full.npy: refusing to write: it is a character device" -- run "${small[@]}" --backend cpu --output "$d/full.npy"
  n=$((n+1))
  if [ -c "$d/full.npy" ]; then echo "ok: device node kept"; else echo "FAIL: device node replaced"; fails=$((fails+1)); fi
fi
expect 0 "passed" -- run "${small[@]}" --backend cpu --check --output "$d/y.npy"
n=$((n+1))
if [ -f "$d/y.npy" ] && [ -z "$(find "$d" -name '*.tmp')" ]; then echo "ok: --output written"
else echo "FAIL: --output not written"; fails=$((fails+1)); fi
rm -rf "$d"
# --json of the CPU path: the fields the cuda path adds are there (graph_ms null: no graph on the host)
n=$((n+1))
if "$FM" run "${gs[@]}" --global-experts 64 --shard 16:16 --json | "${PYTHON:-python3}" -c '
import json,sys; j=json.load(sys.stdin)
assert j["path"] == "host" and j["graph_ms"] is None and j["eager_ms"] == j["time_ms"] > 0, j
assert j["experts"] == 64 and j["shard_first"] == 16 and j["shard_count"] == 16, j
assert 0 < j["active_experts"] <= 16, j'; then echo "ok: --json path/eager_ms/graph_ms, --global-experts"
else echo "FAIL: --json with --global-experts"; fails=$((fails+1)); fi
echo "$((n-fails)) passed, $fails failed"
[ "$fails" = 0 ]
