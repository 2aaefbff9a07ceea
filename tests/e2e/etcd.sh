#!/bin/sh
# Jobs whose rendezvous is in a real etcd cluster (docs/etcd.md, issue 34):
# tests/e2e/etcd.sh BIN_DIR CASE
#   static        hvdrun --rendezvous (and HVD_RENDEZVOUS) over 3 members: hvdrun
#                 serves no store, the ranks meet under PREFIX/job-<random>
#   leader        kill -9 of the etcd leader while the ranks rendezvous (two
#                 wait in watches for the third): the job finishes
#   elastic       elastic hvdrun (stand-in ssh) with etcd, a worker killed: one
#                 reset, the driver's rounds in etcd, the job finishes
#   elastic_leader  the same, the worker killed as the etcd leader is: the
#                 reset happens while the cluster elects
#   pods          three pods and two driver candidates (hvd-rendezvous
#                 --rendezvous --min-np): the leading candidate killed, the
#                 other leads from the round in etcd and resets nobody; then a
#                 pod killed: the two left finish with identical parameters
#   training      a static job loses the etcd leader, then a second member (the
#                 quorum), while it trains: it needs no store then, and finishes
#   quorum        two of three members down before the job: hvdrun fails within
#                 HOROVOD_GLOO_TIMEOUT_SECONDS with a message naming the cluster
#   auth          auth on: a wrong password, and no user, fail with the message
#                 about credentials; the right one trains
#   usage         hvd-rendezvous's etcd usage errors: one line, exit 2
# Every process runs under `timeout`; waits are for log lines, with
# deadlines. Exit 0: pass; 77: skipped (no etcd here; usage runs anyway);
# anything else: fail, with a message.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$1" && pwd)
case_name=$2
work=$(mktemp -d)
marker="hvd-etcd-$$-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
# shellcheck source=tests/etcd_cluster.sh
. "$here/../etcd_cluster.sh"
cleanup() {
    pkill -KILL -f "$marker" 2>/dev/null
    etcd_cluster_stop
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    echo "FAIL ($case_name): $*" >&2
    show
    [ -n "$etcd_dir" ] && etcd_logs
    exit 1
}
show() {
    for f in "$work"/out "$work"/err "$work"/pod* "$work"/cand*; do
        [ -s "$f" ] && sed "s|^|${f##*/}: |" "$f" | tail -n 40 >&2
    done
}
# shellcheck source=tests/e2e/expect.sh
. "$here/expect.sh"

# The programs under names that carry the marker: pgrep finds what belongs
# to this run, and the exit trap removes it.
for prog in train_mlp train_elastic hvd-rendezvous; do
    ln -s "$bin/$prog" "$work/$marker-$prog"
done
mlp="$work/$marker-train_mlp"
elastic="$work/$marker-train_elastic"
candidate="$work/$marker-hvd-rendezvous"

# start ARGS...: hvdrun in the background; finish waits for it.
start() {
    rm -f "$work/rc"
    (timeout 60 "$bin/hvdrun" "$@" >"$work/out" 2>"$work/err"
     echo $? >"$work/rc") &
    job=$!
}
finish() { wait "$job"; rc=$(cat "$work/rc"); }
run() { start "$@"; finish; }

# keys: the keys under the URL's prefix, one a line.
keys() { etcd_ctl get --prefix "$prefix/" --keys-only | sed '/^$/d'; }
has_keys() { [ "$(keys | grep -c -- "$1")" -ge "$2" ]; }
# since T: seconds from T (date +%s.%N) to now.
since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.3f", a - b }'; }

