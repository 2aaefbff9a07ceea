# shellcheck shell=sh
# Real etcd clusters for the shell tests of the etcd rendezvous store
# (issue 34), the twin of tests/etcd_cluster.h. Source it, then:
#   etcd_member_at I ADDR [WORD...]
#                            before etcd_cluster_start: member I listens on ADDR
#                            (default 127.0.0.1) and runs through the command prefix
#                            WORD... (e.g. `tests/netns/bed.sh -b BED exec node1`: a
#                            member on a host of the network-namespace bed); the
#                            etcdctl calls that ask member I alone run through it too
#   etcd_client_via [WORD...]
#                            etcd_ctl runs through this command prefix (default: member
#                            0's), which must reach every member's ADDR
#   etcd_cluster_start N     N members (1 to 5) on free ports (of 127.0.0.1, or their
#                            etcd_member_at address), data and logs in a new temporary
#                            directory, $etcd_dir; returns once they agree on a leader.
#                            Exits 77 (ctest's skip) with the reason where etcd or
#                            etcdctl is missing or older than 3.4
#   etcd_endpoints           prints ADDR0:P0,ADDR1:P1,... (every member, up or down, in
#                            index order: for etcd:// URLs)
#   etcd_endpoint I          prints member I's ADDR:PORT
#   etcd_leader [SECONDS]    prints the leader's index once the running, unpaused
#                            members agree on one of them (default: wait 30 s; after
#                            that, status 1 and nothing printed)
#   etcd_kill I              kill -9 of member I; returns once it is gone
#   etcd_restart I           starts member I again from its data on its ports and
#                            waits until it answers and knows the leader
#   etcd_pause I, etcd_resume I
#                            SIGSTOP, SIGCONT: while paused it answers neither
#                            clients nor peers, as if partitioned away
#   etcd_enable_auth PASSWORD
#                            user root (role root) with PASSWORD, auth on; etcd_ctl
#                            then logs in as root
#   etcd_ctl ARGS...         etcdctl (v3) against every member, as root once auth is on
#   etcd_ctl_member I ARGS...
#                            the same against member I alone, through its prefix
#   etcd_logs                the end of each member's log, on stderr
#   etcd_cluster_stop        kills every member and removes $etcd_dir
#                            (HVD_TEST_ETCD_KEEP=1: keeps it and says where)
# Functions other than etcd_cluster_start return 1 with a message on
# stderr when they fail: `etcd_kill 0 || fail "..."`.
#
# Call etcd_cluster_start, etcd_kill, etcd_restart and etcd_cluster_stop
# from the script's own shell, never inside $(...), ( ) or a pipeline:
# members are children of that shell and die with it (setpriv
# --pdeathsig, where util-linux has it), and each lives at most
# $etcd_lifetime seconds (900) under `timeout`. Put etcd_cluster_stop in
# the script's EXIT trap. A bare `wait` would wait for the members too:
# wait for pids. Every name here starts with etcd_ or _etcd_.
# HVD_TEST_ETCD names another etcd binary (its etcdctl is taken from the
# same directory when there is one there). A command prefix given to
# etcd_member_at must end by exec'ing its command (bed.sh exec does), so
# that the member's pid is the keeper's child; its words are split on
# blanks.

etcd_bin=${HVD_TEST_ETCD:-/usr/bin/etcd}
etcd_lifetime=900
etcd_dir=
_etcd_n=0
_etcd_client_via=
if [ -x "$(dirname "$etcd_bin")/etcdctl" ]; then
    _etcd_ctl_bin=$(dirname "$etcd_bin")/etcdctl
else
    _etcd_ctl_bin=$(command -v etcdctl)
fi
# The command prefix that ties a process to its parent's life.
_etcd_guard=
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then
    _etcd_guard="setpriv --pdeathsig KILL"
fi

