#!/bin/sh
# Pod mode end to end: tests/e2e/pod.sh BIN_DIR CASE
# Ranks started on their own (no hvdrun), each with only the standalone
# store's address, the job size (or, in an elastic job, nothing: the store's
# driver decides) and the token (HVD_POD=1), as Kubernetes pods are. Every
# process runs under `timeout`: a hang fails the case.
set -u
bin=$1
case_name=$2
work=$(mktemp -d)
store_pid=
pods=
cleanup() {
    [ -n "$store_pid" ] && kill "$store_pid" 2>/dev/null
    # shellcheck disable=SC2086
    [ -n "$pods" ] && kill $pods 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "FAIL ($case_name): $*" >&2
    [ -f "$work/store" ] && sed 's/^/store: /' "$work/store" >&2
    exit 1
}
# shellcheck source=tests/e2e/expect.sh
. "$(dirname "$0")/expect.sh"

# start_store [FLAGS...]: the standalone store on a free port, with a token;
# its output (stdout and stderr) in $work/store.
echo "pod-e2e-token-$$" >"$work/token"
start_store() {
    # Emptied here, not by the background redirection, which may run only
    # after the wait below has read a previous store's line.
    : >"$work/store"
    "$bin/hvd-rendezvous" --bind 127.0.0.1 --port 0 --token-file "$work/token" "$@" \
        >>"$work/store" 2>&1 &
    store_pid=$!
    for _ in $(seq 100); do
        grep -q "listening on" "$work/store" && break
        sleep 0.05
    done
    port=$(sed -n 's/.*listening on .*:\([0-9]*\).*/\1/p' "$work/store" | head -n 1)
    [ -n "$port" ] || fail "the store did not start"
}

# pod LOG NAME SIZE CMD...: one rank named NAME (its host name), in the
# background, output in $work/LOG.
pod() {
    log=$1 name=$2 size=$3
    shift 3
    env -u HOROVOD_RANK HVD_POD=1 HOROVOD_SIZE="$size" HOROVOD_HOSTNAME="$name" \
        HOROVOD_GLOO_RENDEZVOUS_ADDR=127.0.0.1 HOROVOD_GLOO_RENDEZVOUS_PORT="$port" \
        HVD_TOKEN="$(cat "$work/token")" HOROVOD_GLOO_TIMEOUT_SECONDS=20 HOROVOD_LOG_LEVEL=info \
        timeout 60 "$@" >"$work/$log" 2>&1 &
    pods="$pods $!"
}
# Waits for the pods (not the store).
wait_pods() {
    # shellcheck disable=SC2086
    wait $pods
}

# epod NAME: a pod of an elastic job named NAME (its host name), running
# train_elastic, output in $work/NAME; $last is its `timeout` process.
epod() {
    env -u HOROVOD_RANK -u HOROVOD_SIZE HVD_POD=1 HOROVOD_ELASTIC=1 HOROVOD_HOSTNAME="$1" \
        HOROVOD_GLOO_RENDEZVOUS_ADDR=127.0.0.1 HOROVOD_GLOO_RENDEZVOUS_PORT="$port" \
        HVD_TOKEN="$(cat "$work/token")" HOROVOD_GLOO_TIMEOUT_SECONDS=10 HOROVOD_LOG_LEVEL=info \
        timeout 90 "$bin/train_elastic" --steps "${steps:-300}" --step-ms 10 >"$work/$1" 2>&1 &
    last=$!
    pods="$pods $last"
}
# expect_pod PID NAME CODE: the pod ended with CODE.
expect_pod() {
    wait "$1"
    code=$?
    [ "$code" = "$3" ] || { sed "s/^/$2: /" "$work/$2" >&2; fail "$2 exited with $code, expected $3"; }
}
# kill_pod PID: SIGKILL for the pod's program (the child of its `timeout`).
kill_pod() { pkill -KILL -P "$1"; }

case $case_name in
bench | train | missing_size) start_store ;;
elastic*) start_store --min-np 2 --max-np 3 --pod-timeout 3 --elastic-timeout 60 --verbose ;;
esac

case $case_name in
bench)
    # Four pods, started out of order, named like StatefulSet pods.
    for name in train-3 train-10 train-0 train-2; do
        pod "$name" "$name" 4 "$bin/hvd-bench" allreduce -b 8 -e 1M -f 32 -c 1
    done
    wait_pods
    for name in train-0 train-2 train-3 train-10; do
        grep -q "is rank" "$work/$name" || { cat "$work/$name" >&2; fail "$name has no rank"; }
    done
    grep -q "'train-0' is rank 0 of 4" "$work/train-0" || fail "train-0 is not rank 0"
    grep -q "'train-10' is rank 3 of 4" "$work/train-10" || fail "train-10 is not rank 3"
    grep -q "Out of bounds values : 0 OK" "$work/train-0" ||
        { cat "$work/train-0" >&2; fail "rank 0 reports wrong results"; }
    ;;
train)
    # The example through the public API; two ranks share a host name and
    # tell themselves apart by HOROVOD_LOCAL_RANK.
    for lr in 0 1; do
        HOROVOD_LOCAL_RANK=$lr HOROVOD_LOCAL_SIZE=2 pod "a$lr" node-a 3 "$bin/train_mlp" --steps 30
    done
    pod b node-b 3 "$bin/train_mlp" --steps 30
    wait_pods
    cat "$work/a0" "$work/a1" "$work/b" >"$work/all"
    grep -q "'node-a:0' is rank 0 of 3" "$work/a0" || { cat "$work/all" >&2; fail "node-a:0 is not rank 0"; }
    grep -q "'node-b' is rank 2 of 3" "$work/b" || { cat "$work/all" >&2; fail "node-b is not rank 2"; }
    grep -q "parameters identical on all 3 ranks" "$work/all" ||
        { cat "$work/all" >&2; fail "the job did not finish with identical parameters"; }
    ;;
