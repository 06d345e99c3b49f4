#!/usr/bin/env bash
# kernel_resources.sh OUT.csv DIR - every kernel x target of the ptxas reports under DIR
# (OBJ.ptxas, written by scripts/nvcc-resources.sh) as one CSV row:
#   target,kernel,registers,stack_bytes,spill_store_bytes,spill_load_bytes,static_smem_bytes
# kernel demangled (c++filt). Rows sorted, so that the file only changes when a kernel does.
set -euo pipefail
out=$1 dir=$2
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
find "$dir" -name '*.ptxas' -print0 | xargs -0 -r cat | awk '
/Compiling entry function/ {
    match($0, /function \x27[^\x27]*\x27/); fn = substr($0, RSTART + 10, RLENGTH - 11)
    match($0, /for \x27[^\x27]*\x27/); tg = substr($0, RSTART + 5, RLENGTH - 6)
    stack = spst = spld = 0; next
}
/bytes stack frame/ { stack = $1; spst = $5; spld = $9; next }
/Used [0-9]+ registers/ {
    if (fn == "") next
    match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
    smem = 0
    if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
    printf "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", tg, fn, regs, stack, spst, spld, smem
    fn = ""
}' >"$tmp"
{
    echo "target,kernel,registers,stack_bytes,spill_store_bytes,spill_load_bytes,static_smem_bytes"
    cut -f2 "$tmp" | c++filt | sed 's/,/;/g' | paste -d, <(cut -f1 "$tmp") - <(cut -f3- "$tmp" | tr '\t' ',') |
        LC_ALL=C sort -u
} >"$out.tmp"
mv -f "$out.tmp" "$out"
