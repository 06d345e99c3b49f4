#!/usr/bin/env bash
# Install the build into a temporary prefix, then compile and run a consumer
# program with the installed header, library and pkg-config file only.
set -euo pipefail
build=$1; src=$2
prefix=$(mktemp -d); trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/fp4moe" && test -f "$prefix/include/fp4moe.h" && test -f "$prefix/lib/pkgconfig/fp4moe.pc"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -std=c11 -Wall -Wextra -Werror "$src/consumer.c" $(pkg-config --cflags --libs --static fp4moe) -o "$prefix/consumer"
"$prefix/consumer" | tee "$prefix/consumer.out"
# one version everywhere: fm_version() (the consumer, the CLI) = the .pc file's Version
ver=$(pkg-config --modversion fp4moe)
cli=$("$prefix/bin/fp4moe" --version)
echo "$cli"
[ "$cli" = "fp4moe $ver" ] || { echo "fp4moe --version says '$cli', pkg-config says '$ver'" >&2; exit 1; }
grep -q "^fp4moe $ver: " "$prefix/consumer.out" || { echo "fm_version() differs from pkg-config's '$ver'" >&2; exit 1; }
