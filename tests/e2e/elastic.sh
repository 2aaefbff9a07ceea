#!/bin/sh
# End-to-end tests of elastic jobs: tests/e2e/elastic.sh BIN_DIR CASE
# Jobs run through `hvdrun --host-discovery-script`, on host names that only
# a stand-in remote shell knows (it runs the command on this machine), with
# a discovery script that prints a file the test rewrites. The worker is
# examples/train_elastic. Every hvdrun runs under `timeout`, so a hang fails
# the case. Exit 0: pass; anything else: fail (with a message).
set -u
bin=$(cd "$1" && pwd)
case_name=$2
work=$(mktemp -d)
marker="hvd-elastic-$$-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
trap 'pkill -KILL -f "$marker" 2>/dev/null; rm -rf "$work"' EXIT

fail() { echo "FAIL ($case_name): $*" >&2; show; exit 1; }
show() { cat "$work/out" "$work/err" >&2 2>/dev/null; }

# The worker under a name that carries the marker, so that pkill and the
# checks below find what belongs to this test.
trainer="$work/$marker-train"
ln -s "$bin/train_elastic" "$trainer"
sleeper="$work/$marker-sleep"
ln -s "$(command -v sleep)" "$sleeper"

cat >"$work/fake-ssh" <<'SH'
#!/bin/sh
host=$1
shift
exec sh -c "$1"
SH
chmod +x "$work/fake-ssh"
printf '#!/bin/sh\ncat "%s/hosts"\n' "$work" >"$work/discover"
chmod +x "$work/discover"
hosts() { printf '%s\n' "$@" >"$work/hosts.new" && mv "$work/hosts.new" "$work/hosts"; }

# start ARGS...: hvdrun in the background; finish waits for it.
# HVD_TEST_RENDEZVOUS=etcd://...: the job keeps its rendezvous there
# (bench/elastic_reset.sh compares the two stores).
start() {
    (timeout 120 "$bin/hvdrun" --host-discovery-script "$work/discover" \
        ${HVD_TEST_RENDEZVOUS:+--rendezvous "$HVD_TEST_RENDEZVOUS"} \
        --ssh-command "$work/fake-ssh" "$@" >"$work/out" 2>"$work/err"
     echo $? >"$work/rc") &
    job=$!
}
finish() { wait "$job"; rc=$(cat "$work/rc"); }
# shellcheck source=tests/e2e/expect.sh
. "$(dirname "$0")/expect.sh"
# The pid of the worker started for host $1.
worker_on() {
    for p in $(pgrep -f "$marker-train"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "HOROVOD_HOSTNAME=$1"; then
            echo "$p"
            return
        fi
    done
}
kill_worker() {
    victim=$(worker_on "$1")
    [ -n "$victim" ] || fail "no worker on $1"
    killed_at=$(date +%s.%N)
    kill -9 "$victim"
}
# GET from the job's store, with the address and token a worker of host $1 got.
store_get() {
    p=$(worker_on "$1")
    [ -n "$p" ] || fail "no worker on $1"
    envs=$(tr '\0' '\n' <"/proc/$p/environ")
    var() { echo "$envs" | sed -n "s/^$1=//p"; }
    curl -s --max-time 30 -H "Authorization: Bearer $(var HVD_TOKEN)" \
        "http://$(var HOROVOD_GLOO_RENDEZVOUS_ADDR):$(var HOROVOD_GLOO_RENDEZVOUS_PORT)$2"
}

train="$trainer --steps 400 --step-ms 10 --commit-every 10 --print-every 50"

case $case_name in
kill)
    # kill -9 of one of 4 workers: the others resume from the last commit.
    hosts h1 h2 h3 h4
    start --min-np 2 --max-np 4 -np 4 $train
    wait_out "step 100:"
    kill_worker h2
    finish
    expect_rc 0
    expect_err "worker 1 on h2\[0\] exited with code 137; blacklisting host h2"
    expect_out "start: 3 workers, from step [0-9]*0 (after 1 resets)"
    expect_out "done: 400 steps, 3 workers, 1 resets, .*parameters identical on every rank"
    resumed=$(sed -n 's/.*reset 1: first step [0-9]* done at \([0-9.]*\)$/\1/p' "$work/out")
    [ -n "$resumed" ] || fail "no first step after the reset"
    awk -v a="$resumed" -v b="$killed_at" 'BEGIN { printf "resumed %.3f s after the kill\n", a - b }'
    nothing_left
    ;;
