#!/bin/sh
# Sets up a fresh Debian 12 machine, builds hvd and runs the main job:
# data-parallel training of a small MLP (examples/train_mlp.c) on 4 local
# ranks started by hvdrun. Rank 0 prints the loss as it falls; at the end
# every rank checks that its parameters are bitwise identical to rank 0's.
set -eu
cd "$(dirname "$0")/.."

./scripts/setup.sh
dir=$(./scripts/build.sh | tail -n 1)

echo "\$ hvdrun -np 4 $dir/bin/train_mlp --steps 300 --expect-loss-below 0.3"
"$dir/bin/hvdrun" -np 4 "$dir/bin/train_mlp" --steps 300 --expect-loss-below 0.3
