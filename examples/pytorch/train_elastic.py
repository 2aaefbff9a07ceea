"""Elastic data-parallel training of a small MLP on synthetic data with
hvd's PyTorch API: the job goes on when workers fail and when hosts come
and go.

The data are points labelled by a fixed random "teacher" network, made
from one seed on every worker, so nothing is downloaded or read.

The state that survives a reset is a TorchState: the model, the optimizer,
an ElasticSampler (which remembers the samples processed this epoch) and
the epoch and step counters. The training function commits it every
--commit-every steps and at the end of each epoch. After a reset, the
learning rate is rescaled to the new number of workers, and the sampler
shares out what remains of the epoch among them. At the end every rank
checks that its parameters are bitwise rank 0's.

    printf '#!/bin/sh\\necho localhost:2\\n' > hosts.sh && chmod +x hosts.sh
    build/bin/hvdrun --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh \\
        /usr/bin/python3 examples/pytorch/train_elastic.py
    PYTHONPATH=python /usr/bin/python3 examples/pytorch/train_elastic.py   # one process

Rank 0 prints "start: N workers, epoch E, step S (after R resets)" when
training starts and after every reset, the loss every --print-every steps,
and "done: ... parameters identical on every rank" at the end. A worker
the driver removes says so and exits 0. --verbose adds hvd.elastic's log
lines (each reset, and whether the state was synced) on stderr.

Exit status: 0 on success; 1 when the ranks' parameters differ; 2 for bad
arguments.
"""

import argparse
import logging
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvd.torch as hvd

FEATURES, CLASSES = 32, 8
HOLD_MAX_S = 60


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not an integer' % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError('must be at least 1, not %d' % value)
    return value


def non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not a number' % text) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError('must be 0 or more, not %s' % text)
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Elastic training of an MLP on synthetic data with hvd.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--epochs', type=positive_int, default=3,
                        help='passes over the dataset')
    parser.add_argument('--samples', type=positive_int, default=1200,
                        help='size of the synthetic dataset')
    parser.add_argument('--batch-size', type=positive_int, default=16,
                        help='samples per step on each rank')
    parser.add_argument('--lr', type=non_negative_float, default=0.02,
                        help='learning rate of one worker; the job uses lr * size')
    parser.add_argument('--commit-every', type=positive_int, default=5,
                        help='steps between commits (and at the end of every epoch)')
    parser.add_argument('--print-every', type=positive_int, default=20,
                        help='steps between rank 0\'s loss lines (its mean loss since the '
                             'last one)')
    parser.add_argument('--step-ms', type=non_negative_float, default=0.0,
                        help='sleep this long after each step, to stretch a run')
    parser.add_argument('--seed', type=int, default=42,
                        help='seed of the data and of the sampler\'s order')
    parser.add_argument('--pid-file', metavar='PATH', default=None,
                        help='when the job reaches --pid-at-step, each worker writes its pid '
                             'to PATH.<rank> (for tests that kill a given rank)')
    parser.add_argument('--pid-at-step', type=positive_int, default=10,
                        help='the step at which --pid-file is written')
    parser.add_argument('--hold-file', metavar='PATH', default=None,
                        help='after --pid-at-step, wait while PATH exists (at most %d s), so '
                             'that a test can change the hosts mid-training' % HOLD_MAX_S)
    parser.add_argument('--verbose', action='store_true',
                        help='log hvd.elastic\'s resets and syncs on stderr')
    return parser.parse_args(argv)