kill_two)
    # kill -9 of one of 5 workers, then of another while the survivors build
    # the next round's rings. They must give that round up at once, not
    # after the transport timeout (200 s here, so a wait for it fails the
    # case by the 120 s limit).
    hosts h1 h2 h3 h4 h5
    start --min-np 2 --max-np 5 -np 5 --gloo-timeout-seconds 200 $train
    wait_out "step 100:"
    # The worker that becomes rank 1 of round 1 is stopped as soon as its
    # record for that round is in the store (it names the pid), so that it
    # dies inside the new round's bootstrap, the others waiting for its
    # connections, not before or after it. The long-poll starts before the
    # first kill.
    (rec=$(store_get h1 "/g1.global/1?wait=30000")
     pid=$(echo "$rec" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
     [ -n "$pid" ] && kill -STOP "$pid"
     echo "$pid" >"$work/victim") &
    poller=$!
    sleep 0.2
    kill_worker h2
    wait "$poller"
    victim=$(cat "$work/victim")
    [ -n "$victim" ] || fail "no record of rank 1 in round 1"
    # Every survivor of the first kill is in the round's bootstrap (its
    # record is in), waiting for the stopped one.
    store_get h1 "/g1.global?count=4&wait=30000" >/dev/null
    killed_at=$(date +%s.%N)
    kill -9 "$victim"
    finish
    expect_rc 0
    expect_out "done: 400 steps, 3 workers, [0-9]* resets, .*parameters identical on every rank"
    resumed=$(sed -n 's/.*reset [0-9]*: first step [0-9]* done at \([0-9.]*\)$/\1/p' "$work/out" | tail -1)
    [ -n "$resumed" ] || fail "no first step after the resets"
    awk -v a="$resumed" -v b="$killed_at" 'BEGIN { printf "resumed %.3f s after the second kill\n", a - b }'
    nothing_left
    ;;
kill_five)
    # Five of 7 workers killed one after another, 0.02 to 0.4 s apart, so
    # that kills land while the survivors rebuild: the job goes on with 2.
    # Prints how long after each kill the next step completed.
    hosts h1 h2 h3 h4 h5 h6 h7
    start --min-np 2 --max-np 7 -np 7 --gloo-timeout-seconds 200 $train
    wait_out "step 100:"
    : >"$work/kills"
    for h in h2 h3 h4 h5 h6; do
        v=$(worker_on $h)
        [ -n "$v" ] || fail "no worker on $h"
        date +%s.%N >>"$work/kills"
        kill -9 "$v"
        sleep "$(awk -v r="$(od -An -N2 -tu2 /dev/urandom)" 'BEGIN { printf "%.3f", 0.02 + 0.38 * r / 65535 }')"
    done
    finish
    expect_rc 0
    expect_out "done: 400 steps, 2 workers, [0-9]* resets, .*parameters identical on every rank"
    sed -n 's/.*reset [0-9]*: first step [0-9]* done at \([0-9.]*\)$/\1/p' "$work/out" >"$work/steps"
    # For each kill, the first step after it of a round that began anew
    # (which may be a round begun before the kill, if it had not noticed);
    # for the last kill, the first step of the last round.
    awk 'NR == FNR { step[NR] = $1; n = NR; next }
         { for (i = 1; i <= n; i++) if (step[i] > $1) { printf "%.3f ", step[i] - $1; break } }
         END { printf "\n" }' "$work/steps" "$work/kills" | sed 's/^/a new round stepped after each kill (s): /'
    awk -v a="$(tail -1 "$work/steps")" -v b="$(tail -1 "$work/kills")" \
        'BEGIN { printf "resumed %.3f s after the last kill\n", a - b }'
    nothing_left
    ;;
