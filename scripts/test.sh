#!/bin/sh
# Sets up a fresh Debian 12 machine, builds hvd and runs the whole test suite;
# then builds again under AddressSanitizer+UBSan and under ThreadSanitizer
# (build-address-undefined/, build-thread/) and runs the multi-process
# suites (and, under ASan, the unit suites) there. Extra arguments go to
# ctest (e.g. -L unit, -R rendezvous) and skip the sanitizer passes, as do
# HVD_SANITIZE (the whole run is then under that sanitizer) and
# HVD_TEST_SANITIZERS=0.
set -eu
cd "$(dirname "$0")/.."

./scripts/setup.sh
dir=$(./scripts/build.sh | tail -n 1)
(cd "$dir" && ctest --output-on-failure --timeout 600 "$@")

[ $# -eq 0 ] && [ -z "${HVD_SANITIZE:-}" ] && [ "${HVD_TEST_SANITIZERS:-1}" != 0 ] || exit 0
for pass in "address,undefined mp|unit" "thread mp"; do
    sanitizers=${pass% *}
    labels=${pass#* }
    echo "test.sh: the $labels suites under HVD_SANITIZE=$sanitizers"
    sdir=$(HVD_SANITIZE=$sanitizers ./scripts/build.sh | tail -n 1)
    (cd "$sdir" && ctest --output-on-failure --timeout 900 -j "$(nproc)" -L "$labels")
done
