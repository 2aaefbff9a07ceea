#!/bin/sh
# A 1 MiB allreduce between two ranks with and without a stranger flooding
# them, interleaved; prints each run's bus bandwidth and wall time (start-up
# included), and the medians' ratios. With KIND=listener a control run has
# the same stranger holding one connection: the same processes and timing,
# no flood (this machine's two cores make the extra process itself show).
#
#   bench/flood.sh [BIN_DIR]      (REPS=7 KIND=listener FLOOD=2000 SIZE=1M ITERS=300)
#
# KIND=listener: FLOOD silent connections to rank 0's transport port
#   (hvd-bench --flood), made just before the timed loop.
# KIND=store: FLOOD connections to the rendezvous store, each sending its
#   headers a byte a second, against FLOOD - FLOOD/6 slots, from before the
#   ranks start (hvd-bench --store-flood; try FLOOD=600).
set -eu
bin="${1:-build/bin}"
reps="${REPS:-7}"
kind="${KIND:-listener}"
flood="${FLOOD:-2000}"
size="${SIZE:-1M}"
iters="${ITERS:-300}"
case "$kind" in
listener) flag=--flood all="quiet control flood" ;;
store) flag=--store-flood all="quiet flood" ;;
*) echo "flood.sh: KIND must be listener or store, not '$kind'" >&2; exit 2 ;;
esac
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
modes="$all"

now() { date +%s.%N; }
for i in $(seq 1 "$reps"); do
    # rotate which goes first, so drift hits all alike
    modes="${modes#* } ${modes%% *}"
    for mode in $modes; do
        case "$mode" in quiet) n=0 ;; control) n=1 ;; flood) n="$flood" ;; esac
        t0=$(now)
        "$bin/hvd-bench" allreduce --np 2 --sizes "$size" -n "$iters" -w 30 -c 0 \
            "$flag" "$n" 2>>"$out/stderr" >"$out/run"
        t1=$(now)
        awk '$1 ~ /^[0-9]+$/ { print $8 }' "$out/run" >>"$out/$mode"
        awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", b - a }' >>"$out/$mode.wall"
    done
done
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
for mode in $all; do
    echo "$mode busbw GB/s: $(tr '\n' ' ' <"$out/$mode")"
    echo "$mode wall s: $(tr '\n' ' ' <"$out/$mode.wall")"
done
q=$(median "$out/quiet")
f=$(median "$out/flood")
echo "KIND=$kind FLOOD=$flood: median busbw quiet $q, flood $f, flood/quiet $(ratio "$f" "$q");" \
    "median wall quiet $(median "$out/quiet.wall") s, flood $(median "$out/flood.wall") s"
if [ -s "$out/control" ]; then
    c=$(median "$out/control")
    echo "control (one connection) $c, flood/control $(ratio "$f" "$c")"
fi
echo "log lines during the floods: $(wc -l <"$out/stderr")"
