#!/bin/sh
# Slurm tests on a bed of network namespaces: tests/slurm/slurm.sh BIN_DIR CASE
# Each case makes a bed of 2 nodes (tests/netns/bed.sh up 2: node1, node2 and
# the launcher host ctl), brings a Slurm cluster up on it in a temporary
# directory (cluster.sh up: slurmctld on ctl, a slurmd on each node, a munged
# of its own), runs Slurm's commands on ctl as a user would on a login node,
# and removes the cluster, the bed and the directory on every exit path.
# Exit 0: pass; 77: skipped (cluster.sh check: not root, no namespaces, no
# Slurm or munge); anything else: fail, with the cluster's logs.
# shellcheck disable=SC2016 # job scripts and commands in single quotes
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$1" && pwd)
case_name=$2
bedsh=$(cd "$here/../netns" && pwd)/bed.sh
clustersh=$here/cluster.sh

# A run inside a Slurm job must not hand that job's variables to the test
# cluster's commands.
for v in $(env | sed -n 's/^\(SLURM[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done

why=$("$clustersh" check 2>&1)
case $? in
0) ;;
77)
    echo "SKIPPED ($case_name): $why"
    exit 77
    ;;
*)
    echo "FAIL ($case_name): cluster.sh check: $why" >&2
    exit 1
    ;;
esac

dir=$(mktemp -d) || exit 1
bed=hvdbed-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
t=$dir/case
trap '"$clustersh" -b "$bed" down "$dir"; "$bedsh" -b "$bed" down; rm -rf "$dir"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    echo "FAIL ($case_name): $*" >&2
    for f in "$t/out" "$t/err"; do
        [ -s "$f" ] && { echo "==> $f <=="; cat "$f"; } >&2
    done
    "$clustersh" logs "$dir" 30 >&2
    exit 1
}
B() { "$bedsh" -b "$bed" "$@"; }
# S CMD...: CMD on ctl with the cluster's settings (DIR/env), in $t, for at
# most 60 s.
S() {
    timeout 60 "$bedsh" -b "$bed" exec ctl sh -c 'cd "$0/case" && . "$0/env" && exec "$@"' "$dir" "$@"
}

"$bedsh" down --stale # beds of runs that were killed before their trap ran
out=$(B up 2 --owner $$ 2>&1 >/dev/null) || { echo "$out" >&2; fail "bed.sh up 2"; }
out=$("$clustersh" -b "$bed" up "$dir" 2>&1) || {
    # up has shown the logs.
    echo "$out" >&2
    echo "FAIL ($case_name): cluster.sh up" >&2
    exit 1
}
mkdir "$t" || fail "cannot create $t"

# hvd's ranks: the build's Python package (srun hands the environment on).
PYTHONPATH=$bin/../lib/hvd/python
export PYTHONPATH
PY=/usr/bin/python3
digits=$(cd "$here/../../examples/pytorch" && pwd)/train_digits.py
spin=$here/spin.py

# wait_for FILE...: each file exists within 60 s (a bound for hangs).
wait_for() {
    for f in "$@"; do
        n=0
        until [ -f "$f" ]; do
            n=$((n + 1))
            [ $n -le 600 ] || fail "no $f within 60 s"
            sleep 0.1
        done
    done
}
# spinning SECONDS [ENV...]: 4 ranks of spin.py for SECONDS (< 50) on 2
# nodes, in the background ($job_pid, its exit code in $t/rc), once all
# of them train.
spinning() {
    seconds=$1
    shift
    rm -f "$t"/pid.* "$t/rc"
    (S env "$@" srun -N 2 -n 4 $PY "$spin" "$t" "$seconds" </dev/null >"$t/out" 2>"$t/err"
     echo $? >"$t/rc") &
    job_pid=$!
    wait_for "$t/pid.0" "$t/pid.1" "$t/pid.2" "$t/pid.3"
}
# ends_within S: the background srun ends within S seconds (a bound, not a
# timing) and leaves no rank running; $rc is its exit code.
ends_within() {
    n=0
    while [ ! -f "$t/rc" ]; do
        n=$((n + 1))
        [ $n -le $(($1 * 10)) ] || fail "srun still running $1 s after the failure"
        sleep 0.1
    done
    wait "$job_pid"
    rc=$(cat "$t/rc")
    n=0
    while pgrep -f "$spin" >/dev/null; do
        n=$((n + 1))
        [ $n -le 100 ] || fail "ranks still running 10 s after srun ended: $(pgrep -af "$spin")"
        sleep 0.1
    done
}

