#!/bin/sh
# A Slurm cluster on a test bed of network namespaces (tests/netns/bed.sh;
# needs root).
#
#   cluster.sh check                 exit 0 if a cluster can be made here; else the
#                                    reason and exit 77
#   cluster.sh [-b BED] up DIR       configure and start a cluster on the bed's hosts,
#                                    all of its files in DIR (an empty directory);
#                                    writes DIR/env; when it fails: the logs, and
#                                    what it started is stopped
#   cluster.sh [-b BED] down DIR     stop the cluster of DIR and every process of it
#                                    (harmless again, or after an `up` that failed)
#   cluster.sh logs DIR [LINES]      the last LINES (20) lines of each of its logs
#
# Use it from host ctl, with the clients' settings of DIR/env:
#   bed.sh -b BED exec ctl sh -c '. DIR/env; srun -N 2 -n 4 hostname'
#
# DESIGN. slurmctld runs on ctl (SlurmctldHost=ctl(10.77.0.100)), the bed's
# launcher, as on a login node; each node host nodeK runs `slurmd -N nodeK`
# in its own namespaces (bed.sh exec: its address, its hostname), so %n in
# slurm.conf gives each slurmd its spool, pid and log files. One munged, on
# ctl, with a key of its own, serves every host: its socket is a file in DIR
# and network namespaces do not separate file paths, so the daemons, the
# clients and the ranks (HVD_MUNGE_SOCKET) all reach it; AuthInfo=socket=
# points Slurm's auth and cred plugins at it. Every file is in DIR: slurm.conf,
# and beside it cgroup.conf and plugstack.conf, which Slurm reads from the
# directory of slurm.conf, so /etc/slurm is never read. No cgroups: jobs are
# tracked through their process tree (proctrack/linuxproc, task/none). Yet
# slurmd 22.05 loads a cgroup plugin whatever the others are, and its
# autodetection fails where `ip netns exec` has mounted a fresh /sys with no
# cgroup file system; cgroup.conf names cgroup/v1, whose loading touches no
# file. Nodes declare 2 CPUs (config_overrides where the machine differs),
# so a node takes 2 tasks; timeouts are short so that failures show fast.
# Daemons and jobs run as root. `down` stops the daemons by their pid files,
# then kills what is left on the bed's hosts that belongs to the cluster:
# Slurm's processes (slurmstepd and slurmscriptd rewrite their command lines
# and environments) and any process naming DIR in its command line or
# environment (job tasks and clients: SLURM_CONF=DIR/slurm.conf). Every
# process of the cluster lives in the bed's namespaces, so `bed.sh down`
# removes them too. The bed is -b BED, else the one `up` used (DIR/bed).
set -u

self=${0##*/}
here=$(cd "$(dirname "$0")" && pwd)
bedsh=$(cd "$here/../netns" && pwd)/bed.sh
# slurmctld, slurmd and munged are in /usr/sbin, not always on a user's PATH.
PATH=$PATH:/usr/sbin:/sbin
export PATH
# The cluster's daemons and commands must not see the variables of a Slurm
# job this runs in.
for v in $(env | sed -n 's/^\(SLURM[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done

die() { echo "$self: $*" >&2; exit 1; }
skip() { echo "$*"; exit 77; }

B() { "$bedsh" -b "$bed" "$@"; }

check() {
    [ "$(id -u)" = 0 ] || skip "not root (the test bed's network namespaces need root)"
    why=$("$bedsh" check 2>&1)
    case $? in
    0) ;;
    77) skip "$why" ;;
    *) skip "bed.sh check failed: $why" ;;
    esac
    for tool in slurmctld:slurmctld slurmd:slurmd munged:munge srun:slurm-client \
        sbatch:slurm-client salloc:slurm-client scontrol:slurm-client sinfo:slurm-client; do
        command -v "${tool%%:*}" >/dev/null 2>&1 ||
            skip "no '${tool%%:*}' command (Debian package ${tool#*:}, from slurm-wlm or munge)"
    done
    exit 0
}