missing_size)
    env -u HOROVOD_RANK -u HOROVOD_SIZE HVD_POD=1 HOROVOD_GLOO_RENDEZVOUS_ADDR=127.0.0.1 \
        HOROVOD_GLOO_RENDEZVOUS_PORT="$port" timeout 20 "$bin/train_mlp" --steps 1 \
        >"$work/out" 2>&1 && fail "a pod without HOROVOD_SIZE started"
    grep -q "HVD_POD=1 needs HOROVOD_SIZE" "$work/out" || { cat "$work/out" >&2; fail "no clear error"; }
    env HVD_POD=1 HOROVOD_RANK=0 HOROVOD_SIZE=2 HOROVOD_GLOO_RENDEZVOUS_ADDR=127.0.0.1 \
        HOROVOD_GLOO_RENDEZVOUS_PORT="$port" timeout 20 "$bin/train_mlp" --steps 1 \
        >"$work/out" 2>&1 && fail "a pod with HOROVOD_RANK started"
    grep -q "unset HOROVOD_RANK" "$work/out" || { cat "$work/out" >&2; fail "no clear error"; }
    ;;
elastic)
    # Two pods start the job, a third joins, one is killed: the job goes
    # on without it and finishes; a pod that comes after the end is told so.
    epod train-0
    p0=$last
    epod train-1
    p1=$last
    wait_line store "store " "round 0: 2 workers on 2 hosts"
    epod train-2
    p2=$last
    wait_line store "store " "round 1: 3 workers on 3 hosts"
    kill_pod "$p1"
    wait_line store "store " "round 2: 2 workers on 2 hosts"
    expect_pod "$p0" train-0 0
    expect_pod "$p2" train-2 0
    wait "$p1"
    # Its peers left the round at once: 2 s of silence then, not --pod-timeout.
    grep -q "train-1:0.*sent no heartbeat for 2 s while the others reset" "$work/store" ||
        fail "the store did not see train-1 go"
    # Rank 0 prints; which pod it is depends on who registered first.
    cat "$work/train-0" "$work/train-1" "$work/train-2" >"$work/all"
    grep -q "parameters identical on every rank" "$work/all" ||
        { cat "$work/all" >&2; fail "the job did not finish with identical parameters"; }
    grep -q "start: 3 workers" "$work/all" || fail "train-2 did not join"
    wait_line store "store " "the job has finished"
    epod train-3
    expect_pod "$last" train-3 0
    grep -q "the elastic job has finished" "$work/train-3" ||
        { cat "$work/train-3" >&2; fail "train-3 was not told"; }
    ;;
elastic_restart)
    # Rank 0's pod restarted under its own name replaces its old self, and
    # the pod that holds the state becomes rank 0: training goes on from
    # the last commit, not from the start. When every pod is gone, new
    # ones start the job again on the same store.
    steps=100000
    epod train-0
    p0=$last
    wait_line store "store " "pod train-0:0 registered" # the oldest: rank 0
    epod train-1
    p1=$last
    wait_line store "store " "round 0: 2 workers on 2 hosts"
    wait_line train-0 "train-0 " "^step 100:"
    kill_pod "$p0"
    epod train-0
    p0=$last
    wait_line store "store " "worker 0 (pod train-0:0) was replaced by a new process"
    wait_line store "store " "round 1: 2 workers on 2 hosts"
    wait_line train-1 "train-1 " "^start: 2 workers, from step"
    first=$(sed -n 's/^start: 2 workers, from step \([0-9]*\).*/\1/p' "$work/train-1" | head -n 1)
    [ "$first" -ge 100 ] || fail "round 1 started from step $first: the state was lost"
    kill_pod "$p0"
    kill_pod "$p1"
    wait "$p0" "$p1"
    wait_line store "store " "every worker is gone; the job starts again once 2 pods"
    steps=200
    epod train-0
    p0=$last
    epod train-1
    p1=$last
    expect_pod "$p0" train-0 0
    expect_pod "$p1" train-1 0
    cat "$work/train-0" "$work/train-1" >"$work/all"
    grep -q "parameters identical on every rank" "$work/all" ||
        { cat "$work/all" >&2; fail "the restarted job did not finish"; }
    ;;
elastic_usage)
    # The driver's flags, and an elastic pod without a driver.
    for bad in "--np 3" "--min-np 3 --np 2" "--min-np 2 --max-np 1" "--min-np 0" \
        "--min-np 2 --pod-timeout 1"; do
        # shellcheck disable=SC2086
        "$bin/hvd-rendezvous" $bad >"$work/out" 2>&1
        code=$?
        [ "$code" = 2 ] || fail "hvd-rendezvous $bad exited with $code, expected 2"
        grep -q "see hvd-rendezvous --help" "$work/out" ||
            fail "hvd-rendezvous $bad: no usage message"
    done
    kill "$store_pid"
    wait "$store_pid"
    start_store
    HOROVOD_ELASTIC_TIMEOUT=2 epod train-0
    expect_pod "$last" train-0 1
    grep -q "no elastic driver admitted pod train-0:0 within 2 s" "$work/train-0" ||
        { cat "$work/train-0" >&2; fail "no clear error without a driver"; }
    ;;
*)
    fail "unknown case"
    ;;
esac
exit 0
