#!/bin/sh
# A multi-host test bed made of Linux network namespaces (needs root).
#
#   bed.sh check                     exit 0 if this machine can host a bed; else the
#                                    reason and exit 77
#   bed.sh [-b BED] up N [--owner PID]
#                                    make a bed of N hosts (2 to 4); prints its name
#   bed.sh [-b BED] down             remove it: its processes, namespaces and files
#   bed.sh down --stale | --all      remove the beds whose owner has exited / every bed
#   bed.sh list                      the beds that exist
#   bed.sh [-b BED] hosts            name, address, interface, namespace of each host
#   bed.sh [-b BED] exec HOST CMD [ARG...]
#                                    run a command on a host (node1..nodeN or ctl)
#   bed.sh [-b BED] ssh HOST COMMAND the remote shell for hvdrun --ssh-command
#   bed.sh [-b BED] exits [--clear]  "HOST CODE" for each command `ssh` ran that has
#                                    ended (or forget them)
#   bed.sh [-b BED] pids [HOST]      processes on one host, or on every host
#   bed.sh [-b BED] link HOST up|down
#                                    plug or pull a host's cable (its switch port)
#   bed.sh [-b BED] kill HOST        SIGKILL every process of a host
#
# DESIGN. A host is a network namespace BED-HOST: loopback, one interface on
# the bed's network 10.77.0.0/24 (eth0; ens5 on the last node, so that
# interface selection meets a host whose name differs) and a decoy docker0
# (an empty bridge with 172.17.0.1/16, the same on every host, as on real
# machines running Docker) that peers cannot reach. node1..nodeN are
# 10.77.0.1..N; ctl, 10.77.0.100, is a launcher with no slots, like a login
# node. Each interface is one end of a veth pair whose other end is a port
# of the bridge sw0 in the namespace BED-sw: the switch lives in a namespace
# of its own, so nothing is added to the root namespace and its firewall
# (br_netfilter, Docker's FORWARD policy) never sees the traffic, and beds
# of parallel runs share only the namespace name space (hence the per-bed
# prefix). Host names resolve on every host through /etc/netns/NS/hosts,
# which `ip netns exec` mounts over /etc/hosts; `exec` and `ssh` also give
# the command a UTS namespace whose hostname is the host's name.
#
# `ssh` behaves like ssh without a terminal: the command runs on the host
# in a session of its own, so signals to the client (hvdrun stopping a job)
# do not reach it, and it exits on its own or is killed there. The client
# exits with the command's code, or 255 when the remote side was killed. The
# remote side records the command's exit code (`exits` lists them), which
# tests read to learn how each remote rank ended, after hvdrun too.
#
# State: /run/hvd-netns/BED (hosts, owner). The bed is -b BED, else
# $HVD_NETNS_BED, else the only one there is.
set -u

run_dir=/run/hvd-netns
self=$(cd "$(dirname "$0")" && pwd)/${0##*/}
net=10.77.0

die() { echo "bed.sh: $*" >&2; exit 1; }
skip() { echo "$*"; exit 77; }

# The start time of a live process (field 22 of /proc/PID/stat), to tell a
# live owner from a reused pid; nothing for a zombie or no process.
started() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '$1 != "Z" { print $20 }'; }

pick_bed() {
    if [ -z "$bed" ]; then
        bed=${HVD_NETNS_BED:-}
    fi
    if [ -z "$bed" ]; then
        n=$(beds | wc -l)
        [ "$n" = 1 ] || die "$n beds exist; name one with -b BED (bed.sh list)"
        bed=$(beds)
    fi
    state=$run_dir/$bed
}

beds() {
    for d in "$run_dir"/*; do
        [ -d "$d" ] && echo "${d##*/}"
    done
}

# ns_of HOST: the namespace of a host of the bed, or nothing.
ns_of() { awk -v h="$1" '$1 == h { print $4 }' "$state/hosts" 2>/dev/null; }

# The namespaces of the bed's hosts.
host_namespaces() { awk '{ print $4 }' "$state/hosts"; }

# Every namespace whose name starts with the bed's.
namespaces_of() { ip netns list 2>/dev/null | awk -v p="$1-" 'index($1, p) == 1 { print $1 }'; }

