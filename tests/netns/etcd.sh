#!/bin/sh
# An elastic pod job with its rendezvous in etcd, on a bed of network
# namespaces (issue 34's Done-when): tests/netns/etcd.sh BIN_DIR CASE
#   pods_etcd   4 pods on node1..node4, each its worker (train_elastic,
#               HVD_POD=1) and its own driver candidate (hvd-rendezvous
#               --rendezvous --min-np); a 3-member etcd cluster on node1..node3
#               (10.77.0.1-3, reached by every host over the bed's switch).
#               In order: kill -9 of the etcd leader, of a worker, and of the
#               pod that runs the elastic driver (its candidate and its
#               worker). The two pods left finish with identical parameters.
#               Prints each recovery: for the etcd leader, from its kill to the
#               new leader's election (etcd's log) and from there to the first
#               write the cluster then commits (a watch from ctl); for the
#               others, from the kill to the survivors' first step after it
#               (train_elastic's "reset N: first step S done at T"). No timing
#               is asserted.
#   partition   3 pods on node1..node3 (worker and candidate each), etcd on
#               node2..node4; node4's cable pulled (its member cut off, the
#               others keep the quorum), then a worker killed: the others
#               reset through the two members left and, the cable back, the
#               two pods finish with identical parameters.
# The bed is made and removed by the case, on every exit path (bed.sh up 4).
# Exit 0: pass; 77: skipped (no namespaces here, or no etcd); anything
# else: fail (with a message).
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
# shellcheck source=tests/etcd_cluster.sh
. "$here/../etcd_cluster.sh"
procs= # the `timeout` of every process started here
cleanup() {
    for p in $procs; do
        pkill -KILL -P "$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
    done
    etcd_cluster_stop
    "$bedsh" -b "$bed" down
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    echo "FAIL ($case_name): $*" >&2
    for f in "$work"/*.worker "$work"/*.cand; do
        [ -s "$f" ] && grep -v '^step ' "$f" | tail -n 30 | sed "s|^|${f##*/}: |" >&2
    done
    [ -n "$etcd_dir" ] && etcd_logs 2>&1 | grep -v '"level":"\(info\|debug\)"' >&2
    exit 1
}
B() { "$bedsh" -b "$bed" "$@"; }
# within SECONDS COMMAND...
# shellcheck source=tests/e2e/expect.sh
. "$here/../e2e/expect.sh"
# seconds A B: B - A, printed with 3 decimals.
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

"$bedsh" down --stale # beds of runs that were killed before their trap ran
B up 4 --owner $$ >/dev/null 2>"$work/up" || { cat "$work/up" >&2; fail "bed.sh up 4"; }

case $case_name in
pods_etcd)
    member_nodes="1 2 3" pod_nodes="node1 node2 node3 node4" np=4
    ;;
partition)
    member_nodes="2 3 4" pod_nodes="node1 node2 node3" np=3
    ;;
*) fail "unknown case" ;;
esac

# ==== etcd on three of the nodes ============================================
i=0
for n in $member_nodes; do
    etcd_member_at "$i" "10.77.0.$n" "$bedsh" -b "$bed" exec "node$n"
    i=$((i + 1))
done
etcd_client_via "$bedsh" -b "$bed" exec ctl
etcd_cluster_start 3 || fail "etcd_cluster_start 3 on node1..node3"
prefix=/netns-$$
url="etcd://$(etcd_endpoints)$prefix"

# ==== the pods ===============================================================
steps=800
for h in $pod_nodes; do
    timeout 90 "$bedsh" -b "$bed" exec "$h" "$bin/hvd-rendezvous" --rendezvous "$url" \
        --min-np 2 --np $np --verbose >"$work/$h.cand" 2>&1 &
    eval "cand_$h=\$!"
    procs="$procs $!"
    timeout 90 "$bedsh" -b "$bed" exec "$h" env HVD_POD=1 HOROVOD_ELASTIC=1 \
        HVD_RENDEZVOUS="$url" HVD_TOKEN="netns-etcd-$$" HOROVOD_GLOO_TIMEOUT_SECONDS=10 \
        "$bin/train_elastic" --steps $steps --step-ms 10 >"$work/$h.worker" 2>&1 &
    eval "worker_$h=\$!"
    procs="$procs $!"
done
cand_of() { eval "echo \$cand_$1"; }
worker_of() { eval "echo \$worker_$1"; }
# The program a pod's `timeout` runs (bed.sh exec ends in an exec of it).
child_of() { pgrep -P "$1"; }

