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
"$prefix/consumer"
"$prefix/bin/fp4moe" --version
