"""Data-parallel training of a small CNN on scikit-learn's handwritten digits
with hvd's PyTorch API.

The digits (8x8 images, 1797 of them) ship with scikit-learn, so nothing is
downloaded. Every rank splits them the same seeded way into a training and a
test set, trains on its own shard of the training set (rank::size) and
averages gradients with hvd.DistributedOptimizer. At the end every rank
checks that its parameters are bitwise equal to rank 0's.

Run it with 4 ranks, or as one process:

    build/bin/hvdrun -np 4 /usr/bin/python3 examples/pytorch/train_digits.py
    PYTHONPATH=python /usr/bin/python3 examples/pytorch/train_digits.py --epochs 5

Exit status: 0 on success; 1 when the test accuracy is below
--expect-accuracy or the ranks' parameters differ; 2 for bad arguments.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hvd.torch as hvd

TEST_FRACTION = 0.2


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not an integer' % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError('must be at least 1, not %d' % value)
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not a number' % text) from None
    if not value > 0:
        raise argparse.ArgumentTypeError('must be greater than 0, not %s' % text)
    return value


def fraction(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not a number' % text) from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError('must be between 0 and 1, not %s' % text)
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Train a small CNN on the sklearn digits with hvd.DistributedOptimizer.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--epochs', type=positive_int, default=10,
                        help='passes over the training set')
    parser.add_argument('--batch-size', type=positive_int, default=32,
                        help='samples per step on each rank')
    parser.add_argument('--lr', type=positive_float, default=0.01,
                        help='learning rate of one rank; the job uses lr * size')
    parser.add_argument('--seed', type=int, default=42,
                        help='seed of the train/test split, the shuffling and the weights')
    parser.add_argument('--expect-accuracy', type=fraction, default=None, metavar='X',
                        help='exit 1 if the final test accuracy is below X (0 to 1)')
    return parser.parse_args(argv)


class DigitsNet(nn.Module):
    """Two 3x3 convolutions, one pooling, two dense layers: about 40k weights."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def split_digits(seed):
    """(train_x, train_y, test_x, test_y): the same on every rank for one seed."""
    digits = load_digits()
    pixels = digits.data.astype(np.float32)
    # Centred and scaled: plain 0..16 ink levels train much more slowly.
    pixels = (pixels - pixels.mean()) / pixels.std()
    images = torch.from_numpy(pixels).reshape(-1, 1, 8, 8)
    labels = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.from_numpy(np.random.RandomState(seed).permutation(len(labels)))
    n_test = int(len(labels) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return images[train], labels[train], images[test], labels[test]


def shard(x, y, rank, size):
    """This rank's rows rank::size. The training set is first cut to a multiple
    of size, so that every rank takes the same number of steps: a rank with
    one step more would wait for gradients the others never send."""
    n = len(y) - len(y) % size
    return x[rank:n:size], y[rank:n:size]


def train_epoch(model, optimizer, x, y, batch_size, generator):
    """One pass over this rank's shard in a fresh random order; returns the
    mean loss over the rank's batches."""
    model.train()
    order = torch.randperm(len(y), generator=generator)
    total, batches = 0.0, 0
    for start in range(0, len(y), batch_size):
        idx = order[start:start + batch_size]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        total += loss.item()
        batches += 1
    return total / batches


def job_mean(value, name):
    """The mean of a Python float over the ranks."""
    return hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name).item()


def test_accuracy(model, x, y):
    """Accuracy over the whole test set: each rank scores its shard, and the
    counts are summed over the ranks."""
    model.eval()
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum()
    counts = torch.tensor([correct.item(), len(y)], dtype=torch.int64)
    counts = hvd.allreduce(counts, op=hvd.Sum, name='test.counts')
    return counts[0].item() / counts[1].item()


def flat_state(model):
    """Every parameter and buffer of the model in one flat float tensor, in
    state_dict order (the same on every rank)."""
    return torch.cat([t.detach().reshape(-1).float() for t in model.state_dict().values()])


def ranks_differing_from_root(model):
    """How many ranks hold parameters that are not bitwise rank 0's (the same
    answer on every rank), and whether this rank is one of them."""
    mine = flat_state(model)
    root = hvd.broadcast(mine, root_rank=0, name='final.parameters')
    # Compare bit patterns: == would call -0.0 and 0.0 equal and NaN unequal.
    differs = not torch.equal(mine.view(torch.int32), root.view(torch.int32))
    count = hvd.allreduce(torch.tensor([int(differs)]), op=hvd.Sum, name='final.differs')
    return count.item(), differs


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    # Ranks on one host share its cores: more threads than cores only thrash.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    # Each rank starts from its own random weights, on purpose: the broadcast
    # below must make them rank 0's.
    torch.manual_seed(args.seed + hvd.rank())

    train_x, train_y, test_x, test_y = split_digits(args.seed)
    train_x, train_y = shard(train_x, train_y, hvd.rank(), hvd.size())
    test_x, test_y = test_x[hvd.rank()::hvd.size()], test_y[hvd.rank()::hvd.size()]

    model = DigitsNet()
    # The gradients are averaged, so the step of size ranks together is one
    # of a batch size times larger: scale the learning rate to match.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    log('training on %d rank(s): %d training samples per rank, %d test samples'
        % (hvd.size(), len(train_y), len(test_y) * hvd.size()))
    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    started = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        loss = train_epoch(model, optimizer, train_x, train_y, args.batch_size, generator)
        log('epoch %d  loss %.4f' % (epoch, job_mean(loss, 'train.loss')))
    seconds = time.monotonic() - started
    accuracy = test_accuracy(model, test_x, test_y)

    differing, mine_differs = ranks_differing_from_root(model)
    if mine_differs:
        print('rank %d: parameters differ from rank 0\'s after training' % hvd.rank(),
              file=sys.stderr, flush=True)
    if differing:
        log('test accuracy %.4f, parameters DIFFER on %d of %d ranks'
            % (accuracy, differing, hvd.size()))
        return 1
    log('test accuracy %.4f, parameters identical on %d rank%s (%.1f s of training)'
        % (accuracy, hvd.size(), '' if hvd.size() == 1 else 's', seconds))
    if args.expect_accuracy is not None and accuracy < args.expect_accuracy:
        log('test accuracy %.4f is below --expect-accuracy %.4f'
            % (accuracy, args.expect_accuracy))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
