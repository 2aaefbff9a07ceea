#!/bin/sh
# Sets up a fresh Debian 12 machine, builds hvd and runs the whole test suite;
# then builds again under AddressSanitizer+UBSan and under ThreadSanitizer
# (build-address-undefined/, build-thread/) and runs the multi-process
# suites (and, under ASan, the unit suites) there; then builds build-fuzz/
# with clang and runs each fuzz harness for a short while (ctest -L fuzz).
# At the end it says how long each stage took.
#   ./scripts/test.sh --quick   the inner loop: set up, build, every unit
#                               suite and one short job per area (ctest
#                               labels unit and smoke, two at a time)
# Extra arguments go to ctest (e.g. -L unit, -R rendezvous) and skip the
# sanitizer and fuzz passes, as do
# HVD_SANITIZE (the whole run is then under that sanitizer) and
# HVD_TEST_SANITIZERS=0.
set -eu
cd "$(dirname "$0")/.."

started=$(date +%s)
last=$started
stages=""
# stage NAME: the time since the previous stage ends, under NAME.
stage() {
    now=$(date +%s)
    stages="$stages$(printf '%-36s %4ds' "$1" $((now - last)))
"
    last=$now
}
report() {
    stage "$1"
    printf '\ntest.sh: stages\n%s%-36s %4ds\n' "$stages" "total" $(($(date +%s) - started))
}

quick=0
if [ "${1:-}" = --quick ]; then
    quick=1
    shift
fi

./scripts/setup.sh
dir=$(./scripts/build.sh | tail -n 1)
stage "set-up and build"
if [ $quick = 1 ]; then
    (cd "$dir" && ctest --output-on-failure --timeout 600 -j 2 -L 'unit|smoke' "$@")
    report "unit and smoke suites"
    exit 0
fi
if [ $# -ne 0 ]; then
    (cd "$dir" && ctest --output-on-failure --timeout 600 "$@")
    stage "main suite"
else
    # The unit suites share nothing (no ports, namespaces or processes of
    # their own): two at a time. The rest start jobs of several processes,
    # whose timing the other's load would bend: one at a time.
    (cd "$dir" && ctest --output-on-failure --timeout 600 -j 2 -L unit)
    stage "main suite: unit, two at a time"
    (cd "$dir" && ctest --output-on-failure --timeout 600 -LE unit)
    stage "main suite: the rest"
fi

if [ $# -ne 0 ] || [ -n "${HVD_SANITIZE:-}" ] || [ "${HVD_TEST_SANITIZERS:-1}" = 0 ]; then
    report "(no sanitizer passes)"
    exit 0
fi
for pass in "address,undefined mp|unit" "thread mp"; do
    sanitizers=${pass% *}
    labels=${pass#* }
    echo "test.sh: the $labels suites under HVD_SANITIZE=$sanitizers"
    sdir=$(HVD_SANITIZE=$sanitizers ./scripts/build.sh | tail -n 1)
    (cd "$sdir" && ctest --output-on-failure --timeout 900 -j "$(nproc)" -L "$labels")
    stage "$sanitizers (build + $labels)"
done

# The fuzz harnesses, a bounded run each (tests/fuzz/README.md); they skip
# (ctest says why) where clang or its libFuzzer runtime is missing.
echo "test.sh: the fuzz suites (clang, libFuzzer, ASan+UBSan)"
if ! command -v "${CC:-clang}" >/dev/null 2>&1; then
    echo "test.sh: skipping the fuzz suites: no ${CC:-clang} (scripts/setup.sh installs clang)"
    report "(no fuzz suites)"
    exit 0
fi
fdir=$(HVD_FUZZ=1 ./scripts/build.sh | tail -n 1)
(cd "$fdir" && ctest --output-on-failure -L fuzz)
report "fuzz (build + run)"
