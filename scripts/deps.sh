#!/usr/bin/env bash
# Install what fp4moe needs to build and test, only what is missing:
#   Debian: cmake, pkg-config, gcc, libcjson-dev, libcmocka-dev, gnuplot (simulate --plot),
#           clang + libclang-rt (libFuzzer)
#   PyPI:   numpy, ml-dtypes (independent codec oracle), nvidia-cutlass (headers for the planner's
#           conformance test)
# nvcc is used when present (the CUDA backend is optional).
set -euo pipefail

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v cc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
command -v gnuplot >/dev/null || need_apt+=(gnuplot-nox)
command -v clang >/dev/null || need_apt+=(clang)            # libFuzzer target over the safetensors header parser
[ -n "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] || need_apt+=(libclang-rt-dev)
pkg-config --exists libcjson 2>/dev/null || need_apt+=(libcjson-dev)
pkg-config --exists cmocka 2>/dev/null || need_apt+=(libcmocka-dev)
if ((${#need_apt[@]})); then
  echo "deps: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! "$PY" -c 'import numpy, ml_dtypes' 2>/dev/null || ! "$PY" -c 'import cutlass_library' 2>/dev/null; then
  echo "deps: installing PyPI packages: numpy ml-dtypes nvidia-cutlass"
  "$PY" -m pip install -q --disable-pip-version-check numpy ml-dtypes nvidia-cutlass 2>&1 | grep -v 'WARNING: Running pip as' || true
  "$PY" -c 'import numpy, ml_dtypes' 
fi
