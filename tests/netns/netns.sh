#!/bin/sh
# Multi-host tests on a bed of network namespaces: tests/netns/netns.sh BIN_DIR CASE
# Each case makes its own bed (bed.sh up 4: node1..node4, node4's interface
# named ens5, and a launcher host ctl), runs real jobs through hvdrun with
# bed.sh's ssh stand-in, and removes the bed on every exit path. Remote
# ranks live in sessions of their own on their hosts, as under ssh: hvdrun
# cannot signal them, so the failure cases see how each rank ends by itself.
# Exit 0: pass; 77: skipped (no namespaces here: not root, no `ip`, no
# permission); anything else: fail (with a message).
# shellcheck disable=SC2016,SC2086 # rank commands in single quotes; word-split command lines
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$1" && pwd)
case_name=$2
bedsh=$here/bed.sh

why=$("$bedsh" check 2>&1)
case $? in
0) ;;
77)
    echo "SKIPPED ($case_name): $why"
    exit 77
    ;;
*)
    echo "FAIL ($case_name): bed.sh check: $why" >&2
    exit 1
    ;;
esac

work=$(mktemp -d)
bed=hvdbed-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
trap '"$bedsh" -b "$bed" down; rm -rf "$work"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

fail() { echo "FAIL ($case_name): $*" >&2; show; exit 1; }
show() { cat "$work/out" "$work/err" >&2 2>/dev/null; }
B() { "$bedsh" -b "$bed" "$@"; }

"$bedsh" down --stale # beds of runs that were killed before their trap ran
B up 4 --owner $$ >/dev/null 2>"$work/up" || { cat "$work/up" >&2; fail "bed.sh up 4"; }

# start HOST ARGS...: hvdrun on HOST, in the background; finish waits for it.
start() {
    host=$1
    shift
    rm -f "$work/rc"
    B exits --clear
    (timeout 60 "$bedsh" -b "$bed" exec "$host" "$bin/hvdrun" \
        --ssh-command "$bedsh -b $bed ssh" "$@" >"$work/out" 2>"$work/err"
     echo $? >"$work/rc") &
    job=$!
}
finish() { wait "$job"; rc=$(cat "$work/rc"); }
run() { start "$@"; finish; }
# Waits at most $1 s for hvdrun to end (a bound for hangs, not a timing).
finish_within() {
    n=0
    while [ ! -f "$work/rc" ]; do
        n=$((n + 1))
        [ $n -le $(($1 * 10)) ] || fail "hvdrun still running $1 s after the failure"
        sleep 0.1
    done
    finish
}
# shellcheck source=tests/e2e/expect.sh
. "$here/../e2e/expect.sh"
expect_fail() { [ "$rc" != 0 ] || fail "exit code 0 for a job that should fail"; }
# Waits at most $1 s until no process is left on any host: every remote
# rank has ended by itself.
ranks_end_within() {
    n=0
    while [ -n "$(B pids)" ]; do
        n=$((n + 1))
        if [ $n -gt $(($1 * 10)) ]; then
            for p in $(B pids); do ps -o pid=,args= -p "$p" >&2; done
            fail "processes still running on the hosts $1 s after hvdrun ended"
        fi
        sleep 0.1
    done
}
# expect_exits N: N remote ranks ended by themselves (any number with N
# "any"), every one non-zero.
expect_exits() {
    B exits >"$work/exits"
    n=$(wc -l <"$work/exits")
    if [ "$1" != any ] && [ "$n" != "$1" ]; then
        cat "$work/exits" >&2
        fail "$n remote ranks recorded an exit, expected $1"
    fi
    if awk '$2 == 0 { found = 1 } END { exit !found }' "$work/exits"; then
        cat "$work/exits" >&2
        fail "a remote rank exited 0 from a failed job"
    fi
}

