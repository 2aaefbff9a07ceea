#!/bin/sh
# A 1 MiB allreduce between two ranks with and without a stranger holding
# FLOOD silent connections to rank 0's transport port (hvd-bench --flood),
# interleaved; prints each run's bus bandwidth and the medians' ratio.
#
#   bench/listener_flood.sh [BIN_DIR]      (REPS=7 FLOOD=2000 SIZE=1M ITERS=300)
set -eu
bin="${1:-build/bin}"
reps="${REPS:-7}"
flood="${FLOOD:-2000}"
size="${SIZE:-1M}"
iters="${ITERS:-300}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

busbw() { awk '$1 ~ /^[0-9]+$/ { print $8 }'; }
for i in $(seq 1 "$reps"); do
    # alternate which goes first, so drift hits both alike
    for mode in $([ $((i % 2)) -eq 1 ] && echo "quiet flood" || echo "flood quiet"); do
        n=0
        [ "$mode" = flood ] && n="$flood"
        "$bin/hvd-bench" allreduce --np 2 --sizes "$size" -n "$iters" -w 30 -c 0 \
            --flood "$n" 2>>"$out/stderr" | busbw >>"$out/$mode"
    done
done
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "quiet busbw GB/s: $(tr '\n' ' ' <"$out/quiet")"
echo "flood busbw GB/s: $(tr '\n' ' ' <"$out/flood")"
q=$(median "$out/quiet")
f=$(median "$out/flood")
echo "median quiet $q, flood $f (FLOOD=$flood), flood/quiet $(awk -v f="$f" -v q="$q" 'BEGIN { printf "%.3f", f / q }')"
echo "rank 0's log lines during the floods: $(wc -l <"$out/stderr")"
