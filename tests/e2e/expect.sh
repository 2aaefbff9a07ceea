# Assertions on a job's output, sourced by the end-to-end scripts
# (hvdrun.sh, elastic.sh, pod.sh, netns.sh). They read $work/out, $work/err,
# $work/rc and $rc (the exit code once the script's finish ran) and report
# through the script's own fail.
expect_rc() { [ "$rc" = "$1" ] || fail "exit code $rc, expected $1"; }
expect_out() { grep -q -- "$1" "$work/out" || fail "stdout lacks '$1'"; }
expect_err() { grep -q -- "$1" "$work/err" || fail "stderr lacks '$1'"; }
# wait_line FILE LABEL PATTERN: waits at most 60 s until $work/FILE has a
# line matching PATTERN; the job ending first is a failure.
wait_line() {
    n=0
    until grep -q -- "$3" "$work/$1"; do
        n=$((n + 1))
        [ $n -le 600 ] || fail "no ${2}line '$3' within 60 s"
        [ -f "$work/rc" ] && fail "the job ended before '$3'"
        sleep 0.1
    done
}
wait_out() { wait_line out "" "$1"; }
wait_out_err() { wait_line err "stderr " "$1"; }
# within SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds;
# returns 1 if it has not after SECONDS.
within() {
    n=$(($1 * 10))
    shift
    until "$@"; do
        [ "$n" -gt 0 ] || return 1
        n=$((n - 1))
        sleep 0.1
    done
}
# nothing_left: waits at most 10 s until no process carries $marker (the
# script's processes are named after it): a job's processes go once its
# launcher ends, as soon as the kernel has delivered the kill.
none_marked() { ! pgrep -f "$marker" >/dev/null; }
nothing_left() {
    within 10 none_marked || {
        pgrep -af "$marker" >&2
        fail "processes of the job are still running"
    }
}