# An absolute DIR with no characters that slurm.conf or a shell would take
# apart.
set_dir() {
    [ -n "${1:-}" ] || die "$cmd: no DIR given"
    case $1 in
    /*) dir=$1 ;;
    *) dir=$(pwd)/$1 ;;
    esac
    dir=${dir%/}
    case $dir in
    *[!A-Za-z0-9._/-]*) die "$cmd: DIR '$dir' has characters other than A-Z a-z 0-9 . _ / -" ;;
    esac
}

# The bed's hosts named node*, in order.
nodes_of_bed() { B hosts | awk '$1 ~ /^node[0-9]+$/ { print $1 }'; }
addr_of() { B hosts | awk -v h="$1" '$1 == h { print $2 }'; }

# S CMD...: a Slurm client on ctl with the cluster's settings.
S() {
    # shellcheck disable=SC2016 # expanded on ctl
    B exec ctl sh -c '. "$0/env" && exec "$@"' "$dir" "$@"
}

write_conf() {
    ctl_addr=$(addr_of ctl)
    [ -n "$ctl_addr" ] || die "up: bed $bed has no host ctl"
    {
        echo "# A test cluster on bed $bed (tests/slurm/cluster.sh); its files are in $dir."
        echo "ClusterName=hvd"
        echo "SlurmctldHost=ctl($ctl_addr)"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$dir/munge/munge.socket"
        echo "CredType=cred/munge"
        echo "StateSaveLocation=$dir/ctld/state"
        echo "SlurmctldPidFile=$dir/ctld/slurmctld.pid"
        echo "SlurmctldLogFile=$dir/ctld/slurmctld.log"
        echo "SlurmdSpoolDir=$dir/node/%n/spool"
        echo "SlurmdPidFile=$dir/node/%n/slurmd.pid"
        echo "SlurmdLogFile=$dir/node/%n/slurmd.log"
        echo "SlurmctldSyslogDebug=quiet"
        echo "SlurmdSyslogDebug=quiet"
        echo "PlugStackConfig=$dir/plugstack.conf"
        echo "MailProg=/bin/true"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "SlurmdParameters=config_overrides"
        echo "MpiDefault=none"
        echo "SchedulerParameters=batch_sched_delay=0"
        echo "ReturnToService=2"
        echo "SlurmctldTimeout=10"
        echo "SlurmdTimeout=10"
        echo "MessageTimeout=5"
        echo "TCPTimeout=2"
        echo "BatchStartTimeout=10"
        echo "KillWait=2"
        echo "InactiveLimit=15"
        for n in $nodes; do
            echo "NodeName=$n NodeAddr=$(addr_of "$n") CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 State=UNKNOWN"
        done
        echo "PartitionName=all Nodes=$(echo "$nodes" | tr ' ' ,) Default=YES MaxTime=INFINITE State=UP"
    } >"$dir/slurm.conf" || return 1
    {
        echo "# slurmd loads a cgroup plugin even with no cgroup plugin configured;"
        echo "# cgroup/v1 skips the autodetection, which fails in a namespace's /sys."
        echo "CgroupPlugin=cgroup/v1"
        echo "CgroupAutomount=no"
    } >"$dir/cgroup.conf" || return 1
    : >"$dir/plugstack.conf"
}

# Every log of the cluster, the last $1 lines of each.
logs() {
    for f in "$dir/munge/munged.log" "$dir/munge/start.log" "$dir/ctld/slurmctld.log" \
        "$dir/ctld/start.log" "$dir"/node/*/slurmd.log "$dir"/node/*/start.log; do
        [ -s "$f" ] || continue
        echo "==> $f <=="
        tail -n "$1" "$f"
    done
}

up() {
    set_dir "${1:-}"
    [ -d "$dir" ] || die "up: no directory $dir"
    [ -z "$(ls -A "$dir")" ] || die "up: $dir is not empty"
    nodes=$(nodes_of_bed | tr '\n' ' ')
    nodes=${nodes% }
    [ -n "$nodes" ] || die "up: bed '$bed' has no node hosts (bed.sh -b $bed hosts)"
    echo "$bed" >"$dir/bed" || die "up: cannot write in $dir"
    # munged wants every user able to reach its socket's directory.
    chmod 0711 "$dir" || die "up: cannot chmod $dir"
    mkdir -p "$dir/munge" "$dir/ctld/state" || die "up: cannot create directories in $dir"
    chmod 0755 "$dir/munge"
    for n in $nodes; do
        mkdir -p "$dir/node/$n/spool" || die "up: cannot create $dir/node/$n"
    done
    (umask 077 && dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null) ||
        die "up: cannot make a munge key"
    write_conf || die "up: cannot write the configuration in $dir"
    {
        echo "export SLURM_CONF=$dir/slurm.conf"
        echo "export HVD_MUNGE_SOCKET=$dir/munge/munge.socket"
    } >"$dir/env" || die "up: cannot write $dir/env"

    # The daemons fork into the background once started. SLURM_CONF also
    # marks their processes as this cluster's (where they keep their
    # environment).
    SLURM_CONF=$dir/slurm.conf
    export SLURM_CONF
    B exec ctl munged --force --socket "$dir/munge/munge.socket" \
        --key-file "$dir/munge/munge.key" --pid-file "$dir/munge/munged.pid" \
        --log-file "$dir/munge/munged.log" --seed-file "$dir/munge/munged.seed" \
        </dev/null >"$dir/munge/start.log" 2>&1 || fail_up "munged did not start"
    [ -S "$dir/munge/munge.socket" ] || fail_up "munged made no socket"
    B exec ctl slurmctld -f "$dir/slurm.conf" </dev/null >"$dir/ctld/start.log" 2>&1 ||
        fail_up "slurmctld did not start"
    for n in $nodes; do
        B exec "$n" slurmd -f "$dir/slurm.conf" -N "$n" </dev/null >"$dir/node/$n/start.log" 2>&1 ||
            fail_up "slurmd on $n did not start"
    done

    # Every node idle within 30 s; a daemon that has gone fails it at once
    # (once each has had 2 s to write its pid file).
    want=$(for n in $nodes; do echo "$n idle"; done)
    start=$(date +%s)
    while :; do
        got=$(S sinfo -h -N -o '%N %T' 2>/dev/null | sort -u)
        [ "$got" = "$want" ] && break
        now=$(date +%s)
        if [ $((now - start)) -ge 2 ]; then
            for f in munge/munged ctld/slurmctld $(for n in $nodes; do echo "node/$n/slurmd"; done); do
                [ -n "$(pid_from "$dir/$f.pid")" ] || fail_up "${f##*/} has stopped (no process for $f.pid)"
            done
        fi
        if [ $((now - start)) -ge 30 ]; then
            echo "$self: sinfo says:" >&2
            S sinfo -N -o '%N %T %E' >&2
            fail_up "the nodes are not all idle after 30 s"
        fi
        sleep 0.1
    done
    {
        echo "cluster of $dir on bed $bed: slurmctld on ctl, slurmd on $nodes"
        echo "use it:    $bedsh -b $bed exec ctl sh -c '. $dir/env; srun -N 2 -n 4 hostname'"
        echo "remove it: $here/$self -b $bed down $dir"
    } >&2
}

