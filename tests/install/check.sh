#!/bin/sh
# Installs the build into a temporary prefix, then builds and runs the
# README's example against it through pkg-config, as a user would, and
# checks that the installed hvdrun finds hvd's Python packages.
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
# hvd's Python packages beside the library, where the installed hvdrun finds
# them for its ranks' PYTHONPATH; a `horovod` nowhere but in the compat tree.
python=$(cd "$libdir/hvd/python" && pwd -P)
for dir in "$python/hvd" "$python/compat"; do
    [ -d "$dir" ] || { echo "install check: $dir is missing" >&2; exit 1; }
done
got=$(env -u PYTHONPATH "$prefix/bin/hvdrun" -np 1 --disable-output-prefix --horovod-compat \
    sh -c 'echo "$PYTHONPATH"')
if [ "$got" != "$python/compat:$python" ]; then
    echo "install check: the installed hvdrun gave its ranks PYTHONPATH=$got," \
        "not $python/compat:$python" >&2
    exit 1
fi
# A rank of --horovod-compat finds horovodrun first on its PATH, and runs it.
got=$(env -u PYTHONPATH "$prefix/bin/hvdrun" -np 1 --disable-output-prefix --horovod-compat \
    sh -c 'command -v horovodrun && horovodrun --version')
version=$("$prefix/bin/hvdrun" --version)
case $got in
"$python/compat/bin/horovodrun
$version") ;;
*)
    echo "install check: a rank's horovodrun is not the installed one that runs: $got" >&2
    exit 1
    ;;
esac
stray=$(find "$prefix" -name horovod ! -path "$prefix/*/hvd/python/compat/*")
[ -z "$stray" ] || { echo "install check: horovod outside hvd's compat tree: $stray" >&2; exit 1; }
echo "install check: ok"