# Why no cluster can start here; nothing where one can.
_etcd_missing() {
    if [ ! -x "$etcd_bin" ]; then
        echo "no etcd at $etcd_bin: install Debian's etcd-server (scripts/setup.sh)" \
            "or set HVD_TEST_ETCD to an etcd binary"
    elif [ -z "$_etcd_ctl_bin" ]; then
        echo "no etcdctl: install Debian's etcd-client (scripts/setup.sh)"
    elif command -v timeout >/dev/null; then
        _etcd_v=$("$etcd_bin" --version 2>/dev/null | sed -n 's/^etcd Version: //p')
        case $_etcd_v in
        3.[4-9].* | 3.[1-9][0-9].*) ;;
        *) echo "$etcd_bin is etcd '$_etcd_v'; the tests need 3.4 or later (v3 API)" ;;
        esac
    else
        echo "no timeout(1) (coreutils)"
    fi
}

_etcd_say() { echo "etcd_cluster.sh: $*" >&2; }

# _etcd_port: sets _etcd_p to a free port below the kernel's ephemeral
# range (no outgoing connection and no port-0 listener takes it before etcd
# binds it), not one of $_etcd_taken, and adds it there. Two clusters may
# still choose the same free port: a member then fails to bind and
# etcd_cluster_start retries with new ports.
_etcd_port() {
    _etcd_lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$_etcd_lo" -gt 12000 ] || _etcd_lo=12000
    while :; do
        _etcd_r=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
        _etcd_p=$((10000 + _etcd_r % (_etcd_lo - 10000)))
        case " $_etcd_taken " in *" $_etcd_p "*) continue ;; esac
        if command -v ss >/dev/null && [ -n "$(ss -Hltn "sport = :$_etcd_p")" ]; then
            continue
        fi
        _etcd_taken="$_etcd_taken $_etcd_p"
        return
    done
}

_etcd_client_port() { cut -d' ' -f1 "$etcd_dir/m$1.ports"; }

# Member I's address and command prefix (etcd_member_at).
_etcd_addr() { eval "echo \"\${_etcd_at_$1:-127.0.0.1}\""; }
_etcd_via() { eval "echo \"\${_etcd_via_$1:-}\""; }

etcd_member_at() {
    case $1 in
    [0-4]) ;;
    *)
        _etcd_say "etcd_member_at: member 0 to 4, not '$1'"
        return 1
        ;;
    esac
    eval "_etcd_at_$1=\$2"
    _etcd_k=$1
    shift 2
    eval "_etcd_via_$_etcd_k=\$*"
}

etcd_client_via() { _etcd_client_via=$*; }

_etcd_running() { [ -s "$etcd_dir/m$1.pid" ]; }

_etcd_reachable() { _etcd_running "$1" && [ ! -e "$etcd_dir/m$1.paused" ]; }

# _etcd_alive PID: the process exists and is no zombie.
_etcd_alive() {
    [ -r "/proc/$1/stat" ] && ! sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | grep -q '^Z'
}

# _etcd_spawn I new|existing: member I under `timeout` (its keeper).
_etcd_spawn() {
    _etcd_i=$1
    _etcd_cluster=
    _etcd_k=0
    while [ "$_etcd_k" -lt "$_etcd_n" ]; do
        _etcd_cluster="$_etcd_cluster${_etcd_cluster:+,}m$_etcd_k=http://$(_etcd_addr \
            "$_etcd_k"):$(cut -d' ' -f2 "$etcd_dir/m$_etcd_k.ports")"
        _etcd_k=$((_etcd_k + 1))
    done
    read -r _etcd_c _etcd_pp <"$etcd_dir/m$_etcd_i.ports"
    _etcd_a=$(_etcd_addr "$_etcd_i")
    echo "==== etcd_cluster.sh: start member $_etcd_i ($2):" \
        "client $_etcd_a:$_etcd_c, peer port $_etcd_pp" >>"$etcd_dir/m$_etcd_i.log"
    # shellcheck disable=SC2086,SC2046 # _etcd_guard, the member's prefix: words, or nothing
    $_etcd_guard timeout -s KILL "$etcd_lifetime" $_etcd_guard $(_etcd_via "$_etcd_i") \
        "$etcd_bin" --name "m$_etcd_i" --data-dir "$etcd_dir/m$_etcd_i" \
        --listen-client-urls "http://$_etcd_a:$_etcd_c" \
        --advertise-client-urls "http://$_etcd_a:$_etcd_c" \
        --listen-peer-urls "http://$_etcd_a:$_etcd_pp" \
        --initial-advertise-peer-urls "http://$_etcd_a:$_etcd_pp" \
        --initial-cluster "$_etcd_cluster" --initial-cluster-state "$2" \
        --initial-cluster-token "${etcd_dir##*/}" \
        --heartbeat-interval 50 --election-timeout 500 --logger zap --log-level info \
        </dev/null >>"$etcd_dir/m$_etcd_i.log" 2>&1 &
    _etcd_keeper=$!
    echo "$_etcd_keeper" >"$etcd_dir/m$_etcd_i.keeper"
    rm -f "$etcd_dir/m$_etcd_i.paused"
    # etcd is the keeper's only child (setpriv, and any prefix, exec it in
    # place).
    _etcd_k=0
    while [ "$_etcd_k" -lt 200 ]; do
        _etcd_pid=$(pgrep -P "$_etcd_keeper" | head -n 1)
        if [ -n "$_etcd_pid" ]; then
            echo "$_etcd_pid" >"$etcd_dir/m$_etcd_i.pid"
            return 0
        fi
        _etcd_alive "$_etcd_keeper" || break
        _etcd_k=$((_etcd_k + 1))
        sleep 0.01
    done
    _etcd_say "member $_etcd_i did not start (log: $etcd_dir/m$_etcd_i.log)"
    return 1
}

