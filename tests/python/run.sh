#!/bin/bash
# Runs one of hvd's Python test files under pytest, as ctest does:
#
#   tests/python/run.sh BIN_DIR NP TEST_FILE [PYTEST_ARGS...]
#   tests/python/run.sh BIN_DIR NP SCRIPT.py [ARGS...]
#
# A file not named test_*.py is a program (an example) run as it is, with
# its arguments, instead of a pytest file.
#
# NP > 0: `BIN_DIR/hvdrun -np NP /usr/bin/python3 -m pytest ...`, so every
# rank runs the whole file (tests/python/conftest.py joins the job once).
# NP = 0: no hvdrun; one plain pytest process, for files that start their
# own jobs (or need none). Its PYTHONPATH gets the build's hvd package, as
# hvdrun gives a rank, and HVD_BIN_DIR names BIN_DIR for the jobs it starts.
#
# pytest runs from the repository root with -q -x and without its cache
# plugin (no .pytest_cache in the tree); the whole run is under `timeout`, so
# a hang fails the test instead of stalling ctest. Exit status: pytest's (or
# timeout's 124), or 77 (ctest's "skipped") when /usr/bin/python3 lacks
# torch or pytest, or the build is a ThreadSanitizer one. In an
# AddressSanitizer build (HVD_SANITIZE contains "address" in
# BUILD_DIR/CMakeCache.txt, BUILD_DIR being BIN_DIR/..) the interpreter is
# not instrumented, so the compiler's libasan is preloaded; leak checking is
# off (the interpreter keeps memory until exit by design; the C suites check
# hvd's leaks).
set -eu

TIME_LIMIT=240 # seconds for the whole file; ctest's own limit is 300

usage() {
    echo "usage: $0 BIN_DIR NP TEST_FILE [PYTEST_ARGS...]  (NP 0: without hvdrun)" >&2
    exit 2
}

[ $# -ge 3 ] || usage
bin=$(cd "$1" && pwd)
np=$2
file=$3
shift 3
case $np in '' | *[!0-9]*) usage ;; esac
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(dirname "$bin")

. "$(dirname "$0")/python_env.sh"
# A sanitizer's report goes to file descriptor 2 and ends the process;
# pytest's default capture would hide it in a temporary file. Capturing at
# the level of sys.stdout/sys.stderr only leaves it on the terminal.
capture=()
[ -z "$sanitize" ] || capture=(--capture=sys)

cd "$root"
case $(basename "$file") in
test_*.py) pytest=("$PYTHON" -m pytest -q -x -p no:cacheprovider ${capture[@]+"${capture[@]}"} "$file" "$@") ;;
*) pytest=("$PYTHON" "$file" "$@") ;;
esac
if [ "$np" -eq 0 ]; then
    export PYTHONPATH="$build/lib/hvd/python${PYTHONPATH:+:$PYTHONPATH}"
    export HVD_BIN_DIR="$bin"
    set +e
    with_preload timeout -k 10 "$TIME_LIMIT" "${pytest[@]}"
else
    set +e
    with_preload timeout -k 10 "$TIME_LIMIT" "$bin/hvdrun" -np "$np" "${pytest[@]}"
fi
exit $?
