# common.sh - sourced by the probe scripts (repo root, GPU machine): unpack the carried
# .debs (cmocka, cJSON) into /tmp/sysroot and export the paths the build needs;
# fm_probe_build builds bench_gemm in build-gpu (warnings not fatal).
OUT=${OUT:-/tmp/out}
SYS=/tmp/sysroot; for f in .debs/*.deb; do dpkg -x "$f" "$SYS"; done
export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fm_probe_build() {
  cmake -S . -B build-gpu -DFM_WERROR=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$SYS/usr/include" >/dev/null 2>&1
  cmake --build build-gpu -j16 --target bench_gemm >$OUT/build.log 2>&1 || tail -20 $OUT/build.log
}