# Shows the logs, stops what has started, fails.
fail_up() {
    echo "$self: up: $*; the logs:" >&2
    logs 20 >&2
    down "$dir"
    exit 1
}

# The cmdline and environ of a process: does either name the cluster's DIR?
names_dir() {
    grep -aqF -- "$dir/" "/proc/$1/cmdline" "/proc/$1/environ" 2>/dev/null
}

# The pid in a pid file if that process is alive and belongs to the cluster.
pid_from() {
    [ -f "$1" ] || return 0
    read -r p <"$1" 2>/dev/null || return 0
    case $p in '' | *[!0-9]*) return 0 ;; esac
    alive "$p" && names_dir "$p" && echo "$p"
}

# Alive: exists and not a zombie.
alive() {
    s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$s" ] && [ "$s" != Z ]
}

# This process and its ancestors, which `down` must not kill.
ancestors() {
    p=$$
    while [ -n "$p" ] && [ "$p" != 0 ]; do
        echo "$p"
        p=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2)
    done
}

# The processes on the bed's hosts that belong to the cluster.
leftovers() {
    [ -n "$bed" ] || return 0
    keep=" $(ancestors | tr '\n' ' ') "
    for p in $(B pids 2>/dev/null); do
        case $keep in *" $p "*) continue ;; esac
        alive "$p" || continue
        case $(cat "/proc/$p/comm" 2>/dev/null) in
        munged | slurmctld | slurmscriptd | slurmd | slurmstepd) echo "$p" ;;
        *) names_dir "$p" && echo "$p" ;;
        esac
    done
}