# pods_end_within S HOST...: waits at most S s for the pods started on the
# hosts (each writes $work/HOST.rc when it ends).
pods_end_within() {
    limit=$1
    shift
    n=0
    for h in "$@"; do
        until [ -f "$work/$h.rc" ]; do
            n=$((n + 1))
            [ $n -le $((limit * 10)) ] || fail "the pod on $h still runs after $limit s"
            sleep 0.1
        done
    done
}

hosts4x2=node1:2,node2:2,node3:2,node4:2
hosts4x1=node1:1,node2:1,node3:1,node4:1
bench_small="$bin/hvd-bench allreduce -b 8 -e 1M -f 32 -c 1 -n 2 -w 1"
train_long="$bin/train_mlp --steps 10000000 --print-every 500"

case $case_name in
hier)
    # Where each rank runs: its host's name, address and interface, and the
    # local and cross rings hvdrun plans. hvdrun runs on node1, so ranks 0
    # and 1 are its own children and the others come through the stand-in.
    run node1 -H $hosts4x2 --hierarchical-allreduce sh -c 'echo "rank=$HOROVOD_RANK host=$HOROVOD_HOSTNAME uts=$(hostname) local=$HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE cross=$HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE hier=$HOROVOD_HIERARCHICAL_ALLREDUCE store=$HOROVOD_GLOO_RENDEZVOUS_ADDR net=$(ip -o -4 addr show to 10.77.0.0/24 | awk "{ print \$2, \$4 }")"'
    expect_rc 0
    for r in 0 1 2 3 4 5 6 7; do
        h=$((r / 2 + 1)) if=eth0
        [ $h = 4 ] && if=ens5
        expect_out "^\[$r\]<stdout>:rank=$r host=node$h uts=node$h local=$((r % 2))/2 cross=$((r / 2))/4 hier=1 store=10.77.0.1 net=$if 10.77.0.$h/24$"
    done
    # hvd-bench's hierarchical allreduce and allgather (the local and cross
    # communicators directly), every result checked.
    for coll in allreduce allgather; do
        run node1 -H $hosts4x2 "$bin/hvd-bench" $coll --hierarchical -b 8 -e 4M -f 8 -c 1 -n 3 -w 1
        expect_rc 0
        expect_out "^\[0\]<stdout>:# hvd-bench $coll: 8 ranks, .*, check 1, hierarchical$"
        expect_out "^\[0\]<stdout>:# Out of bounds values : 0 OK$"
    done
    # Training through hvd's API with HOROVOD_HIERARCHICAL_ALLREDUCE=1: the
    # parameters stay identical, and each rank's rings are the ones planned:
    # the local ring within its host, the cross ring over the 4 hosts, each
    # rank advertising its own host's address alone.
    run node1 -H $hosts4x2 --hierarchical-allreduce --log-level debug \
        "$bin/train_mlp" --steps 200 --expect-loss-below 0.3
    expect_rc 0
    expect_out "^\[0\]<stdout>:train_mlp: 8 ranks"
    expect_out "^\[0\]<stdout>:parameters identical on all 8 ranks$"
    for r in 0 1 2 3 4 5 6 7; do
        h=$((r / 2 + 1)) l=$((r % 2)) c=$((r / 2))
        expect_err "^\[$r\]<stderr>:.* hvd [^ ]*: rank $r of 8 (local $l of 2, cross $c of 4)$"
        expect_err "^\[$r\]<stderr>:.* transport: listening on port [0-9]*, advertising 10\.77\.0\.$h$"
        expect_err "^\[$r\]<stderr>:.* communicator local_node$h: rank $l of 2 connected to its ring$"
        expect_err "^\[$r\]<stderr>:.* communicator cross_$l: rank $c of 4 connected to its ring$"
    done
    ;;
