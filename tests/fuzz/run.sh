#!/bin/sh
# Runs one libFuzzer harness for a bounded time (ctest fuzz.<name>):
#   run.sh HARNESS CORPUS SECONDS SCRATCH [libFuzzer flags...]
# New inputs go to SCRATCH/corpus, crashes to SCRATCH/artifacts; the
# checked-in CORPUS is only read. Any failure fails the test; the artifact's
# path is in libFuzzer's last lines (README.md says how it becomes a seed).
#   run.sh --missing REASON
# is what a fuzz build without clang or libFuzzer registers: skipped (77).
set -eu
if [ "$1" = --missing ]; then
    echo "fuzz: skipped: $2"
    exit 77
fi
harness=$1 corpus=$2 seconds=$3 scratch=$4
shift 4
rm -rf "$scratch"
mkdir -p "$scratch/corpus" "$scratch/artifacts"
exec "$harness" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$scratch/artifacts/" "$@" "$scratch/corpus" "$corpus"
