#!/bin/bash
# The cost of hvd's metrics on the 8-byte allreduce latency:
#   bench/metrics_overhead.sh BIN_DIR [PAIRS] [OPS]
# hvd-bench-grads latency --np 2 --bytes 8, with HVD_METRICS=0 and =1 run by
# turns (interleaved, so that both see the same machine), once through
# lanes (the default on one host) and once through rank 0 with the result
# reduced inline (HVD_SHM_LANES=0). Prints each run's median, the median of
# those medians per setting, and the median of the paired differences.
set -eu
bin=$(cd "$1" && pwd)
pairs=${2:-15}
ops=${3:-200000}

median() { sort -n | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
run() { # CASE_ENV METRICS: the run's median latency in us
    env $1 HVD_METRICS=$2 "$bin/hvd-bench-grads" latency --np 2 --bytes 8 -n "$ops" -w 2000 \
        -c 0 2>&1 | awk '$1 == "latency" { print $4 }'
}
for c in "HVD_SHM_LANES=1" "HVD_SHM_LANES=0"; do
    : >/tmp/hvd-mo-off.$$
    : >/tmp/hvd-mo-on.$$
    : >/tmp/hvd-mo-diff.$$
    for _ in $(seq 1 "$pairs"); do
        off=$(run "$c" 0)
        on=$(run "$c" 1)
        echo "$off" >>/tmp/hvd-mo-off.$$
        echo "$on" >>/tmp/hvd-mo-on.$$
        awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f\n", a - b }' >>/tmp/hvd-mo-diff.$$
    done
    echo "# $c, $pairs pairs of $ops ops (load $(cut -d' ' -f1-3 /proc/loadavg))"
    echo "off: $(tr '\n' ' ' </tmp/hvd-mo-off.$$) median $(median </tmp/hvd-mo-off.$$) us"
    echo "on:  $(tr '\n' ' ' </tmp/hvd-mo-on.$$) median $(median </tmp/hvd-mo-on.$$) us"
    echo "on - off, paired: median $(median </tmp/hvd-mo-diff.$$) us"
done
rm -f /tmp/hvd-mo-off.$$ /tmp/hvd-mo-on.$$ /tmp/hvd-mo-diff.$$
