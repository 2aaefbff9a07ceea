#!/bin/bash
# GET /metrics of a running job, checked by Prometheus' own tool:
# tests/e2e/metrics.sh BIN_DIR
#   hvdrun -np 4 hvd-bench-grads latency (a long run); while it runs, the
#   store's /metrics (read from this host without a token) must pass
#   `promtool check metrics`, label every series with rank and host, and
#   show allreduces on every rank within a few seconds; the job token (from
#   a rank's environment) reads it too, a wrong one is refused (401), and
#   the token appears nowhere in what is served.
# Exit 0: pass; 77: skipped (no promtool or curl); anything else: fail.
set -u
bin=$(cd "$1" && pwd)
work=$(mktemp -d)
np=4

for tool in promtool curl; do
    if ! command -v "$tool" >/dev/null; then
        echo "SKIP: $tool is not installed (Debian: apt-get install prometheus curl)"
        exit 77
    fi
done

job=
# The ranks are hvdrun's children: they go first, then hvdrun.
stop_job() {
    [ -n "$job" ] || return
    for pid in $(pgrep -P "$job"); do kill -KILL "$pid" 2>/dev/null; done
    kill -KILL "$job" 2>/dev/null
}
trap 'stop_job; wait 2>/dev/null; rm -rf "$work"' EXIT

fail() {
    echo "FAIL: $*" >&2
    tail -n 20 "$work/out" >&2 2>/dev/null
    [ -f "$work/metrics" ] && head -n 40 "$work/metrics" >&2
    exit 1
}

"$bin/hvdrun" --verbose -np $np "$bin/hvd-bench-grads" latency -n 1000000 -w 10 -c 0 \
    >"$work/out" 2>&1 &
job=$!

deadline=$((SECONDS + 60))
addr=
while [ -z "$addr" ]; do
    [ $SECONDS -lt $deadline ] || fail "hvdrun never said where its store is"
    addr=$(sed -n 's/^hvdrun: rendezvous store on \([0-9.:]*\) .*/\1/p' "$work/out" | head -n 1)
    [ -n "$addr" ] || sleep 0.2
done
url="http://$addr/metrics"

# Every rank's allreduce count, once all of them are above 0.
all_ranks_counted() {
    curl -sf -o "$work/metrics" "$url" || return 1
    for r in $(seq 0 $((np - 1))); do
        awk -v r="$r" '
            index($0, "hvd_tensors_total{rank=\"" r "\",") == 1 && /op="allreduce"/ { n += $NF }
            END { exit !(n > 0) }' "$work/metrics" || return 1
    done
}
deadline=$((SECONDS + 60))
until all_ranks_counted; do
    [ $SECONDS -lt $deadline ] || fail "no allreduce counted on every rank within 60 s"
    kill -0 $job 2>/dev/null || fail "the job ended before its metrics were read"
    sleep 0.5
done

out=$(promtool check metrics <"$work/metrics" 2>&1) || fail "promtool check metrics: $out"

# Every sample is labelled rank and host, first.
bad=$(grep -v '^#' "$work/metrics" | grep -v -E '^[a-z_]+\{rank="[0-9]+",host="[^"]*"' | head -n 3)
[ -z "$bad" ] || fail "samples without rank and host labels: $bad"
grep -q '^# TYPE hvd_operation_seconds histogram' "$work/metrics" || fail "no latency histogram"
grep -q '^# HELP hvd_operations_total ' "$work/metrics" || fail "no HELP line"

# Counters grow: a second read has more allreduces on rank 0.
count0() {
    awk 'index($0, "hvd_tensors_total{rank=\"0\",") == 1 && /op="allreduce"/ { n += $NF }
         END { print n + 0 }' "$1"
}
first=$(count0 "$work/metrics")
sleep 2.5
curl -sf -o "$work/metrics2" "$url" || fail "second read of $url failed"
second=$(count0 "$work/metrics2")
[ "$second" -gt "$first" ] || fail "rank 0's allreduces did not grow ($first, then $second)"

# The job token reads it as well, a wrong one does not, and the token is
# not in what is served.
rank_pid=$(pgrep -P "$job" | head -n 1)
token=$(tr '\0' '\n' <"/proc/$rank_pid/environ" 2>/dev/null | sed -n 's/^HVD_TOKEN=//p')
[ -n "$token" ] || fail "no HVD_TOKEN in rank $rank_pid's environment"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" "$url")
[ "$code" = 200 ] || fail "with the job token: HTTP $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer x$token" "$url")
[ "$code" = 401 ] || fail "with a wrong token: HTTP $code, not 401"
code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT --data x "$url")
[ "$code" = 405 ] || fail "PUT /metrics: HTTP $code, not 405"
if grep -q -F "$token" "$work/metrics" "$work/metrics2"; then
    fail "the job token is in /metrics"
fi
# A sanitizer's report in the job's output fails the test (the job itself
# ends by kill -9, not with a report's exit code).
if grep -q -e 'Sanitizer' -e 'runtime error:' "$work/out"; then
    grep -A 30 -e 'Sanitizer' -e 'runtime error:' "$work/out" >&2
    fail "a sanitizer reported in the job"
fi
echo "ok: $np ranks, $(grep -c -v '^#' "$work/metrics2") samples, promtool accepts"
exit 0
