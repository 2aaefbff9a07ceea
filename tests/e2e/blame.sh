#!/bin/sh
# hvdrun names the rank at fault last, in a training job: tests/e2e/blame.sh BIN_DIR CASE [RUNS]
#   frozen  rank 2 is stopped (SIGSTOP) between steps: the coordinator is
#           the first to notice ("rank 2 has sent nothing"), and the last
#           line names rank 2, not the first healthy rank that gave up
#   raised  rank 1 raises: its atexit shutdown stops the others, which may
#           exit first; the last line names rank 1
# Each case runs RUNS times (default 2). Exit 0: pass; 77: no torch for
# /usr/bin/python3 (skipped); anything else: fail, with a message.
set -u
bin=$1
case_name=$2
runs=${3:-2}
work=$(mktemp -d)
marker="hvd-blame-$$-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
trap 'pkill -KILL -f "$marker" 2>/dev/null; rm -rf "$work"' EXIT

fail() { echo "FAIL ($case_name): $*" >&2; cat "$work/err" >&2 2>/dev/null; exit 1; }
# shellcheck source=tests/e2e/expect.sh
. "$(dirname "$0")/expect.sh"

/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "skipped: no torch"; exit 77; }
export PYTHONPATH="$bin/../lib/hvd/python"

# A training loop: some "compute", then a small allreduce, step after step.
script="$work/$marker-train.py"
cat >"$script" <<'PY'
import sys
import time

import torch

import hvd.torch as hvd

hvd.init()
x = torch.ones(1000)
step = 0
while True:
    begin = time.monotonic()
    while time.monotonic() - begin < 0.02:
        pass
    hvd.allreduce(x, name='grad')
    step += 1
    if step % 10 == 0:
        print('step', step, flush=True)
    if sys.argv[1] == 'raised' and hvd.rank() == 1 and step == 20:
        raise ValueError('rank 1 fails on purpose')
PY

rank_pid() {
    for p in $(pgrep -f "$marker-train.py"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "HOROVOD_RANK=$1"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

for run in $(seq "$runs"); do
    rm -f "$work/rc" "$work/out" "$work/err"
    touch "$work/out" "$work/err"
    (
        timeout 120 "$bin/hvdrun" -np 3 --gloo-timeout-seconds 3 /usr/bin/python3 "$script" \
            "$case_name" >"$work/out" 2>"$work/err"
        echo $? >"$work/rc"
    ) &
    job=$!
    case $case_name in
    frozen)
        wait_out "^\[2\]<stdout>:step 10$"
        victim=$(rank_pid 2) || fail "run $run: no rank 2"
        kill -STOP "$victim"
        wait $job
        kill -KILL "$victim" 2>/dev/null
        want="timed out waiting for rank 2 on host"
        ;;
    raised)
        wait $job
        want="because rank 1 on host [^ ]* shut hvd down"
        ;;
    *) fail "unknown case" ;;
    esac
    rc=$(cat "$work/rc")
    [ "$rc" != 0 ] || fail "run $run: hvdrun exited with 0"
    last=$(tail -n 1 "$work/err")
    echo "$last" | grep -q -- "^hvdrun: .*$want" || fail "run $run: the last line is: $last"
    nothing_left
done
exit 0