# _etcd_down I: SIGKILL for member I and its keeper, reaped.
_etcd_down() {
    _etcd_running "$1" || return 0
    kill -KILL "$(cat "$etcd_dir/m$1.pid")" 2>/dev/null
    kill -KILL "$(cat "$etcd_dir/m$1.keeper")" 2>/dev/null
    wait "$(cat "$etcd_dir/m$1.keeper")" 2>/dev/null
    : >"$etcd_dir/m$1.pid"
    rm -f "$etcd_dir/m$1.paused"
}

# _etcd_status I: "ID LEADER" of member I (leader 0: none), or status 1.
_etcd_status() {
    # shellcheck disable=SC2046 # the member's prefix: words, or nothing
    _etcd_out=$(ETCDCTL_API=3 $(_etcd_via "$1") "$_etcd_ctl_bin" \
        --endpoints="$(etcd_endpoint "$1")" --dial-timeout=1s --command-timeout=1s \
        endpoint status -w json 2>/dev/null) || return 1
    _etcd_id=$(echo "$_etcd_out" | sed -n 's/.*"member_id":\([0-9]*\).*/\1/p')
    _etcd_ld=$(echo "$_etcd_out" | sed -n 's/.*"leader":\([0-9]*\).*/\1/p')
    [ -n "$_etcd_id" ] && [ -n "$_etcd_ld" ] || return 1
    echo "$_etcd_id" >"$etcd_dir/m$1.id"
    echo "$_etcd_id $_etcd_ld"
}

# _etcd_index_of ID: the index of the member with raft id ID.
_etcd_index_of() {
    _etcd_k=0
    while [ "$_etcd_k" -lt "$_etcd_n" ]; do
        if [ "$(cat "$etcd_dir/m$_etcd_k.id" 2>/dev/null)" = "$1" ]; then
            echo "$_etcd_k"
            return 0
        fi
        _etcd_k=$((_etcd_k + 1))
    done
    return 1
}

