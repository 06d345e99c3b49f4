#!/usr/bin/env bash
# run.sh - build the libFuzzer targets and run each for a bounded time
# (ctest: io_fuzz_safetensors_header, labels cpu;fuzz, runs every target):
#   safetensors  the safetensors reader (header parser; pread of a file cut short while open)
#   config       the config.json parser (src/io/config.c)
#   layer        the layer API on the CPU backends (src/layer.c and all it calls: create, run;
#                out untouched on failure, written and finite on success)
#   npy          the .npy reader and writer (src/io/npy.c: routing and activation files)
#   sim_csv      the simulator's CSV inputs (simulate --measured / --validate: src/sim and what it calls)
#
#   fuzz/run.sh OUT_DIR [SECONDS] [TARGET...]
#       SECONDS per target (default 30; FM_FUZZ_SECONDS overrides); no TARGET: all of them.
#
# Adding a target is one line in TARGETS below: its name NAME and the library sources it
# needs (globs allowed); fuzz/fuzz_NAME.c holds LLVMFuzzerTestOneInput. Optional:
# fuzz/NAME.dict (a libFuzzer dictionary), seed files in fuzz/NAME_seeds/, and a function
# seeds_NAME DIR below that writes generated seeds into DIR.
#
# Needs clang with libFuzzer (Debian package `clang`); without it this FAILS with a
# message rather than skipping, so CI cannot silently stop fuzzing. Each target is
# compiled straight from its sources with -fsanitize=fuzzer,address,undefined, apart from
# the CMake build, whose compiler may be gcc. Per target, in OUT_DIR/NAME/: the binary,
# the corpus (grows between runs), crash artifacts.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)

# name         sources besides fuzz/fuzz_NAME.c (relative to the repository root; globs expand)
TARGETS=(
  "safetensors src/io/safetensors.c src/io/dtype.c src/fm_file*.c src/status.c src/format/codec.c"
  "config      src/io/config.c src/fm_file*.c src/status.c"
  "layer       src/*.c src/layer/*.c src/format/*.c src/arch/*.c src/kernels/build.c src/kernels/tile.c src/kernels/fm_kernels_smem.c src/kernels/cost_fp4moe.c src/moe/*.c src/cpu/*.c src/io/*.c src/plan/*.c src/cutlass/*.c src/sim/*.c @table @omp"
  "npy         src/io/npy.c src/io/dtype.c src/io/safetensors.c src/format/codec.c src/fm_file*.c src/status.c"
  "sim_csv     src/sim/*.c src/plan/*.c src/cutlass/*.c src/kernels/build.c src/kernels/tile.c src/kernels/fm_kernels_smem.c src/kernels/cost_fp4moe.c src/arch/*.c src/format/*.c src/fm_file*.c src/status.c src/rng.c @table"
)

