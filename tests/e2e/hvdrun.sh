#!/bin/sh
# End-to-end tests of hvdrun: tests/e2e/hvdrun.sh BIN_DIR CASE
# Each case runs real jobs through hvdrun and checks what a user would see.
# Every hvdrun runs under `timeout`, so a hang fails the case instead of
# stalling the suite. Exit 0: pass; anything else: fail (with a message).
set -u
bin=$1
case_name=$2
work=$(mktemp -d)
marker="hvd-e2e-$$-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
trap 'pkill -KILL -f "$marker" 2>/dev/null; rm -rf "$work"' EXIT

fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }
# shellcheck source=tests/e2e/expect.sh
. "$(dirname "$0")/expect.sh" # nothing_left, wait_line; the assertions below show more
run() { timeout 120 "$bin/hvdrun" "$@" >"$work/out" 2>"$work/err"; echo $? >"$work/rc"; }
rc() { cat "$work/rc"; }
expect_rc() { [ "$(rc)" = "$1" ] || { cat "$work/out" "$work/err" >&2; fail "exit code $(rc), expected $1"; }; }
expect_out() { grep -q -- "$1" "$work/out" || { cat "$work/out" >&2; fail "stdout lacks '$1'"; }; }
expect_err() { grep -q -- "$1" "$work/err" || { cat "$work/err" >&2; fail "stderr lacks '$1'"; }; }

# A sleep whose name carries the marker, so that pgrep finds what is left.
sleeper="$work/$marker-sleep"
ln -s "$(command -v sleep)" "$sleeper"

# A stand-in for ssh: runs the remote command on this machine.
cat >"$work/fake-ssh" <<'SH'
#!/bin/sh
host=$1
shift
exec sh -c "$1"
SH
chmod +x "$work/fake-ssh"

case $case_name in
environment)
    run -np 3 -x E2E_X=exported sh -c 'echo "rank=$HOROVOD_RANK size=$HOROVOD_SIZE local=$HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE cross=$HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE host=$HOROVOD_HOSTNAME store=$HOROVOD_GLOO_RENDEZVOUS_ADDR:$HOROVOD_GLOO_RENDEZVOUS_PORT token=${#HVD_TOKEN} x=$E2E_X"'
    expect_rc 0
    for r in 0 1 2; do
        expect_out "^\[$r\]<stdout>:rank=$r size=3 local=$r/3 cross=0/1 host=localhost store=127.0.0.1:[0-9]* token=48 x=exported$"
    done
    ;;
hosts)
    # Two host names that only the stand-in remote shell knows: real local
    # and cross rings, ranks assigned host by host.
    run -H e2e-host-a:2,e2e-host-b:1 --ssh-command "$work/fake-ssh" --verbose sh -c 'echo "rank=$HOROVOD_RANK host=$HOROVOD_HOSTNAME local=$HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE cross=$HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE dir=$(pwd) token=${#HVD_TOKEN}"'
    expect_rc 0
    expect_out "^\[0\]<stdout>:rank=0 host=e2e-host-a local=0/2 cross=0/2 dir=$(pwd) token=48$"
    expect_out "^\[1\]<stdout>:rank=1 host=e2e-host-a local=1/2 cross=0/1 dir=.* token=48$"
    expect_out "^\[2\]<stdout>:rank=2 host=e2e-host-b local=0/1 cross=1/2 dir=.* token=48$"
    # The remote command lines (--verbose prints them) do not carry the
    # token: every user of both hosts could read it with ps.
    expect_err "exec env .*hvdrun-rank"
    if grep -q "HVD_TOKEN=" "$work/err"; then fail "a remote command line carries HVD_TOKEN"; fi
    run -H e2e-host-a:2,e2e-host-b:2 --ssh-command "$work/fake-ssh" --hierarchical-allreduce \
        "$bin/hvd-bench" allreduce -b 8 -e 1M -f 32 -c 1
    expect_rc 0
    expect_out "Out of bounds values : 0 OK"
    ;;
output)
    run -np 2 sh -c 'printf "one\rtwo\r\nthree"; echo oops >&2'
    expect_rc 0
    for r in 0 1; do
        for w in one two three; do expect_out "^\[$r\]<stdout>:$w$"; done
        expect_err "^\[$r\]<stderr>:oops$"
    done
    run -np 1 --disable-output-prefix --output-filename "$work/logs" sh -c 'echo plain; echo bad >&2'
    expect_rc 0
    expect_out "^plain$"
    [ "$(cat "$work/logs/rank.0/stdout")" = plain ] || fail "rank.0/stdout: $(cat "$work/logs/rank.0/stdout")"
    [ "$(cat "$work/logs/rank.0/stderr")" = bad ] || fail "rank.0/stderr"
    ;;