# One look: the index of the leader every reachable member follows, where
# it is reachable too; else status 1.
_etcd_agreed() {
    _etcd_common=
    _etcd_j=0
    while [ "$_etcd_j" -lt "$_etcd_n" ]; do
        if _etcd_reachable "$_etcd_j"; then
            # shellcheck disable=SC2046 # two words: ID LEADER
            set -- $(_etcd_status "$_etcd_j")
            [ $# = 2 ] && [ "$2" != 0 ] || return 1
            [ -z "$_etcd_common" ] || [ "$_etcd_common" = "$2" ] || return 1
            _etcd_common=$2
        fi
        _etcd_j=$((_etcd_j + 1))
    done
    [ -n "$_etcd_common" ] || return 1
    _etcd_who=$(_etcd_index_of "$_etcd_common") || return 1
    _etcd_reachable "$_etcd_who" || return 1
    echo "$_etcd_who"
}

# A member whose keeper has ended (it failed to start): its index.
_etcd_dead() {
    _etcd_k=0
    while [ "$_etcd_k" -lt "$_etcd_n" ]; do
        if _etcd_running "$_etcd_k" && ! _etcd_alive "$(cat "$etcd_dir/m$_etcd_k.keeper")"; then
            echo "$_etcd_k"
            return 0
        fi
        _etcd_k=$((_etcd_k + 1))
    done
    return 1
}

_etcd_start_once() {
    _etcd_taken=
    _etcd_k=0
    while [ "$_etcd_k" -lt "$_etcd_n" ]; do
        _etcd_port
        _etcd_c=$_etcd_p
        _etcd_port
        echo "$_etcd_c $_etcd_p" >"$etcd_dir/m$_etcd_k.ports"
        _etcd_k=$((_etcd_k + 1))
    done
    _etcd_i2=0
    while [ "$_etcd_i2" -lt "$_etcd_n" ]; do
        _etcd_spawn "$_etcd_i2" new || return 1
        _etcd_i2=$((_etcd_i2 + 1))
    done
    _etcd_tries=0
    while [ "$_etcd_tries" -lt 600 ]; do
        if _etcd_d=$(_etcd_dead); then
            if grep -q "address already in use" "$etcd_dir/m$_etcd_d.log"; then
                _etcd_say "member $_etcd_d lost a port to another process: new ports"
                return 2
            fi
            _etcd_say "member $_etcd_d exited while starting"
            return 1
        fi
        _etcd_agreed >/dev/null && return 0
        _etcd_tries=$((_etcd_tries + 1))
        sleep 0.05
    done
    _etcd_say "no leader after 30 s"
    return 1
}

etcd_cluster_start() {
    _etcd_why=$(_etcd_missing)
    if [ -n "$_etcd_why" ]; then
        echo "skipped: $_etcd_why"
        exit 77
    fi
    case $1 in
    [1-5]) ;;
    *)
        _etcd_say "etcd_cluster_start: 1 to 5 members, not '$1'"
        return 1
        ;;
    esac
    if [ -n "$etcd_dir" ]; then
        _etcd_say "etcd_cluster_start: a cluster is running ($etcd_dir): etcd_cluster_stop first"
        return 1
    fi
    _etcd_n=$1
    etcd_dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd-etcd-XXXXXX") || return 1
    for _etcd_attempt in 1 2 3 4 5; do
        _etcd_start_once
        _etcd_rc=$?
        [ "$_etcd_rc" = 0 ] && return 0
        _etcd_k=0
        while [ "$_etcd_k" -lt "$_etcd_n" ]; do
            _etcd_down "$_etcd_k"
            rm -rf "$etcd_dir/m$_etcd_k"
            echo "==== etcd_cluster.sh: start failed (attempt $_etcd_attempt)" \
                >>"$etcd_dir/m$_etcd_k.log"
            _etcd_k=$((_etcd_k + 1))
        done
        [ "$_etcd_rc" = 2 ] || break
    done
    etcd_logs
    _etcd_say "no etcd cluster of $_etcd_n members started (the logs above)"
    return 1
}

etcd_endpoints() {
    _etcd_k=0
    _etcd_eps=
    while [ "$_etcd_k" -lt "$_etcd_n" ]; do
        _etcd_eps="$_etcd_eps${_etcd_eps:+,}$(etcd_endpoint "$_etcd_k")"
        _etcd_k=$((_etcd_k + 1))
    done
    echo "$_etcd_eps"
}

etcd_endpoint() { echo "$(_etcd_addr "$1"):$(_etcd_client_port "$1")"; }

etcd_leader() {
    _etcd_tries=$((${1:-30} * 20))
    while :; do
        _etcd_agreed && return 0
        [ "$_etcd_tries" -gt 0 ] || return 1
        _etcd_tries=$((_etcd_tries - 1))
        sleep 0.05
    done
}

etcd_kill() {
    _etcd_running "$1" || {
        _etcd_say "etcd_kill: member $1 is not running"
        return 1
    }
    echo "==== etcd_cluster.sh: kill -9 member $1" >>"$etcd_dir/m$1.log"
    _etcd_down "$1"
}

