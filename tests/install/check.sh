#!/bin/sh
# Installs the build into a temporary prefix, then builds and runs the
# README's example against it through pkg-config, as a user would.
# Usage: check.sh BUILD_DIR
set -eu
build=$1
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(dirname "$(find "$prefix" -name hvd.pc | head -n 1)")
export PKG_CONFIG_PATH="$pc"
libdir=$(pkg-config --variable=libdir hvd)
# shellcheck disable=SC2046 # pkg-config's flags are meant to split
cc -std=c11 -Wall -Wextra -Werror "$here/example.c" -o "$prefix/example" \
    $(pkg-config --cflags --libs hvd) -Wl,-rpath,"$libdir"
env -u HOROVOD_RANK -u HOROVOD_SIZE "$prefix/example"
# The static library, with its dependencies: the system's shared libraries
# and hvd.pc's own Libs.private (the CUDA runtime and NCCL in a CUDA build).
private=$(sed -n 's/^Libs.private: //p' "$pc/hvd.pc")
# shellcheck disable=SC2046,SC2086
cc -std=c11 "$here/example.c" -o "$prefix/example-static" \
    $(pkg-config --cflags hvd) "$libdir/libhvd.a" \
    $(pkg-config --libs libcurl libmicrohttpd libcjson) $private
env -u HOROVOD_RANK -u HOROVOD_SIZE "$prefix/example-static"
echo "install check: ok"