cat >"$work/fake-ssh" <<'SH'
#!/bin/sh
host=$1
shift
exec sh -c "$1"
SH
chmod +x "$work/fake-ssh"
printf '#!/bin/sh\ncat "%s/hosts"\n' "$work" >"$work/discover"
chmod +x "$work/discover"
printf '%s\n' h1 h2 h3 >"$work/hosts"
# The worker hvdrun started for host $1.
worker_on() {
    for p in $(pgrep -f "$elastic"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "HOROVOD_HOSTNAME=$1"; then
            echo "$p"
            return
        fi
    done
}
# elastic_job: 3 workers on h1..h3 that train 300 steps (about 3 s).
elastic_job() {
    start --rendezvous "$url" --host-discovery-script "$work/discover" \
        --ssh-command "$work/fake-ssh" --min-np 2 --max-np 3 -np 3 \
        "$elastic" --steps 300 --step-ms 10 --commit-every 10 --print-every 50
    wait_out "step 100:"
    victim=$(worker_on h2)
    [ -n "$victim" ] || fail "no worker on h2"
}
# elastic_done: the job went on with h1 and h3 after one reset; prints
# how long after $killed_at the survivors stepped again.
elastic_done() {
    finish
    expect_rc 0
    expect_err "worker 1 on h2\[0\] exited with code 137; blacklisting host h2"
    expect_out "start: 2 workers, from step [0-9]*0 (after 1 resets)"
    expect_out "done: 300 steps, 2 workers, 1 resets, .*parameters identical on every rank"
    # The driver's rounds are in etcd, under the job's prefix.
    has_keys "^$prefix/job-[0-9a-f]*/rank_and_size\.1/" 2 ||
        fail "no round 1 assignments under $prefix/job-*/ in etcd"
    resumed=$(sed -n 's/.*reset 1: first step [0-9]* done at \([0-9.]*\)$/\1/p' "$work/out")
    [ -n "$resumed" ] || fail "no first step after the reset"
    awk -v a="$resumed" -v b="$killed_at" 'BEGIN { printf "resumed %.3f s after the kill\n", a - b }'
    nothing_left
}

# pod NAME: an elastic pod (worker) named NAME, output in $work/NAME;
# $last is its `timeout` process.
pod() {
    env -u HOROVOD_RANK -u HOROVOD_SIZE HVD_POD=1 HOROVOD_ELASTIC=1 HOROVOD_HOSTNAME="$1" \
        HVD_RENDEZVOUS="$url" HVD_TOKEN="etcd-e2e-$$" HOROVOD_GLOO_TIMEOUT_SECONDS=10 \
        timeout 60 "$elastic" --steps 600 --step-ms 10 >"$work/$1" 2>&1 &
    last=$!
}
# cand N: driver candidate N, output in $work/candN; $last is its `timeout`.
cand() {
    timeout 60 "$candidate" --rendezvous "$url" --min-np 2 --np 3 --verbose \
        >"$work/cand$1" 2>&1 &
    last=$!
}
# wait_file FILE PATTERN: at most 60 s until FILE has a line matching PATTERN.
wait_file() {
    within 60 grep -q -- "$2" "$work/$1" || fail "no line '$2' in $1 within 60 s"
}
# expect_pod PID NAME CODE: the pod ended with CODE.
expect_pod() {
    wait "$1"
    code=$?
    [ "$code" = "$3" ] || fail "pod $2 exited with $code, expected $3"
}

case $case_name in
usage) ;;
*)
    etcd_cluster_start 3 || fail "etcd_cluster_start 3"
    prefix=/e2e-$$
    url="etcd://$(etcd_endpoints)$prefix"
    ;;
esac

case $case_name in
static)
    run --rendezvous "$url" -np 3 "$mlp" --steps 30
    expect_rc 0
    expect_out "^\[0\]<stdout>:parameters identical on all 3 ranks$"
    has_keys "^$prefix/job-[0-9a-f]\{16\}/global/[0-2]$" 3 ||
        { keys >&2; fail "the ranks' records are not under $prefix/job-<16 hex digits>/global/"; }
    if grep -q "rendezvous store on" "$work/err"; then fail "hvdrun served a store"; fi
    # The variable alone, as a user sets it: a second job, a prefix of its own.
    HVD_RENDEZVOUS=$url run -np 2 "$mlp" --steps 30
    expect_rc 0
    expect_out "^\[0\]<stdout>:parameters identical on all 2 ranks$"
    [ "$(keys | sed -n 's|^\(.*/job-[0-9a-f]*\)/global/0$|\1|p' | sort -u | wc -l)" = 2 ] ||
        { keys >&2; fail "two jobs did not get two prefixes"; }
    nothing_left
    ;;
