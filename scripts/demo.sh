#!/bin/sh
# Sets up a fresh Debian 12 machine, builds hvd and runs the main job:
# data-parallel training of a small CNN on scikit-learn's handwritten digits
# with hvd's PyTorch API (examples/pytorch/train_digits.py) on 4 local ranks
# started by hvdrun. Rank 0 prints the loss per epoch and the test accuracy
# (at least 95% or the job fails); at the end every rank checks that its
# parameters are bitwise identical to rank 0's.
set -eu
cd "$(dirname "$0")/.."

./scripts/setup.sh
dir=$(./scripts/build.sh | tail -n 1)

echo "\$ hvdrun -np 4 /usr/bin/python3 examples/pytorch/train_digits.py --expect-accuracy 0.95"
"$dir/bin/hvdrun" -np 4 /usr/bin/python3 examples/pytorch/train_digits.py --expect-accuracy 0.95
