"""Synthetic training throughput of a torchvision model, written as a Horovod
user writes it (`import horovod.torch as hvd`): the same flags and the same
printed lines as Horovod's PyTorch synthetic benchmark, so that numbers from
hvd and from Horovod compare line by line. It runs unchanged on either.

Every rank trains on one fixed random batch; rank 0 prints the images per
second of each iteration, then the mean with a 95% band (1.96 standard
deviations) per rank and for the whole job.

Under hvd, with its `horovod` compatibility tree:

    build/bin/hvdrun --horovod-compat -np 2 /usr/bin/python3 \\
        examples/pytorch/synthetic_benchmark.py --model resnet18 --batch-size 8 \\
        --num-iters 2 --num-batches-per-iter 2 --num-warmup-batches 1

(without --horovod-compat, put python/compat before python on PYTHONPATH).
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
import torch.optim as optim
from torchvision import models

import horovod.torch as hvd

IMAGE_SHAPE = (3, 224, 224)
NUM_CLASSES = 1000


def count(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not an integer' % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError('must be at least 1, not %d' % value)
    return value


def classification_models():
    """The names of torchvision's image classification model builders."""
    if hasattr(models, 'list_models'):  # torchvision 0.14 and later
        return models.list_models(module=models)
    return [n for n, f in vars(models).items()
            if not n.startswith('_') and n.islower() and callable(f)]


def model_name(text):
    if text not in classification_models():
        raise argparse.ArgumentTypeError(
            '%r is not a torchvision classification model (e.g. resnet50, resnet18, '
            'vgg16, mobilenet_v2)' % text)
    return text


def parse_args():
    parser = argparse.ArgumentParser(description='PyTorch synthetic benchmark',
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                        help='send gradients as float16 in the allreduce')
    parser.add_argument('--model', type=model_name, default='resnet50',
                        help='torchvision model to train')
    parser.add_argument('--batch-size', type=count, default=32,
                        help='images per batch on each rank')
    parser.add_argument('--num-warmup-batches', type=count, default=10,
                        help='batches run before timing starts')
    parser.add_argument('--num-batches-per-iter', type=count, default=10,
                        help='batches timed together as one iteration')
    parser.add_argument('--num-iters', type=count, default=10,
                        help='timed iterations')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='train on the CPU even where CUDA is available')
    parser.add_argument('--use-adasum', action='store_true', default=False,
                        help='reduce gradients with Adasum instead of averaging them')
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


def log(line):
    if hvd.rank() == 0:
        print(line, flush=True)


def build_model(args):
    if args.cuda:
        # Batch statistics over every rank's batch; SyncBatchNorm is GPU only.
        model = getattr(models, args.model)(norm_layer=hvd.SyncBatchNorm)
        return model.cuda()
    return getattr(models, args.model)()


def learning_rate_scale(args):
    """Averaged gradients: scale by the number of ranks that average. Adasum
    needs no scaling, except across the ranks of a host on GPUs."""
    if not args.use_adasum:
        return hvd.size()
    if args.cuda and hvd.nccl_built():
        return hvd.local_size()
    return 1


def make_optimizer(model, args):
    sgd = optim.SGD(model.parameters(), lr=0.01 * learning_rate_scale(args))
    return hvd.DistributedOptimizer(
        sgd, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        op=hvd.Adasum if args.use_adasum else hvd.Average)


def fixed_batch(args):
    images = torch.randn(args.batch_size, *IMAGE_SHAPE)
    labels = torch.randint(0, NUM_CLASSES, (args.batch_size,))
    if args.cuda:
        images, labels = images.cuda(), labels.cuda()
    return images, labels


def timed_batches(step, n):
    """Seconds that n training steps take."""
    start = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - start


def main():
    args = parse_args()
    hvd.init()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
    else:
        # The ranks of a host share its cores: more threads than cores thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    cudnn.benchmark = True

    model = build_model(args)
    optimizer = make_optimizer(model, args)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    images, labels = fixed_batch(args)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    device = 'GPU' if args.cuda else 'CPU'
    log('Model: %s' % args.model)
    log('Batch size: %d' % args.batch_size)
    log('Number of %ss: %d' % (device, hvd.size()))

    log('Running warmup...')
    timed_batches(step, args.num_warmup_batches)

    log('Running benchmark...')
    rates = []
    for i in range(args.num_iters):
        seconds = timed_batches(step, args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        log('Iter #%d: %.1f img/sec per %s' % (i, rates[-1], device))

    mean, band = np.mean(rates), 1.96 * np.std(rates)
    log('Img/sec per %s: %.1f +-%.1f' % (device, mean, band))
    log('Total img/sec on %d %s(s): %.1f +-%.1f'
        % (hvd.size(), device, hvd.size() * mean, hvd.size() * band))


if __name__ == '__main__':
    main()
