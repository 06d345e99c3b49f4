#!/usr/bin/env bash
# layer_profile.sh - per-kernel times of one `fp4moe run` forward on the GPU machine
# (GLM-5 EP8 defaults), to see where a prefill-sized layer's time goes.
#   bench/probe/layer_profile.sh [tokens...]      (repo root; carry .debs)
set -uo pipefail
SYS=/tmp/sysroot
for f in .debs/*.deb; do dpkg -x "$f" "$SYS"; done
export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
{ cmake -S . -B build-gpu -DFM_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" &&
  cmake --build build-gpu -j16 --target fp4moe_cli; } >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for tk in "${@:-1024}"; do
  echo "== tokens $tk"
  build-gpu/fp4moe run --tokens "$tk" --iters 3 | grep -E "time"
  "$NCU" --metrics gpu__time_duration.sum --launch-skip 0 --launch-count 40 \
    build-gpu/fp4moe run --tokens "$tk" --iters 1 2>/dev/null |
    awk '/^  [a-zA-Z_].*\(/ {k=$1} /gpu__time_duration.sum/ {printf "%-40s %10s %s\n", substr(k,1,40), $(NF), $(NF-1)}' | head -40
done