failure)
    start=$(date +%s)
    run -np 3 sh -c "test \$HOROVOD_RANK = 1 && exit 7; exec $sleeper 60"
    took=$(( $(date +%s) - start ))
    expect_rc 7
    expect_err "rank 1 on host localhost exited with code 7"
    [ "$took" -lt 15 ] || fail "took $took s"
    nothing_left
    # A rank killed by a signal: 128 + the signal.
    run -np 2 sh -c "test \$HOROVOD_RANK = 0 && kill -KILL \$\$; exec $sleeper 60"
    expect_rc 137
    expect_err "rank 0 on host localhost was killed by signal 9"
    nothing_left
    # A command that does not exist.
    run -np 2 ./no-such-program-here
    expect_rc 127
    expect_err "cannot run ./no-such-program-here"
    ;;
frozen)
    # A rank stops (SIGSTOP) in the middle of allreduces: the others time
    # out, and hvdrun's last lines name the stopped rank, not only the
    # first rank that gave up.
    "$bin/hvdrun" -np 3 --log-level info --gloo-timeout-seconds 3 "$bin/hvd-bench" allreduce \
        -b 64K -e 64K -n 10000000 -w 1 -c 0 >"$work/out" 2>"$work/err" &
    pid=$!
    victim=
    for _ in $(seq 100); do
        for p in $(pgrep -f "hvd-bench allreduce"); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "HOROVOD_RANK=2"; then
                victim=$p
            fi
        done
        [ -n "$victim" ] && break
        sleep 0.1
    done
    [ -n "$victim" ] || fail "no rank 2"
    # In the middle of allreduces: rank 2 has met the others in its first.
    wait_line err "stderr " "^\[2\]<stderr>:.*communicator global: 3 ranks on host"
    kill -STOP "$victim"
    wait $pid
    code=$?
    [ $code != 0 ] || fail "hvdrun exited with 0 with a rank stopped"
    expect_err "timed out waiting for rank 2 on host localhost"
    if grep -q "timed out waiting for rank [01] " "$work/err"; then
        fail "hvdrun blamed a rank that was itself waiting"
    fi
    gone() { ! kill -0 "$1" 2>/dev/null; }
    within 10 gone "$victim" || fail "the stopped rank outlived hvdrun by 10 s"
    ;;
signal)
    # SIGTERM to hvdrun stops ranks that ignore SIGTERM, after the grace period.
    timeout 60 "$bin/hvdrun" -np 2 sh -c "trap '' TERM; $sleeper 60; true" >"$work/out" 2>"$work/err" &
    pid=$!
    for _ in $(seq 100); do [ "$(pgrep -cf "^$sleeper 60")" -ge 2 ] && break; sleep 0.1; done
    kill -TERM $pid
    wait $pid
    code=$?
    [ $code = 143 ] || fail "hvdrun exited with $code after SIGTERM, expected 143"
    expect_err "stopping the job"
    nothing_left
    # hvdrun killed outright: its local ranks go with it.
    "$bin/hvdrun" -np 2 "$sleeper" 60 >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ "$(pgrep -cf "^$sleeper 60")" -ge 2 ] && break; sleep 0.1; done
    kill -KILL $pid
    wait $pid 2>/dev/null
    nothing_left
    ;;
start_timeout)
    run -np 2 --start-timeout 1 sh -c "exec $sleeper 60"
    expect_rc 1
    expect_err "rank 0 on host localhost has not reached the rendezvous store within 1 s"
    expect_err "rank 1 on host localhost has not reached"
    nothing_left
    ;;
usage)
    for args in "-np 0 true" "-H a:0 true" "-np 5 -H a:2,b:2 true" "--bogus true" "-np 2" \
        "-cb -H a:x"; do
        # shellcheck disable=SC2086
        run $args
        expect_rc 2
        [ "$(wc -l <"$work/err")" = 1 ] || fail "'$args': not one line: $(cat "$work/err")"
    done
    run --help
    expect_rc 0
    expect_out "--ssh-command"
    ;;