leader)
    # Rank 2 waits for $work/go: ranks 0 and 1 write their records and
    # wait in watches for its record when the leader dies.
    # shellcheck disable=SC2016 # expanded by the rank's shell
    start --rendezvous "$url" -np 3 sh -c \
        'if [ "$HOROVOD_RANK" = 2 ]; then until [ -e "$0" ]; do sleep 0.05; done; fi; exec "$@"' \
        "$work/go" "$mlp" --steps 30
    within 30 has_keys "/global/[01]$" 2 || fail "ranks 0 and 1 did not write their records"
    leader=$(etcd_leader 30) || fail "no etcd leader"
    killed_at=$(date +%s.%N)
    etcd_kill "$leader" || fail "etcd_kill $leader"
    touch "$work/go"
    new=$(etcd_leader 30) || fail "no new etcd leader after member $leader was killed"
    echo "member $leader (the leader) killed; member $new leads $(since "$killed_at") s later"
    finish
    expect_rc 0
    expect_out "^\[0\]<stdout>:parameters identical on all 3 ranks$"
    echo "the job ended $(since "$killed_at") s after the kill"
    nothing_left
    ;;
training)
    start --rendezvous "$url" -np 3 "$mlp" --steps 20000 --print-every 500
    wait_out "^\[0\]<stdout>:step 500 "
    leader=$(etcd_leader 30) || fail "no etcd leader"
    etcd_kill "$leader" || fail "etcd_kill $leader"
    other=$(( (leader + 1) % 3 ))
    etcd_kill "$other" || fail "etcd_kill $other"
    echo "members $leader (the leader) and $other killed during training"
    finish
    expect_rc 0
    expect_out "^\[0\]<stdout>:parameters identical on all 3 ranks$"
    nothing_left
    ;;
elastic)
    elastic_job
    killed_at=$(date +%s.%N)
    kill -9 "$victim"
    elastic_done
    ;;
elastic_leader)
    elastic_job
    leader=$(etcd_leader 30) || fail "no etcd leader"
    etcd_kill "$leader" || fail "etcd_kill $leader"
    killed_at=$(date +%s.%N)
    kill -9 "$victim"
    elastic_done
    ;;
pods)
    cand 1
    c1=$last
    cand 2
    c2=$last
    # Registered out of the order of their keys in etcd (a new leader
    # reads them in key order), each once the last one is in.
    registered() { cat "$work/cand1" "$work/cand2" | grep -q "pod $1:0 registered as worker"; }
    pod pod-c
    pc=$last
    within 30 registered pod-c || fail "pod-c did not register"
    pod pod-b
    pb=$last
    within 30 registered pod-b || fail "pod-b did not register"
    pod pod-a
    pa=$last
    leads() { grep -q "leading the elastic driver" "$work/$1"; }
    either_leads() { leads cand1 || leads cand2; }
    within 30 either_leads || fail "no candidate leads"
    if leads cand1; then
        lead=$c1 first=cand1 other=cand2
    else
        lead=$c2 first=cand2 other=cand1
    fi
    wait_file "$first" "round 0: 3 workers on 3 hosts"
    leads "$other" && fail "both candidates lead"
    # The leading candidate goes: the other leads within its 2 s lease,
    # from the round in etcd, and keeps the pods' places (no reset).
    killed_at=$(date +%s.%N)
    pkill -KILL -P "$lead"
    wait_file "$other" "leading the elastic driver from round 0$"
    echo "the second candidate leads $(since "$killed_at") s after the first was killed"
    wait_file "$other" "pod pod-b:0 is worker [0-9] (admitted by the previous driver; in the latest round)"
    # The takeover alone changes no place: it announces no update.
    if grep -q "pods added\|the workers reset at their next commit" "$work/$other"; then
        fail "the new leader announced an update: a takeover would reset the workers"
    fi
    # Then a pod: the others reset without it under the new leader.
    killed_at=$(date +%s.%N)
    pkill -KILL -P "$pb"
    wait_file "$other" "round 1: 2 workers on 2 hosts"
    expect_pod "$pa" pod-a 0
    expect_pod "$pc" pod-c 0
    wait "$pb"
    grep -q "pod-b:0) sent no heartbeat for 2 s while the others reset" "$work/$other" ||
        fail "the new leader did not see pod-b go"
    cat "$work/pod-a" "$work/pod-c" >"$work/all"
    grep -q "^done: 600 steps, 2 workers, 1 resets, .*parameters identical on every rank" \
        "$work/all" || fail "the pods did not finish with identical parameters"
    resumed=$(sed -n 's/^reset 1: first step [0-9]* done at \([0-9.]*\)$/\1/p' "$work/all")
    [ -n "$resumed" ] || fail "no first step after the reset"
    awk -v a="$resumed" -v b="$killed_at" \
        'BEGIN { printf "the pods resumed %.3f s after pod-b was killed\n", a - b }'
    ;;