# until_gone SECONDS PID...: waits for the processes to end; false if some
# are still alive.
until_gone() {
    n=$(($1 * 10))
    shift
    while [ "$n" -gt 0 ]; do
        rest=
        for p in "$@"; do alive "$p" && rest="$rest $p"; done
        [ -n "$rest" ] || return 0
        n=$((n - 1))
        sleep 0.1
    done
    return 1
}

down() {
    set_dir "${1:-}"
    if [ -z "$bed" ] && [ -f "$dir/bed" ]; then
        read -r bed <"$dir/bed"
    fi
    # The bed may be gone already, and its processes with it.
    if [ -n "$bed" ] && [ -z "$(B hosts 2>/dev/null)" ]; then
        bed=
    fi
    # The daemons by their pid files: slurmctld first, so that it does not
    # see the nodes go; munged last, which the others talk to.
    daemons=
    for f in "$dir/ctld/slurmctld.pid" "$dir"/node/*/slurmd.pid; do
        p=$(pid_from "$f")
        [ -z "$p" ] || daemons="$daemons $p"
    done
    # shellcheck disable=SC2086 # a list of pids
    if [ -n "$daemons" ]; then
        kill $daemons 2>/dev/null
        until_gone 5 $daemons || kill -9 $daemons 2>/dev/null
    fi
    munged=$(pid_from "$dir/munge/munged.pid")
    if [ -n "$munged" ]; then
        kill "$munged" 2>/dev/null
        until_gone 5 "$munged" || kill -9 "$munged" 2>/dev/null
    fi
    # What is left: job steps and tasks, slurmscriptd, clients.
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        left=$(leftovers)
        [ -n "$left" ] || return 0
        # shellcheck disable=SC2086 # a list of pids
        kill -9 $left 2>/dev/null
        # shellcheck disable=SC2086
        until_gone 1 $left
    done
    die "down: processes of the cluster still running: $(echo "$left" | tr "\n" " ")"
}

bed=
if [ "${1:-}" = -b ]; then
    bed=${2:-}
    [ -n "$bed" ] || die "-b needs a bed name"
    shift 2
fi
cmd=${1:-}
[ $# = 0 ] || shift

case $cmd in
check)
    check
    ;;
up)
    if [ -z "$bed" ]; then
        bed=${HVD_NETNS_BED:-}
        [ -n "$bed" ] || bed=$("$bedsh" list)
        case $bed in
        '') die "up: no bed (bed.sh up N)" ;;
        *"
"*) die "up: several beds; name one with -b BED" ;;
        esac
    fi
    up "$@"
    ;;
down)
    down "$@"
    ;;
logs)
    set_dir "${1:-}"
    logs "${2:-20}"
    ;;
*)
    awk 'NR == 1 { next } /^# DESIGN/ { exit } { sub(/^# ?/, ""); print }' "$0" >&2
    exit 2
    ;;
esac
