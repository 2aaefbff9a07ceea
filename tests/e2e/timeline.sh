#!/bin/bash
# A timeline read while its job runs and after the job is killed with
# kill -9: tests/e2e/timeline.sh BIN_DIR CASE
#   bench   hvdrun -np 2 --timeline-filename F --timeline-max-mb 1 train_mlp:
#           F parses as a trace while the job trains, with every rank's
#           row; F.1 (a full part) parses as it is, closed; after kill -9
#           of rank 0 (the writer) and the rest, F still parses
#   python  a Python job (hvd.torch) starts a timeline A at run time, stops
#           it, starts B and trains without ever stopping B: A is closed,
#           B has the job's events while it runs (before any stop; they
#           used to wait in a 64 KiB buffer until stop_timeline) and
#           parses after kill -9
# Files are checked by trace_check.py (Python's strict JSON parser and the
# Trace Event Format's rules). Exit 0: pass; 77: skipped (python: no torch,
# or a ThreadSanitizer build); anything else: fail, with a message.
set -u
bin=$(cd "$1" && pwd)
case_name=$2
build=$(dirname "$bin")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
marker="hvd-timeline-$$-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"

marked() { pgrep -f "$marker" || true; }
kill_marked() {
    for pid in $(marked); do kill -KILL "$pid" 2>/dev/null; done
}
# A sanitizer's report in the job's output fails the case (the job itself
# ends by kill -9, not with a report's exit code).
clean_output() {
    if grep -q -e 'Sanitizer' -e 'runtime error:' "$work/out"; then
        grep -A 30 -e 'Sanitizer' -e 'runtime error:' "$work/out" >&2
        fail "a sanitizer reported in the job"
    fi
}
trap 'kill_marked; wait; rm -rf "$work"' EXIT

fail() {
    echo "FAIL ($case_name): $*" >&2
    tail -n 20 "$work/out" >&2 2>/dev/null
    exit 1
}
# check FILE ARGS...: trace_check.py's verdict; sets $count, the file's events.
check() {
    out=$(/usr/bin/python3 "$here/trace_check.py" "$@" 2>&1) || fail "$out"
    count=${out#events }
}
# ready FILE ARGS...: like check, but a valid trace that lacks what ARGS ask
# for (or no file yet) is "not yet" (false), not a failure.
ready() {
    out=$(/usr/bin/python3 "$here/trace_check.py" "$@" 2>&1)
    case $? in
    0) count=${out#events } ;;
    3) return 1 ;;
    *) fail "$out" ;;
    esac
}
grown() { ready "$1" && [ "$count" -gt "$2" ]; }
# wait_for SECONDS COMMAND...: until COMMAND succeeds; fails the case after SECONDS.
wait_for() {
    n=$(($1 * 10))
    shift
    until "$@"; do
        [ "$n" -gt 0 ] || fail "waited in vain for: $*"
        [ -f "$work/rc" ] && fail "the job ended (exit $(cat "$work/rc")) while waiting for: $*"
        n=$((n - 1))
        sleep 0.1
    done
}
# The job's rank 0: the marked process whose environment says so.
rank0() {
    for pid in $(marked); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'HOROVOD_RANK=0'; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}
# kill -9 of rank 0, then of everything else of the job.
kill_job() {
    r0=$(rank0) || fail "no rank 0 found among: $(marked | tr '\n' ' ')"
    kill -KILL "$r0"
    kill_marked
    n=0
    while [ -n "$(marked)" ] && [ $n -lt 100 ]; do
        sleep 0.1
        n=$((n + 1))
    done
    [ -z "$(marked)" ] || fail "the job's processes outlived kill -9"
}

case $case_name in
bench)
    ln -s "$bin/train_mlp" "$work/$marker-train_mlp"
    f="$work/t.json"
    (
        timeout -k 5 240 "$bin/hvdrun" -np 2 --timeline-filename "$f" --timeline-max-mb 1 \
            "$work/$marker-train_mlp" --steps 10000000 --print-every 10000000 \
            >"$work/out" 2>&1
        { echo $? >"$work/rc"; } 2>/dev/null
    ) &
    wait_for 60 ready "$f" --expect NEGOTIATE_ALLREDUCE:B --rows 2 --min-events 200
    # Read while it runs: a trace every time, and a growing one.
    before=$count
    for _ in 1 2 3 4 5; do
        sleep 0.3
        check "$f" --rows 2
    done
    # A full part, closed with its bracket: it parses as it is.
    wait_for 120 test -f "$f.1"
    check "$f.1" --closed --expect ALLREDUCE:E --rows 2
    check "$f"
    [ "$count" != "$before" ] || fail "the timeline did not change while the job ran"
    [ -f "$f.next" ] && fail "a rotation left $f.next"
    kill_job
    clean_output
    check "$f" --rows 2 --expect process_name:M
    ;;
python)
    . "$here/../python/python_env.sh" # exits 77 without torch, or in a ThreadSanitizer build
    export PYTHONPATH="$build/lib/hvd/python"
    script="$work/$marker-job.py"
    cat >"$script" <<'PY'
import sys

import torch

import hvd.torch as hvd

first, second, ready = sys.argv[1:4]
hvd.init()
x = torch.ones(100)
hvd.start_timeline(first)
for _ in range(20):
    hvd.allreduce(x, name='first.probe')
hvd.stop_timeline()
hvd.start_timeline(second, mark_cycles=True)
step = 0
while True:  # until killed; the timeline is never stopped
    hvd.allreduce(x, name='grad.%d' % (step % 3))
    step += 1
    if step == 200 and hvd.rank() == 0:
        open(ready, 'w').close()
PY
    a="$work/a.json"
    b="$work/b.json"
    (
        with_preload timeout -k 5 240 "$bin/hvdrun" -np 2 "$PYTHON" "$script" "$a" "$b" \
            "$work/ready" >"$work/out" 2>&1
        { echo $? >"$work/rc"; } 2>/dev/null
    ) &
    wait_for 120 test -f "$work/ready"
    check "$a" --closed --expect allreduce.first.probe:i --expect ALLREDUCE:E --rows 2
    # Stopped at run time: rank 0 submits grad.* only after its stop, so A
    # has none of them on rank 0's row (rank 1, running ahead, may have
    # sent its first while A was still on).
    grep -qE '"name":"allreduce\.grad\.[0-9]+","ph":"i",.*"tid":1\}' "$a" &&
        fail "$a has events recorded after stop_timeline"
    wait_for 10 ready "$b" --expect allreduce.grad.0:i --expect CYCLE_START:i --rows 2 \
        --min-events 100
    wait_for 10 grown "$b" "$count"
    kill_job
    clean_output
    check "$b" --expect allreduce.grad.2:i --rows 2
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "ok ($case_name)"
