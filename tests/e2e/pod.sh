#!/bin/sh
# Pod mode end to end: tests/e2e/pod.sh BIN_DIR CASE
# Ranks started on their own (no hvdrun), each with only the standalone
# store's address, the job size and the token (HVD_POD=1), as Kubernetes
# pods are. Every process runs under `timeout`: a hang fails the case.
set -u
bin=$1
case_name=$2
work=$(mktemp -d)
store_pid=
trap '[ -n "$store_pid" ] && kill "$store_pid" 2>/dev/null; rm -rf "$work"' EXIT

fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }

# The standalone store on a free port, with a token.
echo "pod-e2e-token-$$" >"$work/token"
"$bin/hvd-rendezvous" --bind 127.0.0.1 --port 0 --token-file "$work/token" >"$work/store" 2>&1 &
store_pid=$!
for _ in $(seq 100); do
    grep -q "listening on" "$work/store" && break
    sleep 0.05
done
port=$(sed -n 's/.*listening on .*:\([0-9]*\).*/\1/p' "$work/store" | head -n 1)
[ -n "$port" ] || { cat "$work/store" >&2; fail "the store did not start"; }

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
pods=
# Waits for the pods (not the store).
wait_pods() {
    # shellcheck disable=SC2086
    wait $pods
}

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
*)
    fail "unknown case"
    ;;
esac
exit 0