# submit ARG...: sbatch ARG... on ctl, from $t; the job's id in $job.
submit() {
    job=$(S sbatch --parsable "$@" </dev/null 2>"$t/err")
    rc=$?
    [ $rc = 0 ] || fail "sbatch $* exited $rc"
    case $job in '' | *[!0-9]*) fail "sbatch --parsable printed '$job', not a job id" ;; esac
}
# ended: job $job ends within 60 s (a bound for hangs, not a timing); its
# last state in $state, its `scontrol show job -o` line in $t/out.
ended() {
    n=0
    while :; do
        S scontrol show job -o "$job" </dev/null >"$t/out" 2>>"$t/err"
        state=$(sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p' "$t/out")
        case $state in
        PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | '') ;;
        *) return ;;
        esac
        n=$((n + 1))
        [ $n -le 300 ] || fail "job $job still $state after 60 s"
        sleep 0.2
    done
}

# expect_hosts FILE: FILE has node1 twice and node2 twice, in any order.
expect_hosts() {
    got=$(sort "$1" | tr '\n' ' ')
    [ "$got" = "node1 node1 node2 node2 " ] ||
        fail "'$got' where node1 and node2 should each appear twice"
}

case $case_name in
smoke)
    # 4 tasks on 2 nodes, 2 on each.
    S srun -N 2 -n 4 hostname </dev/null >"$t/out" 2>"$t/err"
    rc=$?
    [ $rc = 0 ] || fail "srun -N 2 -n 4 hostname exited $rc"
    expect_hosts "$t/out"
    ;;
batch)
    # The script runs on the first node of the allocation, its srun step
    # on both; each task writes down where it ran. The working directory
    # is $t on every host (one file system).
    cat >"$t/job.sh" <<'EOF'
#!/bin/sh
#SBATCH -N 2 -n 4
#SBATCH -J hvd-batch
#SBATCH -o job.out
echo "$(hostname) $SLURM_NNODES $SLURM_NTASKS" >script.txt
srun sh -c 'echo "$SLURM_PROCID $SLURM_NODEID $(hostname)" >rank.$SLURM_PROCID'
EOF
    submit job.sh
    ended
    [ "$state" = COMPLETED ] || { cat "$t/job.out" >>"$t/err"; fail "job $job ended $state"; }
    grep -q ' ExitCode=0:0 ' "$t/out" || fail "job $job: exit code not 0:0"
    [ "$(cat "$t/script.txt")" = "node1 2 4" ] ||
        fail "the script ran as '$(cat "$t/script.txt")', not 'node1 2 4' (host, nodes, tasks)"
    # Block distribution: ranks 0 and 1 on node1 (node index 0), 2 and 3
    # on node2.
    for r in 0 1 2 3; do
        want="$r $((r / 2)) node$((r / 2 + 1))"
        [ -f "$t/rank.$r" ] || fail "task $r wrote nothing"
        [ "$(cat "$t/rank.$r")" = "$want" ] ||
            fail "task $r: '$(cat "$t/rank.$r")', not '$want' (rank, node index, host)"
    done
    set -- "$t"/rank.*
    [ $# = 4 ] || fail "$# tasks wrote their rank, not 4"
    ;;
salloc)
    # The allocation's shell runs on ctl, where salloc is, and its srun
    # step on the nodes.
    S salloc -N 2 -n 4 sh -c 'echo "shell on $(hostname)"; srun hostname' </dev/null \
        >"$t/out" 2>"$t/err"
    rc=$?
    [ $rc = 0 ] || fail "salloc exited $rc"
    grep -q 'Granted job allocation' "$t/err" || fail "salloc granted no allocation"
    [ "$(head -n 1 "$t/out")" = "shell on ctl" ] || fail "the shell did not run on ctl"
    sed 1d "$t/out" >"$t/hosts"
    expect_hosts "$t/hosts"
    ;;
