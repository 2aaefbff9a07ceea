#!/bin/sh
# `pip install .` and `pip wheel .` as a user runs them, offline, with
# Debian's setuptools and wheel: a git clone of this repository's HEAD (so
# neither build/ nor uncommitted changes take part) is installed into a
# fresh venv that sees Debian's torch, then
#   - the venv's python imports hvd.torch without hvdrun, from the venv, with
#     the venv's libhvd.so.0, and finds no `horovod`;
#   - the venv's hvdrun trains examples/pytorch/train_digits.py on 2 ranks;
#   - hvdrun --horovod-compat gives the ranks hvd's `horovod`;
#   - pip wheel . makes one wheel with the programs, the library and both
#     Python trees, and `horovod` only inside the compat tree;
#   - pip uninstall removes every file it installed.
# Exits 77 (skipped) where the interpreter lacks venv, pip, setuptools,
# wheel, torch or scikit-learn, or git, cmake or the checkout is missing.
# Usage: pip.sh
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${HVD_TEST_PYTHON:-/usr/bin/python3}

skip() {
    echo "skipped: $*"
    exit 77
}
fail() {
    echo "pip check: $*" >&2
    exit 1
}

for tool in git cmake; do
    command -v "$tool" >/dev/null || skip "no $tool (./scripts/setup.sh installs it)"
done
git -C "$root" rev-parse --verify -q HEAD >/dev/null || skip "$root is not a git checkout"
"$python" -c 'import ensurepip, torch, sklearn' 2>/dev/null ||
    skip "$python lacks venv, torch or scikit-learn (./scripts/setup.sh installs them)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv=$work/venv
src=$work/src
# Nothing from the caller's environment decides which hvd runs, and nothing
# comes from PyPI or goes into pip's cache.
unset PYTHONPATH HVD_LIBRARY HOROVOD_RANK HOROVOD_SIZE
export PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

"$python" -m venv --system-site-packages "$venv" >"$work/log" 2>&1 ||
    skip "$python -m venv failed (python3-venv missing?): $(tail -n 1 "$work/log")"
"$venv/bin/python" -c 'import setuptools, wheel, pip' 2>/dev/null ||
    skip "the venv lacks pip, setuptools or wheel (python3-pip, python3-setuptools, python3-wheel)"
git clone -q "$root" "$src"

# step NAME COMMAND...: runs COMMAND in the clone with its output in a log,
# shown when it fails.
step() {
    name=$1
    shift
    (cd "$src" && "$@") >"$work/log" 2>&1 || {
        tail -n 40 "$work/log" >&2
        fail "$name failed (the last lines of its output are above)"
    }
}

step "pip install ." "$venv/bin/pip" install --no-build-isolation .
for program in hvdrun hvd-rendezvous; do
    [ -x "$venv/bin/$program" ] || fail "pip install put no $program in $venv/bin"
done
step "hvd-rendezvous --version" "$venv/bin/hvd-rendezvous" --version

# The venv's python on its own: hvd and its library from the venv, no horovod.
(cd "$work" && "$venv/bin/python" - "$venv") <<'EOF' || fail "the venv's python: see above"
import importlib.util
import os
import sys

import hvd.torch
from hvd import _lib

venv = os.path.realpath(sys.argv[1])


def inside(path):
    return os.path.realpath(path).startswith(venv + os.sep)


assert inside(hvd.__file__), 'hvd comes from %s, not the venv' % hvd.__file__
assert inside(_lib.lib._name), 'libhvd comes from %s, not the venv' % _lib.lib._name
spec = importlib.util.find_spec('horovod')
assert spec is None or not inside(spec.origin), 'plain python imports hvd\'s horovod'
EOF

step "hvdrun -np 2 train_digits.py" "$venv/bin/hvdrun" -np 2 "$venv/bin/python" \
    examples/pytorch/train_digits.py --expect-accuracy 0.95
grep -q "parameters identical on 2 ranks" "$work/log" || {
    cat "$work/log" >&2
    fail "train_digits.py did not report identical parameters on 2 ranks"
}

step "hvdrun --horovod-compat" "$venv/bin/hvdrun" -np 2 --horovod-compat "$venv/bin/python" -c '
import os, sys, torch
import horovod, horovod.torch as hvd
here = os.path.realpath(horovod.__file__)
assert here.startswith(os.path.realpath(sys.argv[1]) + os.sep), here
hvd.init()
assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [2.0] * 3
' "$venv/lib/hvd/python/compat"

step "pip wheel ." "$venv/bin/pip" wheel --no-build-isolation --no-deps -w "$work/wheels" .
"$venv/bin/python" - "$work/wheels" <<'EOF' || fail "the wheel: see above"
import os
import sys
import zipfile

wheels = os.listdir(sys.argv[1])
assert len(wheels) == 1 and wheels[0].endswith('.whl'), wheels
with zipfile.ZipFile(os.path.join(sys.argv[1], wheels[0])) as z:
    names = z.namelist()
data = '%s.data/data/' % '-'.join(wheels[0].split('-')[:2])
for name in ['hvd.pth', data + 'bin/hvdrun', data + 'bin/hvd-rendezvous',
             data + 'lib/libhvd.so.0', data + 'lib/hvd/python/hvd/__init__.py',
             data + 'lib/hvd/python/hvd/torch/__init__.py',
             data + 'lib/hvd/python/compat/horovod/torch/__init__.py']:
    assert name in names, '%s lacks %s' % (wheels[0], name)
stray = [n for n in names if '/horovod/' in n and not n.startswith(data + 'lib/hvd/python/compat/')]
assert not stray, 'horovod outside the compat tree: %s' % stray
EOF

step "pip uninstall" "$venv/bin/pip" uninstall -y hvd
left=$(find "$venv/bin/hvdrun" "$venv/bin/hvd-rendezvous" "$venv/lib/libhvd.so.0" \
    "$venv/lib/hvd" "$venv"/lib/python*/site-packages/hvd.pth -type f 2>/dev/null || true)
[ -z "$left" ] || fail "pip uninstall left $left"
echo "pip check: ok"
