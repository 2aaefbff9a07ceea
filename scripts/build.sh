#!/bin/sh
# Configures and builds hvd into build/ (or build-<sanitizers>/ when
# HVD_SANITIZE is set, e.g. HVD_SANITIZE=address,undefined). Warnings are errors.
# HVD_FUZZ=1 builds build-fuzz/ instead: clang, AddressSanitizer+UBSan and
# the libFuzzer harnesses of tests/fuzz (ctest -L fuzz there).
set -eu
cd "$(dirname "$0")/.."

sanitize="${HVD_SANITIZE:-}"
dir=build
[ -z "$sanitize" ] || dir="build-$(echo "$sanitize" | tr ',' '-')"
fuzz_args=""
if [ "${HVD_FUZZ:-0}" != 0 ]; then
    dir=build-fuzz
    sanitize=address,undefined
    # CMake reads CC only when it first configures a folder.
    export CC="${CC:-clang}"
    # The GPU backend links through nvcc's host compiler, which knows no
    # libFuzzer; parsers need no GPU.
    fuzz_args="-DHVD_FUZZ=ON -DHVD_WITH_CUDA=OFF"
fi

# shellcheck disable=SC2086 # fuzz_args: optional words
cmake -S . -B "$dir" -DHVD_WERROR=ON -DHVD_SANITIZE="$sanitize" $fuzz_args >/dev/null
cmake --build "$dir" -j "$(nproc)"
echo "$dir"