train)
    # The README's example, 4 tasks on 2 nodes, no hvdrun: it fails by
    # itself below 95% accuracy or when the ranks' parameters differ.
    S srun -N 2 -n 4 $PY "$digits" </dev/null >"$t/out" 2>"$t/err"
    rc=$?
    [ $rc = 0 ] || fail "srun -N 2 -n 4 train_digits.py exited $rc"
    grep -q 'parameters identical on 4 ranks' "$t/out" || fail "no final line from rank 0"
    grep -q 'launcher: slurm (SLURM_STEP_ID=0 and SLURM_PROCID=0 are set' "$t/err" ||
        fail "rank 0 did not say which launcher it found"
    ;;
srun_torchrun)
    # One torchrun per node under srun: its workers are torchrun's ranks
    # (not Slurm's tasks), and hvd takes them so.
    S srun -N 2 --ntasks-per-node=1 $PY "$here/../python/torchrun.py" --nnodes 2 \
        --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint node1:29400 --rdzv_id hvd \
        "$digits" </dev/null >"$t/out" 2>"$t/err"
    rc=$?
    [ $rc = 0 ] || fail "srun torchrun ... train_digits.py exited $rc"
    grep -q 'parameters identical on 4 ranks' "$t/out" || fail "no final line from rank 0"
    grep -q 'launcher: torchrun (.*TORCHELASTIC_RUN_ID' "$t/err" ||
        fail "rank 0 did not take torchrun's ranks"
    ;;
sbatch_example)
    # examples/slurm/train.sbatch as a user submits it, from the directory
    # that holds examples/ (a copy in $t) with PYTHONPATH exported, which
    # sbatch passes on: first as written, 4 ranks on 2 nodes; then on one
    # node, the command line's options overriding its #SBATCH lines.
    mkdir -p "$t/examples/slurm" "$t/examples/pytorch" || fail "cannot create $t/examples"
    cp "$here/../../examples/slurm/train.sbatch" "$t/examples/slurm/" || fail "cannot copy it"
    cp "$digits" "$t/examples/pytorch/" || fail "cannot copy train_digits.py"
    for nodes in 2 1; do
        if [ $nodes = 2 ]; then set --; else set -- --nodes=1 --ntasks-per-node=2; fi
        submit "$@" examples/slurm/train.sbatch
        ended
        # The job's output (the #SBATCH --output file), for fail to show.
        out=$t/hvd-digits-$job.out
        [ -f "$out" ] && cat "$out" >>"$t/err"
        [ "$state" = COMPLETED ] || fail "job $job ($nodes nodes) ended $state"
        grep -q ' ExitCode=0:0 ' "$t/out" || fail "job $job ($nodes nodes): exit code not 0:0"
        grep -q " NumNodes=$nodes " "$t/out" || fail "job $job ran on other than $nodes nodes"
        grep -q "parameters identical on $((nodes * 2)) ranks" "$out" ||
            fail "job $job ($nodes nodes): no final line for $((nodes * 2)) ranks from rank 0"
        grep -q 'launcher: slurm (SLURM_STEP_ID=0 and SLURM_PROCID=0 are set' "$out" ||
            fail "job $job ($nodes nodes): rank 0 did not say which launcher it found"
    done
    ;;
kill9)
    # A task killed with SIGKILL: the others fail within seconds naming its
    # rank, srun exits non-zero, nothing is left running.
    spinning 45 HOROVOD_GLOO_TIMEOUT_SECONDS=30
    kill -9 "$(cat "$t/pid.3")"
    ends_within 20
    [ "$rc" != 0 ] || fail "srun exited 0 after a task was killed"
    grep -q 'rank 3' "$t/err" || fail "no survivor named rank 3"
    ;;
scancel)
    spinning 45 HOROVOD_GLOO_TIMEOUT_SECONDS=30
    job=$(S squeue -h -o %i </dev/null)
    case $job in '' | *[!0-9]*) fail "squeue printed '$job', not one job id" ;; esac
    S scancel "$job" </dev/null || fail "scancel $job failed"
    ends_within 20
    [ "$rc" != 0 ] || fail "srun exited 0 after scancel"
    ;;
port_taken)
    # Something else holds the store's port on the first node: task 0 says
    # so, naming the port and where it came from.
    B exec node1 $PY -c 'import socket, time
