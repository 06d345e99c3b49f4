# device_env.sh - sourced by the device scripts (gpu-check.sh, ship-check.sh): $OUT made, and
# the carried .debs (cmocka, cJSON: the device image has neither) unpacked into a sysroot
# that pkg-config, the compiler (-I$SYS/usr/include) and the loader then use.
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
SYS=/tmp/sysroot
for f in .debs/*.deb; do dpkg -x "$f" "$SYS"; done
export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