iface)
    # By route (no interface named): each rank advertises the address that
    # reaches the store, alone: not the decoy docker0 every host has, and
    # ens5 on node4.
    run ctl -H $hosts4x1 --log-level debug $bench_small
    expect_rc 0
    expect_out "^\[0\]<stdout>:# Out of bounds values : 0 OK$"
    for r in 0 1 2 3; do
        expect_err "^\[$r\]<stderr>:.* transport: listening on port [0-9]*, advertising 10\.77\.0\.$((r + 1))$"
    done
    # Named, on the hosts that have it.
    run ctl -H node1:1,node2:1,node3:1 --network-interface eth0 --log-level debug $bench_small
    expect_rc 0
    expect_out "^\[0\]<stdout>:# Out of bounds values : 0 OK$"
    for r in 0 1 2; do
        expect_err "^\[$r\]<stderr>:.* transport: listening on port [0-9]*, advertising 10\.77\.0\.$((r + 1))$"
    done
    # Named, with a host that lacks it: its rank says which interface and
    # what the host has, hvdrun names the host, and the ranks left behind
    # on the other hosts end too (those hvdrun stopped before their remote
    # shell got through never start).
    run ctl -H $hosts4x1 --network-interface eth0 --gloo-timeout-seconds 5 $bench_small
    expect_rc 1
    expect_err "^\[3\]<stderr>:hvd-bench: HOROVOD_GLOO_IFACE=eth0 selects no interface; this host has: .*ens5 (10\.77\.0\.4)"
    expect_err "^hvdrun: rank 3 on host node4 exited with code 1"
    ranks_end_within 30
    expect_exits any
    # hvdrun on the host that lacks it: no address for the store.
    run node4 -H node1:1,node2:1 --network-interface eth0 $bench_small
    expect_rc 1
    expect_err "^hvdrun: choosing the address remote ranks reach the store at: HOROVOD_GLOO_IFACE=eth0 selects no interface"
    # Lists and exclusions that cover both names.
    for spec in eth0,ens5 '^docker,lo'; do
        run ctl -H $hosts4x1 --network-interface "$spec" --log-level debug $bench_small
        expect_rc 0
        expect_out "^\[0\]<stdout>:# Out of bounds values : 0 OK$"
        expect_err "^\[3\]<stderr>:.* transport: listening on port [0-9]*, advertising 10\.77\.0\.4$"
    done
    ;;
link_down)
    # node2's cable is pulled mid-training: nothing more reaches it or
    # leaves it, so only timeouts can tell. Every rank, node2's included,
    # must end with an error by itself, and hvdrun must exit non-zero.
    start ctl -H $hosts4x2 --gloo-timeout-seconds 5 $train_long
    wait_out "^\[0\]<stdout>:step 500 loss"
    B link node2 down || fail "bed.sh link node2 down"
    finish_within 60
    expect_fail
    expect_err "^hvdrun: rank [0-9] on host node[1-4] exited with code [0-9]*; stopping the other ranks$"
    # Silence is seen by hvd's timer or by the kernel's TCP_USER_TIMEOUT.
    expect_err "^\[[0-9]\]<stderr>:train_mlp: rank [0-9]: .* failed: .*timed out"
    ranks_end_within 60
    expect_exits 8
    ;;
host_kill)
    # Every process of node1 (ranks 0 and 1, the coordinator among them) is
    # killed mid-training: the remote shell reports the lost session, and
    # the ranks on the other hosts end with an error by themselves.
    start ctl -H $hosts4x2 --gloo-timeout-seconds 5 $train_long
    wait_out "^\[0\]<stdout>:step 500 loss"
    B kill node1
    finish_within 60
    expect_fail
    expect_err "^hvdrun: rank [0-9] on host node[1-4] exited with code [0-9]*; stopping the other ranks$"
    ranks_end_within 60
    expect_exits 6
    if grep -q "^node1 " "$work/exits"; then fail "node1's killed ranks recorded an exit"; fi
    ;;
