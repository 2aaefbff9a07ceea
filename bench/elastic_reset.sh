#!/bin/sh
# An elastic reset's time on each store: hvdrun's own and a 3-member etcd
# cluster on loopback, interleaved. Each repetition runs the e2e "kill"
# case (kill -9 of one of 4 workers) once per store and takes the time
# from the kill to the first completed step of the new round (as
# examples/train_elastic reports it); prints every time, the medians and
# their ratio.
#   REPS=7 bench/elastic_reset.sh [BIN_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../build/bin}
reps=${REPS:-7}
# shellcheck source=tests/etcd_cluster.sh
. "$here/../tests/etcd_cluster.sh"
trap etcd_cluster_stop EXIT
etcd_cluster_start 3

measure() { # STORE: one reset's seconds
    if [ "$1" = etcd ]; then
        out=$(HVD_TEST_RENDEZVOUS="etcd://$(etcd_endpoints)/bench-reset" \
            "$here/../tests/e2e/elastic.sh" "$bin" kill)
    else
        out=$("$here/../tests/e2e/elastic.sh" "$bin" kill)
    fi
    echo "$out" | sed -n 's/^resumed \([0-9.]*\) s after the kill$/\1/p'
}
median() { tr ' ' '\n' | sed '/^$/d' | sort -n |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

own="" etcd=""
i=0
while [ $i -lt "$reps" ]; do
    i=$((i + 1))
    a=$(measure own) && b=$(measure etcd) || { echo "run $i failed" >&2; exit 1; }
    [ -n "$a" ] && [ -n "$b" ] || { echo "run $i: no measurement" >&2; exit 1; }
    echo "run $i: hvdrun's store $a s, etcd $b s"
    own="$own $a" etcd="$etcd $b"
done
m_own=$(echo "$own" | median) m_etcd=$(echo "$etcd" | median)
awk -v a="$m_own" -v b="$m_etcd" -v n="$reps" 'BEGIN {
    printf "median of %d: hvdrun'"'"'s store %.3f s, etcd %.3f s (etcd / own = %.2f)\n", n, a, b, b / a }'