s = socket.socket(socket.AF_INET6)
s.bind(("::", 29123))
s.listen()
open("'"$t"'/held", "w").close()
time.sleep(60)' &
    holder=$!
    wait_for "$t/held"
    S env HOROVOD_GLOO_RENDEZVOUS_PORT=29123 HOROVOD_GLOO_TIMEOUT_SECONDS=5 \
        srun -N 2 -n 4 --kill-on-bad-exit=1 $PY "$spin" "$t" 1 </dev/null >"$t/out" 2>"$t/err"
    rc=$?
    kill "$holder" 2>/dev/null
    [ $rc != 0 ] || fail "srun exited 0 with the store's port taken"
    said='store on port 29123 (HOROVOD_GLOO_RENDEZVOUS_PORT), which another process holds'
    grep -q "$said" "$t/err" || fail "task 0 did not say that its port is taken"
    ;;
outsider)
    # While a job runs, a process of another uid on its first node can
    # neither read nor write its store, nor join it with a rank's variables.
    spinning 15 HOROVOD_GLOO_RENDEZVOUS_PORT=29124 HOROVOD_GLOO_TIMEOUT_SECONDS=30
    wait_for "$t/env.1"
    chmod 644 "$t/env.1"
    as_nobody() { B exec node1 setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
    for req in "GET /global" "GET /global/0" "PUT /global/9" "DELETE /global"; do
        code=$(as_nobody curl -s -o /dev/null -w '%{http_code}' -X "${req% *}" -d x \
            "http://node1:29124${req#* }")
        [ "$code" = 401 ] || fail "$req by uid 65534: HTTP $code, not 401"
    done
    as_nobody sh -c '. "$0"; cd /
        export HOROVOD_GLOO_TIMEOUT_SECONDS=5 HOROVOD_GLOO_RENDEZVOUS_PORT=29124
        exec '"$PY"' -c "import hvd.torch as hvd; hvd.init()"' "$t/env.1" \
        >"$t/nobody" 2>&1 && fail "an impostor of uid 65534 joined the job"
    grep -q 'a MUNGE credential of uid 65534, but the job runs as uid 0' "$t/nobody" ||
        fail "the impostor was not refused for its uid: $(cat "$t/nobody")"
    ends_within 50
    [ "$rc" = 0 ] || fail "the job failed after the impostor's attempt (srun exited $rc)"
    ;;
hvdrun_salloc)
    # hvdrun inside an allocation, from the login host: hosts and slots are
    # the allocation's, every rank starts through srun (no ssh anywhere).
    S salloc -N 2 -n 4 "$bin/hvdrun" --verbose -np 4 $PY "$digits" </dev/null >"$t/out" \
        2>"$t/err"
    rc=$?
    [ $rc = 0 ] || fail "hvdrun inside salloc exited $rc"
    grep -q 'remote ranks through srun' "$t/err" || fail "hvdrun did not use srun"
    grep -q 'parameters identical on 4 ranks' "$t/out" || fail "no final line from rank 0"
    ;;
init_time)
    # Not a test: bench/launch_init.sh runs it and reads its lines. Each
    # mode in an allocation of its own, interleaved; for torch, the script
    # computes what every torch sbatch script does. Per run: "MODE S I",
    # ms from the last task's start (S) or the last task's imports (I) to
    # the last task's process group being up.
    for _ in $(seq "${HVD_INIT_REPS:-5}"); do
        for mode in hvd hvd.torch torch; do
            S salloc -N 2 -n 4 sh -c 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" |
                head -n 1) MASTER_PORT=29500 && export MASTER_ADDR MASTER_PORT &&
                exec srun '"$PY $here/init_time.py $mode" </dev/null >"$t/out" 2>"$t/err" ||
                fail "init_time.py $mode failed"
            awk -v m="$mode" '$1 == "init_time" {
                    if ($2 > s) s = $2; if ($3 > i) i = $3; if ($4 > d) d = $4; n++ }
                END { if (n != 4) exit 1; printf "%s %.0f %.0f\n", m, (d - s) * 1e3, (d - i) * 1e3 }' \
                "$t/out" || fail "init_time.py $mode: $(grep -c init_time "$t/out") lines, not 4"
        done
    done
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "ok ($case_name)"