pod)
    # Pod mode: no hvdrun. The standalone store runs on ctl; one rank per
    # host starts with only the store's address, the size and the token
    # (HVD_POD=1), in an order that is not the ranks', and takes its rank
    # from the store by host name.
    echo "netns-pod-$$" >"$work/token"
    B exec ctl "$bin/hvd-rendezvous" --bind 10.77.0.100 --port 29400 \
        --token-file "$work/token" >"$work/store" 2>&1 &
    store=$!
    for h in node3 node1 node4 node2; do
        (timeout 60 "$bedsh" -b "$bed" exec $h env -u HOROVOD_RANK HVD_POD=1 HOROVOD_SIZE=4 \
            HOROVOD_GLOO_RENDEZVOUS_ADDR=10.77.0.100 HOROVOD_GLOO_RENDEZVOUS_PORT=29400 \
            HVD_TOKEN="netns-pod-$$" HOROVOD_GLOO_TIMEOUT_SECONDS=20 HOROVOD_LOG_LEVEL=info \
            "$bin/hvd-bench" allreduce -b 8 -e 4M -f 8 -c 1 -n 3 -w 1 >"$work/$h" 2>&1
         echo $? >"$work/$h.rc") &
    done
    pods_end_within 60 node1 node2 node3 node4
    kill "$store" 2>/dev/null
    cat "$work"/node? >"$work/out"
    for h in 1 2 3 4; do
        [ "$(cat "$work/node$h.rc" 2>/dev/null)" = 0 ] || fail "the pod on node$h did not exit 0"
        grep -q "'node$h' is rank $((h - 1)) of 4" "$work/node$h" || fail "node$h is not rank $((h - 1))"
    done
    grep -q "^# Out of bounds values : 0 OK$" "$work/node1" || fail "rank 0 reports wrong results"
    ;;
pod_elastic)
    # An elastic pod job: hvd-rendezvous on ctl is the store and the driver;
    # one pod per host with only the store's address and the token. node3's
    # cable is pulled mid-training: its heartbeat stops, its peers fail, and
    # the other three go on in a round without it and finish.
    echo "netns-pod-$$" >"$work/token"
    B exec ctl "$bin/hvd-rendezvous" --bind 10.77.0.100 --port 29400 --token-file "$work/token" \
        --min-np 3 --np 4 --pod-timeout 3 --verbose >"$work/store" 2>&1 &
    store=$!
    for h in node1 node2 node3 node4; do
        (timeout 60 "$bedsh" -b "$bed" exec $h env HVD_POD=1 HOROVOD_ELASTIC=1 \
            HOROVOD_GLOO_RENDEZVOUS_ADDR=10.77.0.100 HOROVOD_GLOO_RENDEZVOUS_PORT=29400 \
            HVD_TOKEN="netns-pod-$$" HOROVOD_GLOO_TIMEOUT_SECONDS=5 \
            "$bin/train_elastic" --steps 400 --step-ms 10 >"$work/$h" 2>&1
         echo $? >"$work/$h.rc") &
    done
    wait_line store "store " "round 0: 4 workers on 4 hosts"
    n=0 # rank 0 prints the steps: the pod that registered first
    until cat "$work"/node? | grep -q "^step 100:"; do
        n=$((n + 1))
        [ $n -le 600 ] || fail "no pod reached step 100 within 60 s"
        sleep 0.1
    done
    B link node3 down
    wait_line store "store " "round 1: 3 workers on 3 hosts"
    pods_end_within 60 node1 node2 node4
    kill "$store" 2>/dev/null
    cat "$work"/node? "$work/store" >"$work/out"
    for h in node1 node2 node4; do
        [ "$(cat "$work/$h.rc")" = 0 ] || fail "the pod on $h did not exit 0"
    done
    grep -q "node3:0) sent no heartbeat for 3 s" "$work/store" || fail "the driver did not see node3 go"
    grep -q "^done: 400 steps, 3 workers, .*parameters identical on every rank" "$work/out" ||
        fail "the job did not finish on 3 pods with identical parameters"
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "ok ($case_name)"
