#!/bin/sh
# The rendezvous benchmark (hvd-bench-rendezvous) through a 3-member etcd
# cluster on loopback, side by side with hvd's own store (spawned
# hvd-rendezvous), interleaved: REPS repetitions of each rank count on
# each store, each etcd run under a prefix of its own. Prints every run's
# wall time, the medians and their ratio.
#   REPS=3 RANKS="1024 4096" bench/rendezvous_etcd.sh [BIN_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../build/bin}
reps=${REPS:-3}
ranks=${RANKS:-1024 4096}
# shellcheck source=tests/etcd_cluster.sh
. "$here/../tests/etcd_cluster.sh"
trap etcd_cluster_stop EXIT
etcd_cluster_start 3

wall() { # ARGS...: the median wall seconds of one hvd-bench-rendezvous run
    "$bin/hvd-bench-rendezvous" --repeat 1 --timeout 600 "$@" |
        sed -n 's/^# ranks [0-9]*: median wall \([0-9.]*\) s.*/\1/p'
}
median() { tr ' ' '\n' | sed '/^$/d' | sort -n |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for n in $ranks; do
    own="" etcd="" i=0
    while [ "$i" -lt "$reps" ]; do
        i=$((i + 1))
        a=$(wall --ranks "$n")
        b=$(wall --ranks "$n" --etcd "etcd://$(etcd_endpoints)/bench-$n-$i")
        [ -n "$a" ] && [ -n "$b" ] || { echo "$n ranks, run $i: a run failed" >&2; exit 1; }
        echo "$n ranks, run $i: hvd's store $a s, etcd $b s"
        own="$own $a" etcd="$etcd $b"
    done
    m_own=$(echo "$own" | median) m_etcd=$(echo "$etcd" | median)
    awk -v n="$n" -v a="$m_own" -v b="$m_etcd" -v k="$reps" 'BEGIN {
        printf "%d ranks, median of %d: hvd'"'"'s store %.3f s, etcd %.3f s (etcd / own = %.1f)\n",
               n, k, a, b, b / a }'
done
