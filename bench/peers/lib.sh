# shellcheck shell=bash
# Sourced by the bench/compare_*.sh scripts: ensure_packages PKG... installs
# the Debian packages that are missing (as root, --no-install-recommends),
# or fails saying which are missing. The caller defines say().
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
