# Sourced by the Python test scripts (run.sh, elastic.sh) with $build set to
# the build directory: the environment Python needs to run against that
# build's libhvd. It exits 77 (ctest's "skipped") when /usr/bin/python3
# lacks torch or pytest, or the build is a ThreadSanitizer one. In an
# AddressSanitizer build the interpreter is not instrumented, so the
# compiler's libasan is preloaded, with leak checking off (the interpreter
# keeps memory until exit by design; the C suites check hvd's leaks):
# `with_preload CMD...` runs a command with it. $sanitize names the build's
# sanitizers. HVD_TEST_PYTHON names another interpreter (a GPU machine's,
# whose torch has CUDA); the default is Debian's.

PYTHON=${HVD_TEST_PYTHON:-/usr/bin/python3}

if ! "$PYTHON" -c 'import torch, pytest' 2>/dev/null; then
    echo "skipped: $PYTHON cannot import torch and pytest (./scripts/setup.sh installs them)"
    exit 77
fi

export PYTHONDONTWRITEBYTECODE=1

preload=
with_preload() {
    if [ -n "$preload" ]; then LD_PRELOAD=$preload "$@"; else "$@"; fi
}

# The build's sanitizers, from its cache ("HVD_SANITIZE:STRING=address,undefined").
sanitize=$(sed -n 's/^HVD_SANITIZE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
case $sanitize in
*thread*)
    echo "skipped: the Python tests do not run against a ThreadSanitizer build" \
        "(the interpreter and torch are not instrumented)"
    exit 77
    ;;
*address*)
    # libasan first of all; libstdc++ with it, so that ASan's __cxa_throw
    # interceptor finds the real one (torch throws C++ exceptions, which
    # would otherwise stop the process in a failed ASan CHECK).
    cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
    libasan=$("${cc:-gcc}" -print-file-name=libasan.so)
    libstdcxx=$("${cc:-gcc}" -print-file-name=libstdc++.so.6)
    for lib in "$libasan" "$libstdcxx"; do
        if [ ! -f "$lib" ]; then
            echo "$0: ${cc:-gcc} does not know where '$lib' is; cannot run Python" \
                "against an AddressSanitizer build" >&2
            exit 1
        fi
    done
    # Only for the commands that start Python (`with_preload CMD...`): the
    # script's own tools (pgrep, sed) are better off without it.
    preload="$libasan:$libstdcxx${LD_PRELOAD:+:$LD_PRELOAD}"
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    ;;
esac
