#!/usr/bin/env bash
# run.sh - build the libFuzzer target over the safetensors reader (the header
# parser, and pread of a file cut short while open) and run it for a bounded
# time (ctest: io_fuzz_safetensors_header, labels cpu;fuzz).
#
#   fuzz/run.sh OUT_DIR [SECONDS]      (default 30 s; FM_FUZZ_SECONDS overrides)
#
# Needs clang with libFuzzer (Debian package `clang`); without it this FAILS with
# a message rather than skipping, so CI cannot silently stop fuzzing.
# The target is compiled straight from the reader's sources (src/io/safetensors.c,
# src/io/dtype.c, src/fm_file.c, src/status.c, src/format/codec.c) with
# -fsanitize=fuzzer,address,undefined, apart from the CMake build, whose
# compiler may be gcc. Seeds are generated here;
# the corpus grows in OUT_DIR/corpus between runs; crashes land in OUT_DIR.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: fuzz/run.sh OUT_DIR [SECONDS]}
SECS=${FM_FUZZ_SECONDS:-${2:-30}}
CC=${FM_FUZZ_CC:-clang}

if ! command -v "$CC" >/dev/null 2>&1; then
  echo "fuzz: FAILED: '$CC' not found. Install clang with libFuzzer (Debian: apt-get install clang);" \
       "scripts/deps.sh should install it." >&2
  exit 1
fi
mkdir -p "$OUT/corpus" "$OUT/seeds"
BIN="$OUT/fuzz_safetensors"
# First: can this compiler build any libFuzzer program at all? (a toolchain problem)
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
  >"$OUT/probe.c"
if ! "$CC" -fsanitize=fuzzer "$OUT/probe.c" -o "$OUT/probe" 2>"$OUT/probe.log"; then
  cat "$OUT/probe.log" >&2
  echo "fuzz: FAILED: '$CC' cannot build a libFuzzer target (-fsanitize=fuzzer)." \
       "Install clang with libFuzzer (Debian: apt-get install clang libclang-rt-dev)." >&2
  exit 1
fi
# Then the target itself: a failure here is a build error in the parser's sources (shown above).
if ! "$CC" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
     -I"$SRC/include" -I"$SRC/src" $(pkg-config --cflags libcjson) \
     "$SRC/fuzz/fuzz_safetensors.c" "$SRC/src/io/safetensors.c" "$SRC/src/io/dtype.c" "$SRC/src/fm_file.c" "$SRC/src/status.c" \
     "$SRC/src/format/codec.c" $(pkg-config --libs libcjson) -lm -o "$BIN"; then
  echo "fuzz: FAILED: the fuzz target does not build (compiler errors above)." >&2
  exit 1
fi

# seed FILE HEADER DATA_BYTES: a file with an 8-byte LE header length.
seed() {
  local n=${#2}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' \
    $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) $((n >> 24 & 255)))" >"$OUT/seeds/$1"
  printf '%s' "$2" >>"$OUT/seeds/$1"
  head -c "$3" /dev/zero >>"$OUT/seeds/$1"
}
seed empty '{}' 0
seed one '{"a":{"dtype":"U8","shape":[2,4],"data_offsets":[0,8]}}' 8
seed meta '{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}' 4
seed nvfp4 '{"e.weight":{"dtype":"U8","shape":[4,8],"data_offsets":[0,32]},"e.weight_scale":{"dtype":"F8_E4M3","shape":[4,1],"data_offsets":[32,36]},"e.weight_scale_2":{"dtype":"F32","shape":[],"data_offsets":[36,40]}}' 40
seed mx '{"b":{"dtype":"U8","shape":[1,2,1,16],"data_offsets":[0,32]},"s":{"dtype":"F8_E8M0","shape":[1,2,1],"data_offsets":[32,34]},"f":{"dtype":"F4","shape":[4],"data_offsets":[34,36]}}  ' 36

echo "fuzz: running $BIN for ${SECS}s"
"$BIN" -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -dict="$SRC/fuzz/safetensors.dict" -artifact_prefix="$OUT/" "$OUT/corpus" "$OUT/seeds"
