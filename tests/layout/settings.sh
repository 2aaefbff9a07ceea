#!/bin/sh
# Every setting is read through the settings table (src/common/settings.def):
#   tests/layout/settings.sh [SRC_ROOT]
# In the library, the launcher and the benchmarks, no getenv() or
# hvd_env_*() call names an HVD_ or HOROVOD_ variable: such a read goes
# through hvd_setting_*(HVD_SET_...), whose entry gives the variable its
# type, range, default and documentation. Exit 0 when that holds, 1 naming
# each offending line.
set -u
root=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cd "$root" || exit 1

hits=$(git ls-files 'src/*.c' 'src/*.h' 'launcher/*.c' 'launcher/*.h' 'bench/*.c' |
    xargs grep -HnE '(getenv|hvd_env_[a-z]+)\(\s*"(HVD|HOROVOD)_')
if [ -n "$hits" ]; then
    echo "$hits" | sed 's/$/  (read it with hvd_setting_*: declare it in src\/common\/settings.def)/'
    exit 1
fi
exit 0
