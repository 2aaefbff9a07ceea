#!/usr/bin/env bash
# End-to-end gradient synchronisation (issue 5): hvd-bench-grads against Open
# MPI on this machine, over loopback. Installs the peer's Debian packages if
# missing (as root), builds bench/peers/mpi_grads.c into build/peers/, builds
# hvd into $HVD_BUILD if its hvd-bench-grads is missing, then for each np and
# repetition runs, INTERLEAVED in an order rotated by one each repetition:
#   hvd_f1_c1 hvd_f0_c1 hvd_f1_c0 hvd_f0_c0  hvd-bench-grads steps with fusion
#                                            on/off (1/0) and cache on/off,
#                                            each also timing one plain
#                                            allreduce of the same bytes
#   hvd_lat_c1 hvd_lat_c0                    hvd-bench-grads latency, cache on/off
#   mpi_steps                                mpi_grads steps (161 MPI_Allreduce
#                                            in order, and one of 25.6 M floats)
#   mpi_lat                                  mpi_grads latency (4 B)
# Raw outputs (<run>.txt, its stderr in <run>.err), env.txt and runs.log (each
# run's start time and load average) land in build/compare-grads/<UTC timestamp>/,
# with summary.md, the markdown tables this prints (see bench/peers/summarize_grads.py).
# Exits 1 if any run fails, times out or reports wrong values.
#
# Environment (defaults):
#   REPS=3            repetitions per np
#   NPS="2 4"         rank counts
#   STEPS=20 WARMUP=3 timed and untimed gradient steps per run
#   LAT_ITERS=5000 LAT_WARMUP=500   timed and untimed 4-byte ops per run
#   HVD_BUILD=build   hvd's CMake build directory (configured and built with
#                     -DHVD_WERROR=ON if bin/hvd-bench-grads is missing there)
#   RUN_TIMEOUT=300   seconds before one program run is killed
# Other HOROVOD_* / HVD_* variables (HOROVOD_CYCLE_TIME, HVD_FUSION_INPLACE_BYTES,
# HVD_SPIN_US, ...) pass through to hvd's ranks and are recorded in env.txt;
# the script sets HOROVOD_FUSION_THRESHOLD and HOROVOD_CACHE_CAPACITY per run.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
NPS=${NPS:-"2 4"}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
LAT_ITERS=${LAT_ITERS:-5000}
LAT_WARMUP=${LAT_WARMUP:-500}
HVD_BUILD=${HVD_BUILD:-build}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
BENCH=$HVD_BUILD/bin/hvd-bench-grads

say() { echo "compare-grads: $*" >&2; }

# --- packages ---------------------------------------------------------------
# shellcheck source=bench/peers/lib.sh
. bench/peers/lib.sh
ensure_packages openmpi-bin libopenmpi-dev

# --- peer -------------------------------------------------------------------
mkdir -p build/peers
MPI_BIN=build/peers/mpi_grads
if [ ! -x "$MPI_BIN" ] || [ bench/peers/mpi_grads.c -nt "$MPI_BIN" ] ||
    [ bench/resnet50_params.h -nt "$MPI_BIN" ]; then
    say "building $MPI_BIN"
    mpicc -O2 -std=c11 -Wall -Wextra -Wshadow -Ibench -o "$MPI_BIN" bench/peers/mpi_grads.c -lm
fi

# --- hvd --------------------------------------------------------------------
if [ ! -x "$BENCH" ]; then
    say "$BENCH missing: building hvd into $HVD_BUILD (./scripts/setup.sh, cmake -DHVD_WERROR=ON)"
    ./scripts/setup.sh >&2
    cmake -S . -B "$HVD_BUILD" -DHVD_WERROR=ON >&2
    cmake --build "$HVD_BUILD" -j "$(nproc)" --target hvd-bench-grads >&2
fi
if [ ! -x "$BENCH" ]; then
    say "$BENCH still missing after the build"
    exit 1
fi

