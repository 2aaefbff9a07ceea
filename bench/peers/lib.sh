# shellcheck shell=bash
# Sourced by the bench/compare_*.sh scripts, which define say().

# ensure_packages PKG...: installs the Debian packages that are missing (as
# root, --no-install-recommends), or fails saying which are missing.
ensure_packages() {
    local missing="" pkg status
    for pkg in "$@"; do
        status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
        [ "$status" = installed ] || missing="$missing $pkg"
    done
    [ -n "$missing" ] || return 0
    if [ "$(id -u)" -ne 0 ]; then
        say "missing packages:$missing; run as root to install them"
        exit 1
    fi
    say "installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# start_run DIR: OUT=DIR/<UTC time>, created; fail() counts failures.
start_run() {
    OUT=$1/$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$OUT"
    failures=0
}

fail() {
    say "FAILED: $*"
    failures=$((failures + 1))
}

# The machine, the peer and this tree, for env.txt.
describe_machine() {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kernel: $(uname -r)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $(nproc)"
    echo "loadavg: $(cat /proc/loadavg)"
    echo "openmpi-bin: $(dpkg-query -W -f='${Version}' openmpi-bin)"
    echo "hvd: $(git describe --always --dirty 2>/dev/null || echo unknown)"
}