python)
    # hvd's Python package first on every rank's PYTHONPATH, after its
    # horovod compatibility tree with --horovod-compat, the user's after
    # them; the same for remote ranks, on their env line.
    py=$(cd "$bin/../lib/hvd/python" && pwd -P)
    show='echo "$PYTHONPATH ${HVD_HOROVOD_COMPAT-unset}"'
    (unset PYTHONPATH; run -np 2 --horovod-compat sh -c "$show")
    expect_rc 0
    for r in 0 1; do expect_out "^\[$r\]<stdout>:$py/compat:$py 1$"; done
    (export PYTHONPATH=/e2e/user:/e2e/more; run -np 2 --horovod-compat sh -c "$show")
    expect_rc 0
    for r in 0 1; do expect_out "^\[$r\]<stdout>:$py/compat:$py:/e2e/user:/e2e/more 1$"; done
    (export PYTHONPATH=; run -np 1 --gloo sh -c "$show")
    expect_rc 0
    expect_out "^\[0\]<stdout>:$py unset$"
    (export PYTHONPATH=/e2e/user; run -H e2e-host-a:1 --ssh-command "$work/fake-ssh" \
        --horovod-compat sh -c "$show")
    expect_rc 0
    expect_out "^\[0\]<stdout>:$py/compat:$py:/e2e/user 1$"
    # Python itself resolves `hvd` there (found, not imported).
    if [ -x /usr/bin/python3 ]; then
        (unset PYTHONPATH; run -np 1 /usr/bin/python3 -c \
            'import importlib.util; print(importlib.util.find_spec("hvd").submodule_search_locations[0])')
        expect_rc 0
        expect_out "^\[0\]<stdout>:$py/hvd$"
    fi
    run -np 2 --mpi sh -c "$show"
    expect_rc 2
    expect_err "^hvdrun: --mpi: hvd has no MPI; drop --mpi"
    [ "$(wc -l <"$work/err")" = 1 ] || fail "--mpi: not one line: $(cat "$work/err")"
    [ ! -s "$work/out" ] || fail "--mpi: a rank ran: $(cat "$work/out")"
    ;;
horovodrun_flags)
    # horovodrun's spellings: every --network-interface(s) in one list (each
    # name once), --tcp (no shared memory, NCCL off InfiniBand),
    # --thread-affinity, --num-nccl-streams 1, --no-log-hide-timestamp.
    run -np 2 --network-interface lo --network-interfaces lo,e2e0 --tcp --thread-affinity 0,0 \
        --num-nccl-streams 1 --no-log-hide-timestamp sh -c 'echo "$HOROVOD_GLOO_IFACE" \
        "$NCCL_SOCKET_IFNAME shm=$HVD_SHM ib=$NCCL_IB_DISABLE cores=$HOROVOD_THREAD_AFFINITY" \
        "hide=$HOROVOD_LOG_HIDE_TIME"'
    expect_rc 0
    for r in 0 1; do expect_out "^\[$r\]<stdout>:lo,e2e0 lo,e2e0 shm=0 ib=1 cores=0,0 hide=0$"; done
    [ ! -s "$work/err" ] || fail "warnings: $(cat "$work/err")"
    # Real jobs: with --tcp the ranks' collectives stay off shared memory,
    # which they take without it; pinned threads and the loopback interface.
    bench() { run -np 2 --log-level info --thread-affinity 0,0 --network-interface lo "$@" \
        "$bin/hvd-bench" allreduce -b 8 -e 64K -f 4 -c 1; }
    bench
    expect_rc 0
    expect_out "Out of bounds values : 0 OK"
    expect_err "communicator global: 2 ranks on host .*: shared memory"
    bench --tcp
    expect_rc 0
    expect_out "Out of bounds values : 0 OK"
    if grep "shared memory" "$work/err"; then fail "--tcp: a communicator in shared memory"; fi
    # Another NCCL stream count runs, with one warning line.
    run -np 1 --num-nccl-streams 2 true
    expect_rc 0
    expect_err "^hvdrun: warning: --num-nccl-streams 2 changes nothing"
    [ "$(wc -l <"$work/err")" = 1 ] || fail "--num-nccl-streams 2: $(cat "$work/err")"
    ;;
example)
    run -np 4 "$bin/train_mlp" --expect-loss-below 0.3
    expect_rc 0
    expect_out "^\[0\]<stdout>:initial loss 0\.[67]"
    expect_out "^\[0\]<stdout>:parameters identical on all 4 ranks$"
    ;;
bench)
    run -np 4 "$bin/hvd-bench" -b 8 -e 64M -f 4 -c 1
    expect_rc 0
    expect_out "Out of bounds values : 0 OK"
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "ok ($case_name)"