kill_ns() {
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$1" 2>/dev/null)
        [ -n "$pids" ] || return 0
        # shellcheck disable=SC2086 # one pid per word
        kill -9 $pids 2>/dev/null
        sleep 0.1
    done
    echo "bed.sh: processes still in $1: $(ip netns pids "$1" | tr '\n' ' ')" >&2
}

remove_bed() {
    b=$1
    for ns in $(namespaces_of "$b"); do
        kill_ns "$ns"
    done
    for ns in $(namespaces_of "$b"); do
        ip netns del "$ns" 2>/dev/null || echo "bed.sh: cannot delete namespace $ns" >&2
        rm -rf "/etc/netns/$ns"
    done
    rm -rf "${run_dir:?}/$b"
    rmdir /etc/netns "$run_dir" 2>/dev/null
    return 0
}

check() {
    [ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in ip:iproute2 unshare:util-linux setsid:util-linux awk:mawk; do
        command -v "${tool%%:*}" >/dev/null 2>&1 ||
            skip "no '${tool%%:*}' command (Debian package ${tool#*:})"
    done
    probe=hvd-netns-probe-$$
    out=$(ip netns add "$probe" 2>&1) || skip "cannot create a network namespace: $out"
    why=
    if ! out=$(ip netns add "$probe-2" 2>&1); then
        why="cannot create a second network namespace: $out"
    elif ! out=$(ip -n "$probe-2" link add sw0 type bridge 2>&1); then
        why="cannot create a bridge (no bridge support in the kernel?): $out"
    elif ! out=$(ip link add eth0 netns "$probe" type veth peer name p0 netns "$probe-2" 2>&1); then
        why="cannot create a veth pair (no veth support in the kernel?): $out"
    elif ! out=$(ip netns exec "$probe" unshare --uts sh -c 'hostname probe' 2>&1); then
        why="cannot enter the namespace with a UTS namespace of its own: $out"
    fi
    ip netns del "$probe-2" 2>/dev/null
    ip netns del "$probe" 2>/dev/null
    [ -z "$why" ] || skip "$why"
    exit 0
}

# add_host NAME IFNAME LASTOCTET
add_host() {
    name=$1 ifname=$2 addr=$net.$3
    ns=$bed-$name
    ip netns add "$ns" || return 1
    echo "$name $addr $ifname $ns" >>"$state/hosts"
    ip link add "$ifname" netns "$ns" type veth peer name "p-$name" netns "$bed-sw" || return 1
    ip -n "$bed-sw" link set "p-$name" master sw0 up || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" link add docker0 type bridge || return 1
    ip -n "$ns" addr add 172.17.0.1/16 dev docker0 || return 1
    ip -n "$ns" link set docker0 up || return 1
    ip -n "$ns" addr add "$addr/24" dev "$ifname" || return 1
    ip -n "$ns" link set "$ifname" up || return 1
}

up() {
    n=${1:-}
    [ $# = 0 ] || shift
    owner=
    [ "${1:-}" = --owner ] && owner=${2:-}
    case $n in 2 | 3 | 4) ;; *) die "up: N must be 2, 3 or 4 (got '$n')" ;; esac
    [ -n "$bed" ] || bed=hvdbed-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
    state=$run_dir/$bed
    if [ -e "$state" ] || [ -n "$(namespaces_of "$bed")" ]; then
        die "up: bed $bed exists"
    fi
    mkdir -p "$state/exit" || die "up: cannot create $state"
    if [ -n "$owner" ]; then
        echo "$owner $(started "$owner")" >"$state/owner"
    fi
    : >"$state/hosts"
    if ! make_bed "$n"; then
        remove_bed "$bed"
        die "up: could not make bed $bed (see above)"
    fi
    echo "$bed"
}

