#!/usr/bin/env bash
# nvcc-resources.sh NVCC ARGS... - CMake's compiler launcher for fp4moe's CUDA units:
# runs the compile with ptxas's resource report (-Xptxas -v) and keeps the report
# next to the object (OBJ.ptxas), passing every other line of stderr through, so the
# build log stays as it was. scripts/kernel_resources.sh turns the reports into
# build/kernel_resources.csv, which tests/test_kernel_resources.c checks. The compile's
# wall seconds go to OBJ.secs (bench/ship-check.sh lists the longest units: the build's
# critical path).
out="" prev=""
for a in "$@"; do
    [ "$prev" = "-o" ] && out=$a
    prev=$a
done
[ -z "$out" ] && exec "$@"
t0=$(date +%s%N)
"$@" -Xptxas -v 2>"$out.ptxas.tmp"
rc=$?
t1=$(date +%s%N)
echo "$(( (t1 - t0) / 1000000 ))" >"$out.secs"
grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' "$out.ptxas.tmp" >&2
mv -f "$out.ptxas.tmp" "$out.ptxas"
exit $rc
