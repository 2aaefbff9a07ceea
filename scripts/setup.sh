#!/bin/sh
# Installs the Debian 12 packages that hvd's build, tests and demo need: the
# C libraries, and Debian's PyTorch for the Python layer (python/hvd), which
# scripts and tests run with /usr/bin/python3, and the real systems tests
# start themselves: Slurm and munge, etcd, Prometheus, headless Chromium.
# Only packages that are missing are installed; running it again changes
# nothing.
set -eu

PACKAGES="
gcc
clang
libclang-rt-14-dev
make
cmake
pkg-config
libcurl4-openssl-dev
libmicrohttpd-dev
libcjson-dev
libyaml-dev
check
curl
procps
iproute2
yamllint
python3
python3-torch
python3-numpy
python3-pytest
python3-packaging
python3-venv
python3-pip
python3-setuptools
python3-wheel
python3-cloudpickle
python3-sklearn
python3-torchvision
slurm-wlm
munge
libmunge-dev
etcd-server
etcd-client
prometheus
chromium
"

missing=""
for pkg in $PACKAGES; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "installed" ] || missing="$missing $pkg"
done

if [ -z "$missing" ]; then
    echo "setup: all packages present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages:$missing; run this script as root to install them" >&2
    exit 1
fi

echo "setup: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
apt-get install -y -qq --no-install-recommends $missing
