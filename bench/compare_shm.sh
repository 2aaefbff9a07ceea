#!/usr/bin/env bash
# Same-host collectives side by side: hvd over shared memory (the default),
# hvd over TCP (HVD_SHM=0) and Open MPI over shared memory (--mca btl
# vader,self), for allreduce, allgather and broadcast (float32), INTERLEAVED
# per np, collective and repetition (the order rotates each repetition).
# Installs Open MPI's Debian packages if missing (as root), builds the peer
# into build/peers/, keeps raw outputs under build/compare-shm/<UTC time>/,
# measures this machine's memory bandwidth (hvd-bench-shm: one thread's
# memcpy and add) and prints one markdown table per np and collective
# (medians over repetitions). Exits 1 if any run fails or reports wrong
# elements.
#
# Environment (defaults):
#   REPS=5            repetitions
#   NPS="2 4"         rank counts
#   COLLS="allreduce allgather broadcast"
#   SIZES="8 64 512 4096 32768 65536 262144 1048576 4194304 16777216 67108864 268435456"
#                     bytes per rank (an allgather's output is np times that)
#   TARGET_S=0.25     seconds of timed ops per size
#   SYSTEMS="hvd tcp mpi"
#   RUN_TIMEOUT=900   seconds before one program run is killed
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-5}
NPS=${NPS:-"2 4"}
COLLS=${COLLS:-"allreduce allgather broadcast"}
SIZES=${SIZES:-"8 64 512 4096 32768 65536 262144 1048576 4194304 16777216 67108864 268435456"}
TARGET_S=${TARGET_S:-0.25}
SYSTEMS=${SYSTEMS:-"hvd tcp mpi"}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
HVD_BENCH=build/bin/hvd-bench

say() { echo "compare-shm: $*" >&2; }

# shellcheck source=bench/peers/lib.sh
. bench/peers/lib.sh
ensure_packages openmpi-bin libopenmpi-dev
mkdir -p build/peers
MPI_BIN=build/peers/mpi_allreduce
if [ ! -x "$MPI_BIN" ] || [ bench/peers/mpi_allreduce.c -nt "$MPI_BIN" ]; then
    say "building $MPI_BIN"
    mpicc -O2 -std=c11 -Wall -Wextra -Wshadow -o "$MPI_BIN" bench/peers/mpi_allreduce.c
fi
if [ ! -x "$HVD_BENCH" ]; then
    say "$HVD_BENCH missing: building hvd"
    ./scripts/setup.sh >&2
    ./scripts/build.sh >&2
fi

start_run build/compare-shm

{
    describe_machine
    echo "REPS=$REPS NPS=$NPS COLLS=$COLLS SIZES=$SIZES TARGET_S=$TARGET_S SYSTEMS=$SYSTEMS"
} >"$OUT/env.txt"

# The machine's memory bandwidth, for the tables' last column.
build/bin/hvd-bench-shm >"$OUT/membw.txt" 2>&1 || fail "hvd-bench-shm (see $OUT/membw.txt)"

run_one() { # system np coll file
    local sys=$1 np=$2 coll=$3 file=$4
    case $sys in
    hvd | tcp)
        local shm=1
        [ "$sys" = tcp ] && shm=0
        HVD_SHM=$shm timeout "$RUN_TIMEOUT" "$HVD_BENCH" "$coll" --np "$np" \
            --sizes "${SIZES// /,}" -T "$TARGET_S" -w 5 -c 1 -d float32 >"$file" 2>&1
        ;;
    mpi)
        # shellcheck disable=SC2086 # SIZES is a word list
        timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe --mca pml ob1 \
            --mca btl vader,self -np "$np" "$MPI_BIN" -C "$coll" -t "$TARGET_S" $SIZES \
            >"$file" 2>"${file%.txt}.err"
        ;;
    esac
}

read -r -a systems <<<"$SYSTEMS"
for np in $NPS; do
    for coll in $COLLS; do
        for ((rep = 1; rep <= REPS; rep++)); do
            order=("${systems[@]}")
            for ((k = 1; k < rep; k++)); do
                order=("${order[@]:1}" "${order[0]}")
            done
            for sys in "${order[@]}"; do
                file="$OUT/np${np}_${coll}_rep${rep}_$sys.txt"
                say "np=$np $coll rep=$rep/$REPS: $sys"
                run_one "$sys" "$np" "$coll" "$file" || fail "$sys np=$np $coll rep=$rep (see $file)"
            done
        done
    done
done

if ! /usr/bin/python3 bench/peers/summarize_shm.py "$OUT" | tee "$OUT/summary.md"; then
    fail "summary: wrong elements or missing results (see above)"
fi
say "raw outputs in $OUT"
[ "$failures" -eq 0 ] || exit 1
