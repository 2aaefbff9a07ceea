#!/bin/sh
# The naming rule for hvd's symbols (src/common/common.h): every global
# symbol that libhvd.a defines carries its module's prefix, and libhvd.so
# exports only the public API (hvd_). Names the compiler makes itself
# (DW.ref.*, __*) are not ours.
# Usage: check.sh LIB_DIR
set -eu
lib=$1
status=0
stray=$(nm -g --defined-only "$lib/libhvd.a" | awk 'NF == 3 { print $3 }' |
    grep -vE '^(hvd|rdzv|net|ops|coord|elastic|launch|tune|cuda)_|^DW\.ref\.|^__' | sort -u || true)
if [ -n "$stray" ]; then
    echo "libhvd.a defines global symbols outside the module prefixes" \
        "(hvd_ rdzv_ net_ ops_ coord_ elastic_ launch_ tune_ cuda_):" $stray >&2
    status=1
fi
exported=$(nm -D --defined-only "$lib/libhvd.so" | awk 'NF == 3 { print $3 }' |
    grep -vE '^hvd_' | sort -u || true)
if [ -n "$exported" ]; then
    echo "libhvd.so exports symbols outside the public API (hvd_):" $exported >&2
    status=1
fi
[ "$status" -ne 0 ] || echo "symbols: every global has its module's prefix; libhvd.so exports only hvd_"
exit "$status"