# --- runs -------------------------------------------------------------------
start_run build/compare-grads

{
    describe_machine
    echo "hvd build: $HVD_BUILD ($(grep -m1 '^CMAKE_BUILD_TYPE' "$HVD_BUILD/CMakeCache.txt" 2>/dev/null || echo 'build type unknown'))"
    echo "REPS=$REPS NPS=$NPS STEPS=$STEPS WARMUP=$WARMUP LAT_ITERS=$LAT_ITERS LAT_WARMUP=$LAT_WARMUP"
    echo "environment:"
    env | grep -E '^(HOROVOD|HVD)_' | sort | sed 's/^/  /' || true
} >"$OUT/env.txt"

run_hvd_steps() { # np fusion cache file
    timeout "$RUN_TIMEOUT" "$BENCH" steps --np "$1" --fusion "$2" --cache "$3" \
        -n "$STEPS" -w "$WARMUP" -c 1 >"$4" 2>"${4%.txt}.err"
}

run_hvd_latency() { # np cache file
    timeout "$RUN_TIMEOUT" "$BENCH" latency --np "$1" --cache "$2" \
        -n "$LAT_ITERS" -w "$LAT_WARMUP" -c 1 >"$3" 2>"${3%.txt}.err"
}

run_mpi() { # np mode file
    # pml ob1 keeps UCX/PSM (which would use shared memory) out of the way.
    local n=$STEPS w=$WARMUP
    [ "$2" = latency ] && n=$LAT_ITERS w=$LAT_WARMUP
    timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe --mca pml ob1 \
        --mca btl tcp,self --mca btl_tcp_if_include lo -np "$1" \
        "$MPI_BIN" "$2" -n "$n" -w "$w" -c 1 >"$3" 2>"${3%.txt}.err"
}

RUNS=(hvd_f1_c1 mpi_steps hvd_f0_c1 hvd_lat_c1 hvd_f1_c0 mpi_lat hvd_f0_c0 hvd_lat_c0)
start=$(date +%s)
for np in $NPS; do
    for ((rep = 1; rep <= REPS; rep++)); do
        order=("${RUNS[@]}")
        for ((k = 1; k < rep; k++)); do
            order=("${order[@]:1}" "${order[0]}")
        done
        for run in "${order[@]}"; do
            file="$OUT/np${np}_rep${rep}_$run.txt"
            say "np=$np rep=$rep/$REPS: $run ($(($(date +%s) - start)) s)"
            # Other work on the machine shows here: the load average before each run.
            echo "$(date -u +%H:%M:%S) np=$np rep=$rep $run loadavg $(cut -d' ' -f1-3 /proc/loadavg)" \
                >>"$OUT/runs.log"
            case $run in
            hvd_f1_c1) run_hvd_steps "$np" on on "$file" ;;
            hvd_f0_c1) run_hvd_steps "$np" off on "$file" ;;
            hvd_f1_c0) run_hvd_steps "$np" on off "$file" ;;
            hvd_f0_c0) run_hvd_steps "$np" off off "$file" ;;
            hvd_lat_c1) run_hvd_latency "$np" on "$file" ;;
            hvd_lat_c0) run_hvd_latency "$np" off "$file" ;;
            mpi_steps) run_mpi "$np" steps "$file" ;;
            mpi_lat) run_mpi "$np" latency "$file" ;;
            esac || fail "$run np=$np rep=$rep exited $? (see $file, ${file%.txt}.err)"
        done
    done
done
echo "loadavg at the end: $(cat /proc/loadavg)" >>"$OUT/env.txt"
echo "elapsed: $(($(date +%s) - start)) s" >>"$OUT/env.txt"

# --- summary ----------------------------------------------------------------
if ! /usr/bin/python3 bench/peers/summarize_grads.py "$OUT" | tee "$OUT/summary.md"; then
    fail "summary: wrong values or missing results (see above)"
fi
say "raw outputs in $OUT"
[ "$failures" -eq 0 ] || exit 1
