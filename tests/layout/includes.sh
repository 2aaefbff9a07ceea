#!/bin/sh
# Module boundaries the compiler does not see: tests/layout/includes.sh [SRC_ROOT]
#  - the tune module's insides (tune_private.h, bayes.h) are included only
#    inside src/tune/ and by its tests (tests/test_tune.c); everyone else
#    sees tune/tune.h;
#  - in the library and the launcher, only src/rendezvous/ includes
#    libmicrohttpd's, libcurl's or cJSON's headers, and nothing but cuda/
#    CUDA's or NCCL's (tests, benchmarks and fuzz harnesses may talk to
#    the real thing).
# Exit 0 when they hold, 1 naming each offending file and line.
set -u
root=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cd "$root" || exit 1

hits=$(
    git ls-files '*.c' '*.h' '*.cu' | while IFS= read -r f; do
        case $f in
        src/tune/* | tests/test_tune.c) ;;
        *) grep -Hn '#include "\(tune/\)\{0,1\}\(tune_private\|bayes\)\.h"' "$f" |
            sed 's/$/  (the tune module'"'"'s insides)/' ;;
        esac
        case $f in
        src/rendezvous/*) ;;
        src/* | launcher/*)
            grep -HnE '#include <(microhttpd|curl/curl|cjson/cJSON)\.h>' "$f" |
                sed 's/$/  (only src\/rendezvous\/ may)/'
            ;;
        esac
        case $f in
        src/* | launcher/*)
            grep -HnE '#include <(cuda|cuda_runtime|nccl)[a-z_]*\.h>' "$f" |
                sed 's/$/  (only cuda\/ may)/'
            ;;
        esac
    done
)
[ -z "$hits" ] && exit 0
echo "$hits" | sed 's/^/layout: /' >&2
exit 1