OUT=${1:?usage: fuzz/run.sh OUT_DIR [SECONDS] [TARGET...]}
SECS=${FM_FUZZ_SECONDS:-${2:-30}}
shift $(($# >= 2 ? 2 : 1))
CC=${FM_FUZZ_CC:-clang}

# ---- generated seeds (seeds_NAME DIR) -------------------------------------------------
# st_seed DIR FILE HEADER DATA_BYTES: a safetensors file with an 8-byte LE header length.
st_seed() {
  local n=${#3}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' \
    $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) $((n >> 24 & 255)))" >"$1/$2"
  printf '%s' "$3" >>"$1/$2"
  head -c "$4" /dev/zero >>"$1/$2"
}
seeds_safetensors() {
  st_seed "$1" empty '{}' 0
  st_seed "$1" one '{"a":{"dtype":"U8","shape":[2,4],"data_offsets":[0,8]}}' 8
  st_seed "$1" meta '{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}' 4
  st_seed "$1" nvfp4 '{"e.weight":{"dtype":"U8","shape":[4,8],"data_offsets":[0,32]},"e.weight_scale":{"dtype":"F8_E4M3","shape":[4,1],"data_offsets":[32,36]},"e.weight_scale_2":{"dtype":"F32","shape":[],"data_offsets":[36,40]}}' 40
  st_seed "$1" mx '{"b":{"dtype":"U8","shape":[1,2,1,16],"data_offsets":[0,32]},"s":{"dtype":"F8_E8M0","shape":[1,2,1],"data_offsets":[32,34]},"f":{"dtype":"F4","shape":[4],"data_offsets":[34,36]}}  ' 36
}

seeds_config() {
  printf '%s' '{"model_type": "qwen3_moe", "num_experts_per_tok": 8, "norm_topk_prob": true}' >"$1/qwen3"
  printf '%s' '{"model_type": "deepseek_v3", "scoring_func": "sigmoid", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}' >"$1/dsv3"
  printf '%s' '{"text_config": {"model_type": "gpt_oss"}, "architectures": ["GptOssForCausalLM"], "quantization_config": {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {"g": {"format": "nvfp4-pack-quantized"}}}}' >"$1/ct"
}

# npy_seed DIR FILE DICT DATA_BYTES: a version 1.0 .npy with header DICT (padded with spaces and a
# newline to a multiple of 64 bytes with the 10-byte preamble) and DATA_BYTES of data.
npy_seed() {
  local h=$3 total
  total=$(((10 + ${#h} + 1 + 63) / 64 * 64))
  while [ $((10 + ${#h} + 1)) -lt "$total" ]; do h="$h "; done
  local n=$((${#h} + 1))
  printf "\x93NUMPY\x01\x00$(printf '\\x%02x\\x%02x' $((n & 255)) $((n >> 8 & 255)))" >"$1/$2"
  printf '%s\n' "$h" >>"$1/$2"
  head -c "$4" /dev/urandom >>"$1/$2"
}
seeds_npy() {
  npy_seed "$1" f32 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" 24
  npy_seed "$1" bf16 "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }" 8
  npy_seed "$1" v2 "{'descr': '|V2', 'fortran_order': False, 'shape': (1, 2, 2), }" 8
  npy_seed "$1" scalar "{'descr': '<f4', 'fortran_order': False, 'shape': (), }" 4
  npy_seed "$1" empty "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }" 0
}

# ---- toolchain ------------------------------------------------------------------------
if ! command -v "$CC" >/dev/null 2>&1; then
  echo "fuzz: FAILED: '$CC' not found. Install clang with libFuzzer (Debian: apt-get install clang);" \
       "scripts/deps.sh should install it." >&2
  exit 1
fi
mkdir -p "$OUT"
# First: can this compiler build any libFuzzer program at all? (a toolchain problem)
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
  >"$OUT/probe.c"
if ! "$CC" -fsanitize=fuzzer "$OUT/probe.c" -o "$OUT/probe" 2>"$OUT/probe.log"; then
  cat "$OUT/probe.log" >&2
  echo "fuzz: FAILED: '$CC' cannot build a libFuzzer target (-fsanitize=fuzzer)." \
       "Install clang with libFuzzer (Debian: apt-get install clang libclang-rt-dev)." >&2
  exit 1
fi

# ---- build and run each selected target -------------------------------------------------
declare -A sources=()
names=()
for t in "${TARGETS[@]}"; do
  read -r name srcs <<<"$t"
  sources[$name]=$srcs
  names+=("$name")
done
(($#)) && names=("$@")
for name in "${names[@]}"; do
  if [ -z "${sources[$name]+set}" ]; then
    echo "fuzz: FAILED: no target '$name' (targets: ${!sources[*]})" >&2
    exit 1
  fi
  dir="$OUT/$name"
  bin="$dir/fuzz_$name"
  mkdir -p "$dir/corpus" "$dir/seeds"
  read -r -a globs <<<"${sources[$name]}"
  files=()
  extra=()
  for g in "${globs[@]}"; do
    if [ "$g" = @omp ]; then # the CPU backends' OpenMP (clang's: libomp-dev, scripts/deps.sh)
      extra+=(-fopenmp)
      continue
    fi
    if [ "$g" = @table ]; then # the build table the planner reads (src/kernels/fm_units_gen.c), of an `all` build
      "$CC" -std=c11 -I"$SRC/src" "$SRC/src/kernels/fm_units_gen.c" -o "$dir/fm_units_gen" &&
        "$dir/fm_units_gen" "$dir" "80;90a;100f;120f" cpu || exit 1
      files+=("$dir/fm_build_table.c")
      continue
    fi
    for f in "$SRC"/$g; do files+=("$f"); done
  done
  # A failure here is a build error in the target's sources (shown above).
  if ! "$CC" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DFM_VERSION='"fuzz"' \
       -I"$SRC/include" -I"$SRC/src" $(pkg-config --cflags libcjson) \
       "${extra[@]}" "$SRC/fuzz/fuzz_$name.c" "${files[@]}" $(pkg-config --libs libcjson) -lm -o "$bin"; then
    echo "fuzz: FAILED: the fuzz target '$name' does not build (compiler errors above)." >&2
    exit 1
  fi
  if declare -F "seeds_$name" >/dev/null; then "seeds_$name" "$dir/seeds"; fi
  seed_dirs=("$dir/seeds")
  [ -d "$SRC/fuzz/${name}_seeds" ] && seed_dirs+=("$SRC/fuzz/${name}_seeds")
  dict=()
  [ -f "$SRC/fuzz/$name.dict" ] && dict=(-dict="$SRC/fuzz/$name.dict")
  echo "fuzz: running $bin for ${SECS}s"
  "$bin" -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "${dict[@]}" -artifact_prefix="$dir/" "$dir/corpus" "${seed_dirs[@]}"
done
