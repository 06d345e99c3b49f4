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
expect 2 "unknown or incomplete flag" -- run --bogus
expect 2 "expects an integer" -- run --tokens -3
expect 2 "expects an integer" -- run --experts ""
expect 2 "expects nvfp4, mxfp4 or bf16" -- run --format int3
expect 2 "top_k=9 must be in" -- run --experts 8 --topk 9
expect 2 "multiples of the nvfp4 block" -- run --hidden 100 --experts 8
expect 2 "takes from the checkpoint" -- run --weights /nonexistent --experts 4
expect 2 "needs --weights" -- run --layer 3
expect 2 "exceeds 2^31-1" -- run --tokens 1048576 --topk 4096 --experts 4096
expect 1 "FM_ERR_IO" -- run --weights /nonexistent/ckpt
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
echo "$((n-fails)) passed, $fails failed"
[ "$fails" = 0 ]
