#!/usr/bin/env bash
# wip/next-call-prof.sh - issue 31's profile of the one-launch decode kernel at T = 1 and 4 (ncu:
# time, DRAM bytes and throughput, occupancy, warp stalls; the chain's kernels of the same
# forward beside it: bench/probe/probe.sh decode), with $PATCHES applied to the device's copy
# (default: decode-units then decode-shared; taken back and the files touched at the end).
#   run: bash wip/next-call-prof.sh      carry [".debs"], timeout 300
set -uo pipefail
T0=$SECONDS
PATCHES=${PATCHES-wip/decode-units.patch wip/decode-shared.patch}
FILES=$(cat /dev/null $PATCHES | grep -E '^\+\+\+ b/' | sed 's|^+++ b/||' | sort -u)
applied=""
unpatch() { for q in $applied; do patch -p1 -R -s <$q; done; [ -n "$FILES" ] && touch $FILES; return 0; }
trap unpatch EXIT
for q in $PATCHES; do patch -p1 --forward -s <$q || { echo "PATCH $q FAILED"; exit 1; }; applied="$q $applied"; done
echo "== patched: ${PATCHES:-none}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
RUN_ARGS=${RUN_ARGS-"--global-experts 256 --shard 32:32"} timeout $((${LIMIT:-280} - 10)) bash bench/probe/probe.sh decode ${TS:-1 4}
echo "== done in $((SECONDS - T0)) s"