make_bed() {
    n=$1
    ip netns add "$bed-sw" || return 1
    ip -n "$bed-sw" link add sw0 type bridge || return 1
    ip -n "$bed-sw" link set sw0 up || return 1
    for i in $(seq "$n"); do
        ifname=eth0
        [ "$i" = "$n" ] && ifname=ens5
        add_host "node$i" "$ifname" "$i" || return 1
    done
    add_host ctl eth0 100 || return 1
    # /etc/hosts of every host: localhost and the bed's hosts.
    for ns in $(host_namespaces); do
        mkdir -p "/etc/netns/$ns" || return 1
        {
            printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
            awk '{ printf "%s\t%s\n", $2, $1 }' "$state/hosts"
        } >"/etc/netns/$ns/hosts" || return 1
    done
    {
        echo "bed $bed: $n hosts on $net.0/24 (switch: namespace $bed-sw)"
        awk '{ printf "  %-6s %-12s %-5s netns %s\n", $1, $2, $3, $4 }' "$state/hosts"
        echo "run on a host:  $self -b $bed exec ctl CMD..."
        echo "hvdrun:         --ssh-command '$self -b $bed ssh'"
        echo "remove it:      $self -b $bed down"
    } >&2
}

# shellcheck disable=SC2016 # expanded by the host's shell
# The remote side of `ssh`, run on the host: a session of its own, the
# host's name, and the command's exit code written down.
remote_side='hostname "$1"
sh -c "$2"
code=$?
echo "$code" >"$3/$1.$$"
exit "$code"'

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
    up "$@"
    ;;
down)
    case ${1:-} in
    --all)
        for b in $(beds); do remove_bed "$b"; done
        ;;
    --stale)
        for b in $(beds); do
            [ -f "$run_dir/$b/owner" ] || continue
            read -r pid start <"$run_dir/$b/owner"
            [ "$(started "$pid")" = "$start" ] || remove_bed "$b"
        done
        ;;
    '')
        pick_bed
        remove_bed "$bed"
        ;;
    *)
        die "down: unknown argument '$1'"
        ;;
    esac
    ;;
list)
    beds
    ;;
hosts)
    pick_bed
    cat "$state/hosts"
    ;;
exec)
    pick_bed
    host=${1:-}
    ns=$(ns_of "$host")
    [ -n "$ns" ] || die "exec: no host '$host' in bed $bed"
    shift
    # shellcheck disable=SC2016 # expanded on the host
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
    ;;
ssh)
    pick_bed
    host=${1:-}
    ns=$(ns_of "$host")
    if [ -z "$ns" ]; then
        echo "ssh: Could not resolve hostname $host: Name or service not known" >&2
        exit 255
    fi
    [ $# = 2 ] || { echo "bed.sh ssh: usage: ssh HOST COMMAND" >&2; exit 255; }
    # A background command's stdin would be /dev/null: hand ours on, as
    # ssh does (hvdrun sends the job token there).
    exec 3<&0
    ip netns exec "$ns" unshare --uts setsid -w sh -c "$remote_side" bed-ssh "$host" "$2" \
        "$state/exit" <&3 3<&- &
    # The child has the command's stderr; the shell's own "Killed" is noise.
    exec 2>/dev/null
    wait $!
    code=$?
    # A remote side killed by a signal is a lost connection for ssh.
    [ $code -gt 128 ] && code=255
    exit $code
    ;;
exits)
    pick_bed
    if [ "${1:-}" = --clear ]; then
        rm -f "$state/exit/"*
    else
        for f in "$state/exit/"*; do
            [ -f "$f" ] && echo "${f##*/} $(cat "$f")"
        done | sed 's/\.[0-9]* / /' | sort
    fi
    ;;
pids)
    pick_bed
    if [ $# -gt 0 ]; then
        ns=$(ns_of "$1")
        [ -n "$ns" ] || die "pids: no host '$1' in bed $bed"
        ip netns pids "$ns"
    else
        for ns in $(host_namespaces); do ip netns pids "$ns"; done
    fi
    ;;
link)
    pick_bed
    [ -n "$(ns_of "${1:-}")" ] || die "link: no host '${1:-}' in bed $bed"
    case ${2:-} in up | down) ;; *) die "link: up or down, not '${2:-}'" ;; esac
    ip -n "$bed-sw" link set "p-$1" "$2"
    ;;
kill)
    pick_bed
    ns=$(ns_of "${1:-}")
    [ -n "$ns" ] || die "kill: no host '${1:-}' in bed $bed"
    kill_ns "$ns"
    ;;
*)
    awk 'NR == 1 { next } /^# DESIGN/ { exit } { sub(/^# ?/, ""); print }' "$0" >&2
    exit 2
    ;;
esac
