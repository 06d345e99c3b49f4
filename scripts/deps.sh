#!/usr/bin/env bash
# deps.sh - install what fp4moe needs to build and test (only what is missing),
# then print what is there.  `make run` / `make test` run it first.
#
# Debian 12 (bookworm) packages; the release fixes their versions (a point release
# may bring a security fix, so exact Debian versions are not pinned; minimums are
# checked where the build needs one). Tested: cmake 3.25.1, gcc 12.2.0,
# libcjson-dev 1.7.15, libcmocka-dev 1.1.5, clang/libclang-rt 14.0.6, gnuplot 5.4.4.
#   cmake (>= 3.22), pkg-config, gcc, make, libcjson-dev, libcmocka-dev,
#   gnuplot-nox (simulate --plot), clang + libclang-rt-dev + libomp-dev (libFuzzer, fuzz/run.sh),
#   python3-venv (when python3 is Debian's and cannot create a venv)
# nvcc is used when present (the CUDA backend is optional; tested with CUDA 13.0).
#
# Python packages, exact pins (scripts/requirements.txt; scripts/requirements-headers.txt
# with --no-deps), in a virtual environment, never in the system python:
#   FM_VENV        where (default: .venv/ in the repository root, gitignored);
#                  reused when it holds exactly the pinned versions, recreated otherwise
#   FM_VENV_FRESH  1: recreate it even if it looks right (.ci/run uses a new folder instead)
#   PYTHON         the interpreter that creates it (default python3; >= 3.11)
#   --engines or FM_ENGINES=1: also scripts/requirements-engines.txt (torch, transformers and
#                  their dependencies, pinned; ~3.5 GB: opt-in) for tests/engines, installed into
#                  the same venv when they differ from the pins (the base pins are kept)
#   --vllm or FM_VLLM=1: also scripts/requirements-vllm.txt (vLLM 0.33.0 with its torch and every
#                  dependency, pinned; ~9 GB: opt-in) for the vLLM plugin's tests, in a venv of its
#                  own, FM_VLLM_VENV (default .venv-vllm/): vLLM pins a numpy and a transformers
#                  other than the project's venv's, so the two cannot share one
#   --nccl-ep or FM_NCCL_EP=1: also scripts/requirements-nccl-ep.txt (nccl-extensions 0.1.0, NCCL
#                  2.30.7 and their dependencies, pinned; ~1 GB: opt-in) for examples/nccl_ep
#                  (cmake -DFM_NCCL_EP=ON, docs/ep-nccl.md), in a venv of its own, FM_NCCL_VENV
#                  (default .venv-nccl/): nccl4py[cu13] brings cuda-bindings and the CUTLASS DSL,
#                  which the project's venv has no use for
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${FM_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
REQS=("$ROOT/scripts/requirements.txt" "$ROOT/scripts/requirements-headers.txt")
ENGINES=${FM_ENGINES:-0}
VLLM=${FM_VLLM:-0}
VLLM_VENV=${FM_VLLM_VENV:-$ROOT/.venv-vllm}
NCCL_EP=${FM_NCCL_EP:-0}
NCCL_VENV=${FM_NCCL_VENV:-$ROOT/.venv-nccl}
for arg in "$@"; do
  case "$arg" in
    --engines) ENGINES=1 ;;
    --vllm) VLLM=1 ;;
    --nccl-ep) NCCL_EP=1 ;;
    *) echo "deps: unknown argument '$arg' (expected --engines, --vllm or --nccl-ep)" >&2; exit 2 ;;
  esac
done

