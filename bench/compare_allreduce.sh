#!/usr/bin/env bash
# Side-by-side allreduce (float32 sum, loopback TCP) of hvd, Open MPI and Gloo
# on this machine: installs the peers' Debian packages if missing (as root),
# builds bench/peers/ into build/peers/, builds hvd if build/bin/hvd-bench is
# missing, runs the three INTERLEAVED for each np and repetition (rep 1: hvd,
# mpi, gloo; rep 2: mpi, gloo, hvd; ...), keeps the raw outputs under
# build/compare/<timestamp>/ and prints one markdown table per np (medians
# over repetitions). Exits 1 if any run fails or reports wrong elements.
#
# Environment (defaults):
#   REPS=3             repetitions per np
#   NPS="2 4"          rank counts
#   WITH_256M=0        1 adds the 256 MiB size
#   TARGET_S=0.4       seconds of timed ops per size (all three calibrate to it)
#   GLOO_ALGOS=...     comma list, default all: new_ring,new_bcube,ring,
#                      ring_chunked,halving_doubling,bcube
#   SKIP_HVD=0         1 runs only the peers
#   HVD_BENCH=build/bin/hvd-bench
#   RUN_TIMEOUT=900    seconds before one program run is killed
# See bench/peers/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
NPS=${NPS:-"2 4"}
WITH_256M=${WITH_256M:-0}
TARGET_S=${TARGET_S:-0.4}
GLOO_ALGOS=${GLOO_ALGOS:-new_ring,new_bcube,ring,ring_chunked,halving_doubling,bcube}
SKIP_HVD=${SKIP_HVD:-0}
HVD_BENCH=${HVD_BENCH:-build/bin/hvd-bench}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}

SIZES="8 4096 65536 1048576 16777216 67108864"
if [ "$WITH_256M" = 1 ]; then
    SIZES="$SIZES 268435456"
fi

say() { echo "compare: $*" >&2; }

# --- packages ---------------------------------------------------------------
# shellcheck source=bench/peers/lib.sh
. bench/peers/lib.sh
ensure_packages openmpi-bin libopenmpi-dev libgloo-dev

# --- peers ------------------------------------------------------------------
mkdir -p build/peers
MPI_BIN=build/peers/mpi_allreduce
GLOO_BIN=build/peers/gloo_allreduce
if [ ! -x "$MPI_BIN" ] || [ bench/peers/mpi_allreduce.c -nt "$MPI_BIN" ]; then
    say "building $MPI_BIN"
    mpicc -O2 -std=c11 -Wall -Wextra -Wshadow -o "$MPI_BIN" bench/peers/mpi_allreduce.c
fi
if [ ! -x "$GLOO_BIN" ] || [ bench/peers/gloo_allreduce.cc -nt "$GLOO_BIN" ]; then
    say "building $GLOO_BIN"
    g++ -O2 -std=c++17 -Wall -Wextra -Wshadow -o "$GLOO_BIN" bench/peers/gloo_allreduce.cc \
        -lgloo -pthread
fi

# --- hvd --------------------------------------------------------------------
run_hvd=1
if [ "$SKIP_HVD" = 1 ]; then
    say "SKIP_HVD=1: hvd not run, its columns stay empty"
    run_hvd=0
else
    if [ ! -x "$HVD_BENCH" ] && [ "$HVD_BENCH" = build/bin/hvd-bench ]; then
        say "$HVD_BENCH missing: building hvd (./scripts/setup.sh, ./scripts/build.sh)"
        ./scripts/setup.sh >&2
        ./scripts/build.sh >&2
    fi
    if [ ! -x "$HVD_BENCH" ]; then
        say "$HVD_BENCH not found (not built in this tree yet?): hvd skipped, its columns stay empty"
        run_hvd=0
    fi
fi

# --- runs -------------------------------------------------------------------
start_run build/compare

{
    describe_machine
    echo "libgloo-dev: $(dpkg-query -W -f='${Version}' libgloo-dev)"
    echo "REPS=$REPS NPS=$NPS SIZES=$SIZES TARGET_S=$TARGET_S GLOO_ALGOS=$GLOO_ALGOS"
    echo "run_hvd=$run_hvd HVD_BENCH=$HVD_BENCH"
} >"$OUT/env.txt"

# Like the peers: one process per repetition runs every size, each timed
# for about TARGET_S after a warmup and a doubling calibration.
run_hvd_bench() { # np file
    timeout "$RUN_TIMEOUT" "$HVD_BENCH" allreduce --np "$1" --sizes "${SIZES// /,}" \
        -T "$TARGET_S" -w 5 -c 1 -d float32 -o sum >"$2" 2>&1
}

run_mpi() { # np file
    # pml ob1 keeps UCX/PSM (which would use shared memory) out of the way.
    # shellcheck disable=SC2086 # SIZES is a word list
    timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe --mca pml ob1 \
        --mca btl tcp,self --mca btl_tcp_if_include lo -np "$1" \
        "$MPI_BIN" -t "$TARGET_S" $SIZES >"$2" 2>"${2%.txt}.err"
}

run_gloo() { # np file
    local np=$1 out=$2 store r rc=0 pids=()
    store=$(mktemp -d "$OUT/gloo-store.XXXXXX")
    for ((r = 0; r < np; r++)); do
        # Rank 0 prints the results; the others only errors.
        local dest=/dev/null
        [ "$r" -eq 0 ] && dest=$out
        # shellcheck disable=SC2086
        timeout "$RUN_TIMEOUT" "$GLOO_BIN" --rank "$r" --size "$np" --store "$store" \
            --algos "$GLOO_ALGOS" -t "$TARGET_S" $SIZES >"$dest" 2>>"${out%.txt}.err" &
        pids+=("$!")
    done
    for r in "${pids[@]}"; do
        wait "$r" || rc=1
    done
    rm -rf "$store"
    return "$rc"
}

for np in $NPS; do
    for ((rep = 1; rep <= REPS; rep++)); do
        order=(hvd mpi gloo)
        for ((k = 1; k < rep; k++)); do
            order=("${order[@]:1}" "${order[0]}")
        done
        for sys in "${order[@]}"; do
            [ "$sys" = hvd ] && [ "$run_hvd" = 0 ] && continue
            file="$OUT/np${np}_rep${rep}_$sys.txt"
            say "np=$np rep=$rep/$REPS: $sys"
            case $sys in
            hvd) run_hvd_bench "$np" "$file" || fail "hvd np=$np rep=$rep (see $file)" ;;
            mpi) run_mpi "$np" "$file" || fail "mpi np=$np rep=$rep (see $file, ${file%.txt}.err)" ;;
            gloo) run_gloo "$np" "$file" || fail "gloo np=$np rep=$rep (see $file, ${file%.txt}.err)" ;;
            esac
        done
    done
done

# --- summary ----------------------------------------------------------------
if ! /usr/bin/python3 bench/peers/summarize.py --sizes "${SIZES// /,}" --gloo-detail "$OUT/gloo_algorithms.md" \
    "$OUT" | tee "$OUT/summary.md"; then
    fail "summary: wrong elements or missing results (see above)"
fi
say "raw outputs in $OUT"
[ "$failures" -eq 0 ] || exit 1
