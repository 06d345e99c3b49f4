#!/usr/bin/env bash
# ncclep-carry.sh - the NCCL EP files the GPU machine cannot fetch (it has no network), for
# `bench/gpu-check.sh nccl-ep1` (issue 35 item 4: NCCL EP with a world of one rank): the pinned
# nccl-extensions wheel (scripts/requirements-nccl-ep.txt) downloaded here and its NCCL EP part
# (nccl/ep/include: nccl_ep.h and the device headers libnccl_ep.so compiles kernels from at
# first use; nccl/ep/lib/cu13/libnccl_ep.so, 9 MB) unpacked into .ncclep/ (gitignored; carry it:
# carry [".debs", ".ncclep"]). NCCL itself (nvidia-nccl-cu13, hundreds of MB) is not carried:
# the machine's torch brings a libnccl.so.2, which gpu-check.sh finds and links into .ncclep/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VER=$(sed -n 's/^nccl-extensions==\([0-9.]*\).*/\1/p' "$ROOT/scripts/requirements-nccl-ep.txt")
[ -n "$VER" ] || { echo "ncclep-carry: no nccl-extensions pin in scripts/requirements-nccl-ep.txt" >&2; exit 2; }
PY=${FM_VENV:-$ROOT/.venv}/bin/python
[ -x "$PY" ] || PY=python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download --quiet --no-deps "nccl-extensions==$VER" -d "$TMP"
rm -rf "$ROOT/.ncclep"
mkdir -p "$ROOT/.ncclep"
(cd "$ROOT/.ncclep" && "$PY" -m zipfile -e "$TMP"/nccl_extensions-"$VER"-*.whl "$TMP/x" >/dev/null &&
  mkdir -p nccl/ep/lib && cp -r "$TMP/x/nccl/ep/include" nccl/ep/ && cp -r "$TMP/x/nccl/ep/lib/cu13" nccl/ep/lib/)
du -sh "$ROOT/.ncclep" | sed 's/^/ncclep-carry: nccl-extensions '"$VER"', /'
