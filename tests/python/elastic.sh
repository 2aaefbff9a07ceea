#!/bin/bash
# End-to-end tests of elastic training from Python:
#   tests/python/elastic.sh BIN_DIR [CASE...]     (cases: kill remove add; default all)
# Each case runs examples/pytorch/train_elastic.py in an elastic job,
# `hvdrun --host-discovery-script`, on host names h1, h2, ... that only a
# stand-in remote shell knows (it runs the command on this machine): a
# failure takes its whole host out, so every worker needs a host of its own
# for the job to survive one. The discovery script prints a file the test
# rewrites. Every hvdrun runs under `timeout`, every wait has a deadline.
# Exit 0: every case passed; 1: one failed (with the job's output); 2: an
# unknown case; 77 (ctest's "skipped"): see python_env.sh.
set -eu

bin=$(cd "$1" && pwd)
shift
cases=${*:-kill remove add}
here=$(cd "$(dirname "$0")" && pwd)
example="$here/../../examples/pytorch/train_elastic.py"
build=$(dirname "$bin")
. "$here/python_env.sh" # skips without torch; preloads ASan for an ASan build
python=$PYTHON

work=$(mktemp -d)
# A name that only this run's workers carry in their command line.
marker="hvd-pyelastic-$$-$RANDOM$RANDOM"

# The pids of this run's processes still alive (found by the marker).
leftovers() { pgrep -f "$marker" || true; }

cleanup() {
    local left
    left=$(leftovers)
    if [ -n "$left" ]; then
        # shellcheck disable=SC2086
        kill $left 2>/dev/null || true # hvdrun stops its job on SIGTERM
        sleep 2
        for p in $(leftovers); do kill -KILL "$p" 2>/dev/null || true; done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "FAIL ($case_name): $*" >&2
    sed 's/^/  out: /' "$work/out" >&2 2>/dev/null || true
    sed 's/^/  err: /' "$work/err" >&2 2>/dev/null || true
    exit 1
}

cat >"$work/fake-ssh" <<'SH'
#!/bin/sh
# hvdrun's remote shell for the made-up hosts: run the command here.
shift
exec sh -c "$1"
SH
chmod +x "$work/fake-ssh"
printf '#!/bin/sh\ncat "%s/hosts"\n' "$work" >"$work/discover"
chmod +x "$work/discover"
hosts() { printf '%s\n' "$@" >"$work/hosts.new" && mv "$work/hosts.new" "$work/hosts"; }

# start HVDRUN_ARGS... -- TRAIN_ARGS...: the job in the background.
start() {
    local args=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    rm -f "$work/out" "$work/err" "$work/rc" "$work/$marker".pid.*
    (
        set +e
        with_preload timeout -k 10 120 "$bin/hvdrun" --host-discovery-script "$work/discover" \
            --ssh-command "$work/fake-ssh" "${args[@]}" \
            "$python" "$example" --pid-file "$work/$marker.pid" "$@" \
            >"$work/out" 2>"$work/err"
        echo $? >"$work/rc"
    ) &
    job=$!
}
finish() {
    wait "$job" || true
    job=""
    rc=$(cat "$work/rc")
}

# wait_for WHAT TEST...: until the test command succeeds, at most 60 s; the
# job ending first is a failure.
wait_for() {
    local what=$1 n=0
    shift
    until "$@"; do
        n=$((n + 1))
        [ $n -le 600 ] || fail "no $what within 60 s"
        [ -f "$work/rc" ] && fail "the job ended before $what"
        sleep 0.1
    done
}
has_file() { [ -s "$1" ]; }
has_line() { grep -q -- "$2" "$work/$1"; }

expect_rc() { [ "$rc" = "$1" ] || fail "exit code $rc, expected $1"; }
expect_out() { grep -q -- "$1" "$work/out" || fail "stdout lacks '$1'"; }
expect_err() { grep -q -- "$1" "$work/err" || fail "stderr lacks '$1'"; }
expect_no_err() { ! grep -q -- "$1" "$work/err" || fail "stderr has '$1'"; }
# At most 10 s until the job's processes are gone (killed as its launcher ends).
nothing_left() {
    local n=0
    while [ -n "$(leftovers)" ]; do
        n=$((n + 1))
        [ $n -le 100 ] || fail "processes of the job are still running: $(leftovers)"
        sleep 0.1
    done
}

identical="parameters identical on every rank"
for case_name in $cases; do
    case $case_name in
    kill)
        # kill -9 of rank 1 of 3 while the workers wait at step 12 (the
        # hold file): the other two restore the commit of step 10, meet in
        # round 1 with new ranks and finish the epochs.
        hosts h1 h2 h3
        touch "$work/hold"
        start --min-np 2 --max-np 3 -np 3 -- --epochs 3 --pid-at-step 12 \
            --hold-file "$work/hold"
        wait_for "pid file of rank 1" has_file "$work/$marker.pid.1"
        kill -9 "$(cat "$work/$marker.pid.1")"
        rm "$work/hold"
        finish
        expect_rc 0
        expect_err "exited with code 137; blacklisting host h2"
        expect_out "start: 3 workers, epoch 0, step 0 (after 0 resets)"
        expect_out "start: 2 workers, epoch 0, step 10 (after 1 resets)"
        expect_out "done: 3 epochs, [0-9]* steps, 2 workers, 1 resets .*$identical"
        nothing_left
        ;;
    remove)
        # h3 leaves the discovery while the workers wait at step 10 (the
        # hold file): at their next commit every worker gets
        # HostsUpdatedInterrupt(skip_sync=True); h3's worker is removed and
        # exits 0, the survivors vote to skip the sync and go on.
        hosts h1 h2 h3
        touch "$work/hold"
        start --min-np 2 --max-np 3 -np 3 -- --epochs 3 --pid-at-step 10 \
            --hold-file "$work/hold" --verbose
        wait_for "pid file of rank 2" has_file "$work/$marker.pid.2"
        hosts h1 h2
        wait_for "announcement" has_line err "hosts removed"
        rm "$work/hold"
        finish
        expect_rc 0
        expect_err "hosts removed"
        expect_err "hvd: this worker was removed from the elastic job"
        expect_err "resetting: hosts were removed"
        expect_err "state sync skipped"
        expect_out "start: 2 workers, epoch [0-9]*, step [0-9]* (after 1 resets)"
        expect_out "done: 3 epochs, [0-9]* steps, 2 workers, 1 resets .*$identical"
        nothing_left
        ;;
    add)
        # h3 appears while the workers wait at step 10: they reset at their
        # next commit and a new worker joins; it must receive the state
        # (the sync vote makes the survivors sync with it).
        hosts h1 h2
        touch "$work/hold"
        start --min-np 2 --max-np 3 -np 2 -- --epochs 3 --pid-at-step 10 \
            --hold-file "$work/hold" --verbose
        wait_for "pid file of rank 1" has_file "$work/$marker.pid.1"
        hosts h1 h2 h3
        wait_for "announcement" has_line err "hosts added"
        rm "$work/hold"
        finish
        expect_rc 0
        expect_err "hosts added"
        expect_out "start: 3 workers, epoch [0-9]*, step [0-9]* (after 1 resets)"
        expect_out "done: 3 epochs, [0-9]* steps, 3 workers, 1 resets .*$identical"
        expect_no_err "state sync skipped"
        nothing_left
        ;;
    *)
        echo "elastic.sh: unknown case '$case_name' (kill, remove, add)" >&2
        exit 2
        ;;
    esac
    echo "ok: $case_name"
done
