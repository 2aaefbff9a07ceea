#!/bin/sh
# Sets up a fresh Debian 12 machine, builds hvd and runs the whole test suite.
# Extra arguments go to ctest (e.g. -L unit, -R rendezvous).
set -eu
cd "$(dirname "$0")/.."

./scripts/setup.sh
dir=$(./scripts/build.sh | tail -n 1)
cd "$dir"
ctest --output-on-failure --timeout 600 "$@"
