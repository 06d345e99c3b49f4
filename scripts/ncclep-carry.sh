#!/usr/bin/env bash
# ncclep-carry.sh - the NCCL EP files the GPU machine cannot fetch (it has no network), for
# `bench/gpu-check.sh nccl-ep1` (issue 35 item 4: NCCL EP with a world of one rank): the pinned
# nccl-extensions wheel (scripts/requirements-nccl-ep.txt) downloaded here and its NCCL EP part
# (nccl/ep/include: nccl_ep.h and the device headers libnccl_ep.so compiles kernels from at
# first use; nccl/ep/lib/cu13/libnccl_ep.so, 9 MB) unpacked into .ncclep/ (gitignored; carry it:
# carry [".debs", ".ncclep"]). NCCL itself (nvidia-nccl-cu13, hundreds of MB) is not carried:
# the machine's torch brings a libnccl.so.2, which gpu-check.sh finds and links into .ncclep/.
# That NCCL is 2.28.9 on the lent H100 / H200 image (2026-12-07), and nccl-extensions 0.1.0's
# libnccl_ep.so needs NCCL >= 2.30 (ncclCommQueryProperties, ncclGetPeerDevicePointer,
# ncclWinGetUserPtr: it does not link against 2.28.9). So `--nccl` also downloads the pinned
# nvidia-nccl-cu13 (2.30.7) and cuts its libnccl.so.2 (252 MB) into parts small enough for one
# call's carry each: .ncclep-nccl/include (nccl.h) and .ncclep-nccl-1 ... -N (<= 50 MB each, a
# SHA-256 of the whole in .ncclep-nccl-1/SHA256). A warm machine keeps ignored folders between
# calls, so carry one part a call, back to back (each within the 30 s the machine stays warm):
#   call k < N: carry [".ncclep-nccl-k"], command `ls -d .ncclep-nccl-*`
#   call N:     carry [".debs", ".ncclep", ".ncclep-nccl", ".ncclep-nccl-N"],
#               command `CTEST=0 TARGETS=fp4moe bench/gpu-check.sh nccl-ep1`
# and gpu-check.sh joins the parts (checking the SHA-256) and uses that NCCL instead of torch's.
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
if [ "${1:-}" = --nccl ]; then
  NVER=$(sed -n 's/^nvidia-nccl-cu13==\([0-9.]*\).*/\1/p' "$ROOT/scripts/requirements-nccl-ep.txt")
  [ -n "$NVER" ] || { echo "ncclep-carry: no nvidia-nccl-cu13 pin" >&2; exit 2; }
  "$PY" -m pip download --quiet --no-deps "nvidia-nccl-cu13==$NVER" -d "$TMP"
  rm -rf "$ROOT"/.ncclep-nccl "$ROOT"/.ncclep-nccl-*
  "$PY" -m zipfile -e "$TMP"/nvidia_nccl_cu13-"$NVER"-*.whl "$TMP/n" >/dev/null
  mkdir -p "$ROOT/.ncclep-nccl" && cp -r "$TMP/n/nvidia/nccl/include" "$ROOT/.ncclep-nccl/"
  (cd "$TMP/n/nvidia/nccl/lib" && split -b 50M -d -a 1 libnccl.so.2 part. && sha256sum libnccl.so.2 | cut -d' ' -f1 >SHA256)
  i=1
  for f in "$TMP"/n/nvidia/nccl/lib/part.*; do
    mkdir -p "$ROOT/.ncclep-nccl-$i" && mv "$f" "$ROOT/.ncclep-nccl-$i/part"
    i=$((i + 1))
  done
  cp "$TMP/n/nvidia/nccl/lib/SHA256" "$ROOT/.ncclep-nccl-1/"
  echo "ncclep-carry: nvidia-nccl-cu13 $NVER: .ncclep-nccl (headers) and $((i - 1)) parts .ncclep-nccl-1 .. -$((i - 1)); see the comment at the top for the calls"
fi