quorum)
    etcd_kill 1 || fail "etcd_kill 1"
    etcd_kill 2 || fail "etcd_kill 2"
    started=$(date +%s.%N)
    # --start-timeout 30: hvdrun must report the ranks' failure, not wait
    # for them to reach the store; timeout 15 is the hang bound.
    rm -f "$work/rc"
    HOROVOD_GLOO_TIMEOUT_SECONDS=3 timeout 15 "$bin/hvdrun" --rendezvous "$url" \
        --start-timeout 30 -np 2 "$mlp" --steps 30 >"$work/out" 2>"$work/err"
    rc=$?
    took=$(since "$started")
    [ "$rc" != 124 ] || fail "hvdrun still waited 15 s after the ranks' 3 s timeout"
    expect_rc 1
    expect_err "^hvdrun: rank [01] on host localhost exited with code 1; stopping the other ranks$"
    expect_err "rendezvous etcd://127\.0\.0\.1:[0-9]*,\.\.\./e2e-$$/job-[0-9a-f]*: .* within 3\.0 s"
    expect_err "check that a majority of the etcd cluster's members is up and reachable"
    if grep -q "has not reached the rendezvous store" "$work/err"; then
        fail "hvdrun blamed the start timeout"
    fi
    echo "the job failed $took s after it started (HOROVOD_GLOO_TIMEOUT_SECONDS=3)"
    ;;
auth)
    etcd_enable_auth "right-$$" || fail "etcd_enable_auth"
    HVD_ETCD_USER=root HVD_ETCD_PASSWORD="wrong-$$" HOROVOD_GLOO_TIMEOUT_SECONDS=10 \
        run --rendezvous "$url" -np 2 "$mlp" --steps 30
    expect_rc 1
    expect_err "etcdserver: authentication failed, invalid user ID or password (check HVD_ETCD_USER, HVD_ETCD_PASSWORD and the user's role)"
    if grep -q "wrong-$$" "$work/out" "$work/err"; then fail "the password was printed"; fi
    HOROVOD_GLOO_TIMEOUT_SECONDS=10 run --rendezvous "$url" -np 2 "$mlp" --steps 30
    expect_rc 1
    expect_err "HVD_ETCD_USER"
    HVD_ETCD_USER=root HVD_ETCD_PASSWORD="right-$$" run --rendezvous "$url" -np 2 "$mlp" --steps 30
    expect_rc 0
    expect_out "^\[0\]<stdout>:parameters identical on all 2 ranks$"
    nothing_left
    ;;
usage)
    url=etcd://127.0.0.1:1/e2e
    for bad in "--rendezvous $url" "--rendezvous $url --min-np 2 --port 29500" \
        "--rendezvous etcd://127.0.0.1:99999/e2e --min-np 2" "--rendezvous etcd:// --min-np 2" \
        "--rendezvous http://127.0.0.1:2379 --min-np 2"; do
        # shellcheck disable=SC2086 # the flags, split
        timeout 10 "$candidate" $bad >"$work/out" 2>&1
        code=$?
        [ "$code" = 2 ] || fail "hvd-rendezvous $bad exited with $code, expected 2"
        [ "$(wc -l <"$work/out")" = 1 ] || fail "hvd-rendezvous $bad: not one line"
        grep -q "^hvd-rendezvous: .* (see hvd-rendezvous --help)$" "$work/out" ||
            fail "hvd-rendezvous $bad: no usage message"
    done
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "ok ($case_name)"