etcd_restart() {
    if _etcd_running "$1"; then
        _etcd_say "etcd_restart: member $1 is running"
        return 1
    fi
    _etcd_spawn "$1" existing || return 1
    _etcd_tries=600
    while [ "$_etcd_tries" -gt 0 ]; do
        _etcd_alive "$(cat "$etcd_dir/m$1.keeper")" || break
        # shellcheck disable=SC2046 # two words: ID LEADER
        if set -- "$1" $(_etcd_status "$1") && [ $# = 3 ] && [ "$3" != 0 ] &&
            _etcd_w=$(_etcd_index_of "$3") && _etcd_reachable "$_etcd_w"; then
            return 0
        fi
        _etcd_tries=$((_etcd_tries - 1))
        sleep 0.05
    done
    _etcd_say "restarted member $1 is not healthy (log: $etcd_dir/m$1.log)"
    return 1
}

etcd_pause() {
    if ! { _etcd_running "$1" && kill -STOP "$(cat "$etcd_dir/m$1.pid")"; }; then
        _etcd_say "etcd_pause: member $1 is not running"
        return 1
    fi
    : >"$etcd_dir/m$1.paused"
}

etcd_resume() {
    if ! { _etcd_running "$1" && kill -CONT "$(cat "$etcd_dir/m$1.pid")"; }; then
        _etcd_say "etcd_resume: member $1 is not running"
        return 1
    fi
    rm -f "$etcd_dir/m$1.paused"
}

etcd_ctl() {
    _etcd_pre=${_etcd_client_via:-$(_etcd_via 0)}
    # shellcheck disable=SC2086 # the client's prefix: words, or nothing
    if [ -s "$etcd_dir/password" ]; then
        ETCDCTL_API=3 $_etcd_pre "$_etcd_ctl_bin" --endpoints="$(etcd_endpoints)" \
            --user="root:$(cat "$etcd_dir/password")" "$@"
    else
        ETCDCTL_API=3 $_etcd_pre "$_etcd_ctl_bin" --endpoints="$(etcd_endpoints)" "$@"
    fi
}

etcd_ctl_member() {
    _etcd_m=$1
    shift
    # shellcheck disable=SC2046 # the member's prefix: words, or nothing
    if [ -s "$etcd_dir/password" ]; then
        ETCDCTL_API=3 $(_etcd_via "$_etcd_m") "$_etcd_ctl_bin" --endpoints="$(etcd_endpoint \
            "$_etcd_m")" --user="root:$(cat "$etcd_dir/password")" "$@"
    else
        ETCDCTL_API=3 $(_etcd_via "$_etcd_m") "$_etcd_ctl_bin" \
            --endpoints="$(etcd_endpoint "$_etcd_m")" "$@"
    fi
}

etcd_enable_auth() {
    if ! { etcd_ctl role add root && etcd_ctl user add "root:$1" --interactive=false &&
        etcd_ctl user grant-role root root && etcd_ctl auth enable; } >/dev/null; then
        _etcd_say "etcd_enable_auth failed"
        return 1
    fi
    printf '%s\n' "$1" >"$etcd_dir/password"
}

etcd_logs() {
    _etcd_k=0
    while [ "$_etcd_k" -lt "$_etcd_n" ]; do
        echo "---- etcd member $_etcd_k ($etcd_dir/m$_etcd_k.log), last 40 lines:" >&2
        tail -n 40 "$etcd_dir/m$_etcd_k.log" >&2 2>/dev/null
        _etcd_k=$((_etcd_k + 1))
    done
}

etcd_cluster_stop() {
    [ -n "$etcd_dir" ] && [ -d "$etcd_dir" ] || return 0
    _etcd_k=0
    while [ "$_etcd_k" -lt "$_etcd_n" ]; do
        _etcd_down "$_etcd_k"
        _etcd_k=$((_etcd_k + 1))
    done
    if [ "${HVD_TEST_ETCD_KEEP:-}" = 1 ]; then
        _etcd_say "cluster kept in $etcd_dir"
    else
        rm -rf "$etcd_dir"
    fi
    etcd_dir=
}