in_cands() { cat "$work"/*.cand | grep -q -- "$1"; }
in_workers() { cat "$work"/*.worker | grep -q -- "$1"; }
within 60 in_cands "round 0: $np workers on $np hosts" || fail "no round 0 of $np pods within 60 s"
within 60 in_workers "^step 100:" || fail "no step 100 within 60 s"
# The node whose candidate leads: the leader key's value is its HOST:PID.
driver_node() { etcd_ctl get "$prefix/elastic_driver/leader" --print-value-only | sed -n 's/:.*//p'; }
# first_step_after T: the time of the survivors' first step of a reset
# that came after T (rank 0 prints it; which pod is rank 0 may change).
first_step_after() {
    cat "$work"/*.worker | sed -n 's/^reset [0-9]*: first step [0-9]* done at \([0-9.]*\)$/\1/p' |
        awk -v t="$1" '$1 > t' | sort -n | head -n 1
}
stepped_after() { [ -n "$(first_step_after "$1")" ]; }
job_running() { ! in_workers "^done: "; }
# kill_a_worker: kill -9 of the worker of a pod that does not drive ($victim),
# at $killed; fails unless the survivors step within 60 s.
kill_a_worker() {
    d=$(driver_node)
    [ -n "$d" ] || fail "no elastic driver leads (no $prefix/elastic_driver/leader)"
    for h in $pod_nodes; do
        [ "$h" != "$d" ] && victim=$h && break
    done
    pid=$(child_of "$(worker_of "$victim")")
    [ -n "$pid" ] || fail "the worker of $victim is not running"
    job_running || fail "the job ended before the worker was killed (raise --steps)"
    killed=$(date +%s.%N)
    kill -KILL "$pid"
    within 60 stepped_after "$killed" || fail "no step within 60 s of killing the worker of $victim"
}
# two_finish GONE...: the pods but those on the hosts GONE exit 0, and the
# job ends on 2 pods with identical parameters.
two_finish() {
    for h in $pod_nodes; do
        case " $* " in *" $h "*) continue ;; esac
        wait "$(worker_of "$h")"
        code=$?
        [ "$code" = 0 ] || fail "the worker of $h exited with $code"
    done
    cat "$work"/*.worker >"$work/all"
    grep -q "^done: $steps steps, 2 workers, [0-9]* resets, .*parameters identical on every rank" \
        "$work/all" || fail "the job did not finish on 2 pods with identical parameters"
}

if [ "$case_name" = partition ]; then
    # ==== node4's cable pulled: its member is cut off =========================
    B link node4 down || fail "bed.sh link node4 down"
    cut_at=$(date +%s.%N)
    kill_a_worker
    r=$(seconds "$killed" "$(first_step_after "$killed")")
    B link node4 up || fail "bed.sh link node4 up"
    two_finish "$victim"
    echo "node4 (an etcd member) cut off; $(seconds "$cut_at" "$killed") s later the worker" \
        "on $victim killed; the survivors stepped $r s after the kill"
    echo "ok ($case_name)"
    exit 0
fi

# ==== 1: kill -9 of the etcd leader ========================================
leader=$(etcd_leader 30) || fail "no etcd leader"
watched=$(((leader + 1) % 3)) # a member that stays
# Every response of a watch of the job's keys (on the host of the member
# it asks), stamped when it arrives.
etcd_ctl_member "$watched" watch --prefix "$prefix/" -w json 2>/dev/null |
    while IFS= read -r _; do date +%s.%N; done >"$work/writes" &
watcher=$!
watch_started() { [ -s "$work/writes" ]; } # pods beat every second
within 30 watch_started || fail "the watch of $prefix/ saw no write within 30 s"
job_running || fail "the job ended before the etcd leader was killed (raise --steps)"
killed1=$(date +%s.%N)
etcd_kill "$leader" || fail "etcd_kill $leader"
new=$(etcd_leader 30) || fail "no new etcd leader within 30 s of killing member $leader"
# The election's time, from the new leader's log ("became leader at term").
ts=$(grep -h '"msg":"[0-9a-f]* became leader at term' "$etcd_dir/m$new.log" | tail -n 1 |
    sed 's/.*"ts":"\([^"]*\)".*/\1/')
elected=$(date -d "$ts" +%s.%N 2>/dev/null) || fail "no election time in member $new's log"
committed_after() { awk -v t="$elected" '$1 > t { found = 1 } END { exit !found }' "$work/writes"; }
within 30 committed_after || fail "no write reached etcd within 30 s of the new leader"
first_write=$(awk -v t="$elected" '$1 > t { print; exit }' "$work/writes")
pkill -P "$watcher" 2>/dev/null
kill "$watcher" 2>/dev/null
r1_elect=$(seconds "$killed1" "$elected")
r1_write=$(seconds "$elected" "$first_write")

# ==== 2: kill -9 of a worker (not in the driver's pod) =====================
kill_a_worker
r2=$(seconds "$killed" "$(first_step_after "$killed")")

# ==== 3: kill -9 of the pod that runs the driver ============================
d=$(driver_node)
[ -n "$d" ] || fail "no elastic driver leads (no $prefix/elastic_driver/leader)"
[ "$d" != "$victim" ] || fail "the driver moved to $victim, whose worker is gone"
pod_pids="$(child_of "$(cand_of "$d")") $(child_of "$(worker_of "$d")")"
# shellcheck disable=SC2086 # the pids, one a word
set -- $pod_pids
[ $# = 2 ] || fail "the pod on $d is not whole: '$pod_pids'"
job_running || fail "the job ended before the driver's pod was killed (raise --steps)"
killed3=$(date +%s.%N)
# shellcheck disable=SC2086 # two pids
kill -KILL $pod_pids
others_lead() {
    for h in node1 node2 node3 node4; do
        [ "$h" = "$d" ] && continue
        grep -q "leading the elastic driver from round [0-9]" "$work/$h.cand" && return 0
    done
    return 1
}
within 60 others_lead || fail "no other candidate leads within 60 s of killing the pod on $d"
within 60 stepped_after "$killed3" || fail "no step within 60 s of killing the pod on $d"
r3=$(seconds "$killed3" "$(first_step_after "$killed3")")

# ==== the end ===============================================================
two_finish "$victim" "$d"
grep -q "leading the elastic driver from round [0-9]" "$work"/*.cand ||
    fail "no candidate took over"
echo "recovery, kill -9 of the etcd leader (member $leader on node$((leader + 1))):" \
    "member $new elected $r1_elect s after the kill; first write committed $r1_write s after that"
echo "recovery, kill -9 of the worker on $victim: the survivors stepped $r2 s after the kill"
echo "recovery, kill -9 of the driver's pod on $d: the survivors stepped $r3 s after the kill"
echo "ok ($case_name)"
