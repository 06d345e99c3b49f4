# device_env.sh - sourced by the device scripts (gpu-check.sh, ship-check.sh): $OUT made, and
# the carried .debs (cmocka, cJSON: the device image has neither) unpacked into a sysroot
# that pkg-config, the compiler (-I$SYS/usr/include) and the loader then use.
# On the device ($OUT given): a call returns at most 8 files of $OUT (2026-12-07: call 2's
# main-baseline logs were left out by count), so at exit every loose file there goes into one
# archive, logs-<pid>.tgz (`tar xzf` it under files_at); FM_PACK_OUT=0 keeps them loose.
if [ -n "${OUT:-}" ] && [ "${FM_PACK_OUT:-1}" = 1 ] && [ -z "${FM_OUT_PACKER:-}" ]; then
  export FM_OUT_PACKER=$$ # the outermost script packs; the scripts it runs leave it to it
  fm_pack_out() {
    local f
    f=$(cd "$OUT" && ls -A | grep -v '^logs-[0-9]*\.tgz$' | tr '\n' ' ')
    [ -n "${f// /}" ] && (cd "$OUT" && tar czf "logs-$$.tgz" --remove-files $f)
    return 0
  }
  trap fm_pack_out EXIT
fi
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
SYS=/tmp/sysroot
for f in .debs/*.deb; do dpkg -x "$f" "$SYS"; done
export PKG_CONFIG_PATH=$SYS/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SYS
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