scale_up)
    # 2 workers, then the discovery script lists 4 hosts: 2 more join
    # without restarting the first two, and receive the state.
    hosts h1 h2
    start --min-np 2 --max-np 4 -np 2 --verbose $train
    wait_out "step 50:"
    hosts h1 h2 h3 h4
    wait_out "start: 4 workers"
    # Horovod's answer for a slot: rank,size,local_rank,local_size,cross_rank,cross_size.
    answer=$(store_get h1 /rank_and_size/h3:0)
    [ "$answer" = "2,4,0,1,2,4" ] || fail "GET /rank_and_size/h3:0 answered '$answer'"
    finish
    expect_rc 0
    expect_err "hosts added"
    expect_out "start: 4 workers, from step [0-9]*0 (after 1 resets)"
    expect_out "done: 400 steps, 4 workers, 1 resets, .*parameters identical on every rank"
    started=$(grep -c "^hvdrun: worker [0-9]* started on" "$work/err")
    [ "$started" = 4 ] || fail "$started workers started; 2, then 2 more, expected"
    nothing_left
    ;;
remove)
    # A host leaves the discovery: its worker is told and exits 0.
    hosts h1 h2 h3
    start --min-np 2 --max-np 4 -np 3 $train
    wait_out "step 50:"
    hosts h1 h3
    finish
    expect_rc 0
    expect_err "hosts removed"
    expect_out "^\[1\]<stdout>:train_elastic: this worker was removed from the job"
    expect_out "done: 400 steps, 2 workers, 1 resets, .*parameters identical on every rank"
    nothing_left
    ;;
all_fail)
    hosts h1 h2
    start --min-np 1 -np 2 sh -c "exit 3" "$marker"
    finish
    expect_rc 3
    expect_err "every worker has failed"
    nothing_left
    ;;
min_np_timeout)
    # One of two hosts fails; --min-np 2 cannot be met for the timeout.
    hosts h1 h2
    start --min-np 2 -np 2 --elastic-timeout 3 $train
    wait_out "step 50:"
    kill_worker h2
    finish
    [ "$rc" != 0 ] || fail "exit code 0 for a job below --min-np"
    expect_err "timed out after 3 s (--elastic-timeout) waiting for at least 2 slots; 1 are available"
    nothing_left
    ;;
reset_limit)
    hosts h1 h2 h3 h4
    start --min-np 1 -np 4 --reset-limit 1 $train
    wait_out "step 50:"
    kill_worker h2
    wait_out "start: 3 workers"
    kill_worker h3
    finish
    [ "$rc" != 0 ] || fail "exit code 0 past the reset limit"
    expect_err "the job has reset 1 times, the limit (--reset-limit 1)"
    nothing_left
    ;;
signal)
    # SIGTERM to hvdrun stops the job; what a worker started and what
    # ignores SIGTERM goes too.
    hosts h1 h2
    start --min-np 2 -np 2 sh -c 'trap "" TERM; "$0" 100 & wait; "$0" 100' "$sleeper"
    wait_out_err "round 0:"
    children() { [ "$(pgrep -cf "^$sleeper 100")" -ge 2 ]; }
    within 60 children || fail "the workers did not start their children within 60 s"
    pkill -TERM -f "hvdrun --host-discovery-script $work/discover"
    finish
    expect_rc 143
    expect_err "got Terminated; stopping the job"
    nothing_left
    ;;
usage)
    # Elastic flags are checked before anything starts.
    start --min-np 3 -np 2 true
    finish
    expect_rc 2
    expect_err "min-np"
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "ok ($case_name)"