def synthetic_dataset(samples, seed):
    """(point, label) pairs: Gaussian points labelled by the argmax of a
    random teacher network; the same on every worker for one seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    w1 = torch.randn(FEATURES, 32, generator=generator)
    w2 = torch.randn(32, CLASSES, generator=generator)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def make_model():
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def flat_parameters(model):
    return torch.cat([t.detach().reshape(-1).float() for t in model.state_dict().values()])


def ranks_differing_from_root(model):
    """How many ranks hold parameters that are not bitwise rank 0's (the same
    answer on every rank)."""
    mine = flat_parameters(model)
    root = hvd.broadcast(mine, root_rank=0, name='final.parameters')
    # Bit patterns: == would call -0.0 and 0.0 equal, and NaN unequal to itself.
    differs = not torch.equal(mine.view(torch.int32), root.view(torch.int32))
    if differs:
        print('rank %d: parameters differ from rank 0\'s' % hvd.rank(), file=sys.stderr,
              flush=True)
    count = hvd.allreduce(torch.tensor([int(differs)]), op=hvd.Sum, name='final.differs')
    return int(count.item())


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


class Run(object):
    """What a worker keeps outside the elastic state: its options, its data
    loader and how many resets it has been through."""

    def __init__(self, args, loader):
        self.args = args
        self.loader = loader
        self.resets = 0
        self.passed_mark = False
        self.losses = []  # rank 0's since the last loss line

    def on_reset(self, state):
        self.resets += 1
        scale_lr(state.optimizer, self.args.lr)

    def after_step(self, state, loss):
        args = self.args
        self.losses.append(loss)
        if state.step % args.print_every == 0:
            log('step %d: epoch %d, loss %.4f'
                % (state.step, state.epoch, sum(self.losses) / len(self.losses)))
            self.losses = []
        if state.step == args.pid_at_step and not self.passed_mark:
            if args.pid_file:
                write_pid(args.pid_file, hvd.rank())
            if args.hold_file:
                hold(args.hold_file)
            self.passed_mark = True
        if args.step_ms > 0:
            time.sleep(args.step_ms / 1000.0)


def scale_lr(optimizer, lr):
    # The gradients are averaged: size workers take one step of a batch
    # size times larger, so the step size follows.
    for group in optimizer.param_groups:
        group['lr'] = lr * hvd.size()


def hold(path):
    deadline = time.monotonic() + HOLD_MAX_S
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def write_pid(path, rank):
    tmp = '%s.%d.tmp' % (path, rank)
    with open(tmp, 'w') as f:
        f.write('%d\n' % os.getpid())
    os.replace(tmp, '%s.%d' % (path, rank))  # readers never see half a file


@hvd.elastic.run
def train(state, run):
    """Trains from the state's epoch and step on; returns the number of
    ranks whose parameters differ from rank 0's at the end."""
    args = run.args
    log('start: %d workers, epoch %d, step %d (after %d resets)'
        % (hvd.size(), state.epoch, state.step, run.resets))
    while state.epoch < args.epochs:
        state.model.train()
        for batch_idx, (x, y) in enumerate(run.loader):
            state.optimizer.zero_grad()
            loss = F.cross_entropy(state.model(x), y)
            loss.backward()
            state.optimizer.step()
            state.sampler.record_batch(batch_idx, args.batch_size)
            state.step += 1
            run.after_step(state, loss.item())
            if state.step % args.commit_every == 0:
                state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()
    return ranks_differing_from_root(state.model)


def main(argv=None):
    args = parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')
    hvd.init()
    torch.set_num_threads(1)  # workers share this host's cores
    # Each worker starts from its own weights on purpose: the state's sync
    # must make them rank 0's.
    torch.manual_seed(args.seed + os.getpid())

    dataset = synthetic_dataset(args.samples, args.seed)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # No collective before train(): a worker started in a later round
    # begins with the state's sync, which the others are already in.
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler,
                                   epoch=0, step=0)
    run = Run(args, loader)
    state.register_reset_callbacks([lambda: run.on_reset(state)])

    started = time.monotonic()
    differing = train(state, run)
    if differing:
        log('done: parameters DIFFER on %d of %d ranks' % (differing, hvd.size()))
        return 1
    log('done: %d epochs, %d steps, %d workers, %d resets in %.1f s; parameters identical on '
        'every rank' % (state.epoch, state.step, hvd.size(), run.resets,
                        time.monotonic() - started))
    return 0


if __name__ == '__main__':
    sys.exit(main())