# ---- Debian packages ---------------------------------------------------------------
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v cc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
command -v gnuplot >/dev/null || need_apt+=(gnuplot-nox)
command -v clang >/dev/null || need_apt+=(clang)
[ -n "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] || need_apt+=(libclang-rt-dev)
[ -n "$(ls /usr/lib/llvm-*/lib/libomp.so 2>/dev/null)" ] || need_apt+=(libomp-dev) # clang's OpenMP (fuzz/run.sh layer)
pkg-config --exists libcjson 2>/dev/null || need_apt+=(libcjson-dev)
pkg-config --exists cmocka 2>/dev/null || need_apt+=(libcmocka-dev)
if ! command -v "$PY" >/dev/null; then
  need_apt+=(python3 python3-venv)
elif ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
  case "$(command -v "$PY")" in
    /usr/bin/*) need_apt+=(python3-venv) ;;
    *) echo "deps: FAILED: $PY ($(command -v "$PY")) cannot create a virtual environment (no venv/ensurepip);" \
            "set PYTHON to an interpreter that can" >&2; exit 1 ;;
  esac
fi
if ((${#need_apt[@]})); then
  echo "deps: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
cmake_ver=$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
if ! printf '3.22\n%s\n' "$cmake_ver" | sort -V -C; then
  echo "deps: FAILED: cmake $cmake_ver is older than 3.22 (CMakeLists.txt's minimum)" >&2
  exit 1
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "deps: FAILED: $PY is Python $("$PY" -c 'import platform; print(platform.python_version())');" \
       "the pinned numpy needs >= 3.11 (set PYTHON)" >&2
  exit 1
}

# ---- Python virtual environment -----------------------------------------------------
# Exit 0 when $VENV's python runs and has every pinned package of the given files (default
# REQS) at its pinned version; else print what differs.
venv_matches() {
  [ -x "$VENV/bin/python" ] || return 1
  local files=("$@")
  ((${#files[@]})) || files=("${REQS[@]}")
  "$VENV/bin/python" - "${files[@]}" <<'EOF'
import importlib.metadata as md
import sys
bad = []
for path in sys.argv[1:]:
    for line in open(path):
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, want = (s.strip() for s in line.split("=="))
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = "missing"
        if have != want:
            bad.append(f"{name} {have} (pinned {want})")
if bad:
    print("deps: the virtual environment differs from the pins: " + ", ".join(bad))
    sys.exit(1)
EOF
}

if [ "${FM_VENV_FRESH:-0}" = 1 ] || ! venv_matches; then
  if [ -e "$VENV" ]; then
    if [ ! -f "$VENV/pyvenv.cfg" ]; then
      echo "deps: FAILED: $VENV exists and is not a virtual environment; refusing to delete it (set FM_VENV)" >&2
      exit 1
    fi
    rm -rf "$VENV"
  fi
  echo "deps: creating the virtual environment $VENV ($("$PY" -c 'import sys; print(sys.executable)'))"
  "$PY" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input)
  if ! "${pip[@]}" -r "${REQS[0]}" || ! "${pip[@]}" --no-deps -r "${REQS[1]}"; then
    echo "deps: FAILED: pip could not install the pinned packages (network? see above)" >&2
    exit 1
  fi
  venv_matches
fi
if [ "$ENGINES" = 1 ] && ! venv_matches "$ROOT/scripts/requirements-engines.txt"; then
  echo "deps: installing the engine tests' packages (scripts/requirements-engines.txt: torch, transformers; ~3.5 GB)"
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input \
       -r "$ROOT/scripts/requirements-engines.txt"; then
    echo "deps: FAILED: pip could not install scripts/requirements-engines.txt (network? see above)" >&2
    exit 1
  fi
  venv_matches "$ROOT/scripts/requirements-engines.txt" && venv_matches
fi
# side_venv VENV REQS WHAT SIZE ENVVAR: an opt-in venv of its own (vLLM, NCCL EP pin packages the
# project's venv cannot hold), made and filled with REQS unless it already matches them
side_venv() {
  local venv=$1 reqs=$2 what=$3 size=$4 var=$5
  VENV=$venv venv_matches "$reqs" && return 0
  if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
    echo "deps: FAILED: $venv exists and is not a virtual environment; refusing to use it (set $var)" >&2
    exit 1
  fi
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  echo "deps: installing $what's pinned packages into $venv (scripts/$(basename "$reqs"); ~$size)"
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$reqs"; then
    echo "deps: FAILED: pip could not install scripts/$(basename "$reqs") (network? see above)" >&2
    exit 1
  fi
  VENV=$venv venv_matches "$reqs"
}
if [ "$VLLM" = 1 ]; then side_venv "$VLLM_VENV" "$ROOT/scripts/requirements-vllm.txt" vLLM "9 GB" FM_VLLM_VENV; fi
if [ "$NCCL_EP" = 1 ]; then side_venv "$NCCL_VENV" "$ROOT/scripts/requirements-nccl-ep.txt" "NCCL EP" "1 GB" FM_NCCL_VENV; fi
if [ "$NCCL_EP" = 1 ]; then
  nccl_site=$("$NCCL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for f in nccl/ep/include/nccl_ep.h nccl/ep/lib/cu13/libnccl_ep.so nvidia/nccl/include/nccl.h nvidia/nccl/lib/libnccl.so.2; do
    [ -f "$nccl_site/$f" ] || { echo "deps: FAILED: $nccl_site/$f is missing (the wheels changed?)" >&2; exit 1; }
  done
  echo "deps: NCCL EP: $nccl_site (nccl_ep.h, libnccl_ep.so, nccl.h, libnccl.so.2); cmake -DFM_NCCL_EP=ON finds it there"
fi

# ---- what we got ------------------------------------------------------------------------
deb=()
for p in cmake pkg-config gcc make libcjson-dev libcmocka-dev gnuplot-nox clang libclang-rt-dev libomp-dev python3-venv; do
  v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
  deb+=("$p ${v:--}")
done
echo "deps: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || uname -s)$([ -r /etc/debian_version ] &&
  echo " ($(cat /etc/debian_version))"); Debian packages: $(IFS=,; echo "${deb[*]}" | sed 's/,/, /g')"
nvcc_ver=$(PATH=$PATH:/usr/local/cuda/bin nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
echo "deps: cmake $cmake_ver, cc $(cc -dumpfullversion 2>/dev/null || echo '?'), clang" \
     "$(clang -dumpversion 2>/dev/null || echo '-'), nvcc ${nvcc_ver:-none (CUDA backend off)}"
echo "deps: $VENV: $("$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import platform
pk = sorted(f"{d.metadata['Name']} {d.version}" for d in md.distributions() if d.metadata["Name"] not in ("pip", "setuptools"))
print(f"Python {platform.python_version()}; " + ", ".join(pk))
EOF
)"
