#!/bin/sh
# Configures and builds hvd into build/ (or build-<sanitizers>/ when
# HVD_SANITIZE is set, e.g. HVD_SANITIZE=address,undefined). Warnings are errors.
set -eu
cd "$(dirname "$0")/.."

sanitize="${HVD_SANITIZE:-}"
dir=build
[ -z "$sanitize" ] || dir="build-$(echo "$sanitize" | tr ',' '-')"

cmake -S . -B "$dir" -DHVD_WERROR=ON -DHVD_SANITIZE="$sanitize" >/dev/null
cmake --build "$dir" -j "$(nproc)"
echo "$dir"
