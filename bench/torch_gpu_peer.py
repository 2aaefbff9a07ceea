"""torch.distributed's allreduce of CUDA tensors (float32 sum), the peer for
`hvd-bench allreduce -g 1` on a GPU machine. A benchmark: it asserts only
that the results are right.

    python3 bench/torch_gpu_peer.py --np 1 --backend nccl --sizes 8,4K,1M,64M
    python3 bench/torch_gpu_peer.py --np 2 --backend gloo --sizes 8,4K,1M,64M

Rank r uses GPU r % GPUs (gloo stages CUDA tensors through the host, so its
ranks may share one GPU; NCCL's may not). Each size is timed like
hvd-bench -T: a batch of operations doubled until it takes --time seconds,
then the time per operation of that batch, after a device synchronize.
Prints one line per size in hvd-bench's columns (size, count, time in us,
algbw and busbw in GB/s), from rank 0.
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

UNITS = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}


def parse_size(text):
    text = text.strip().upper()
    scale = UNITS.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    value = int(number) * scale
    if value < 4 or value % 4:
        raise argparse.ArgumentTypeError('size %r is not a positive multiple of 4 bytes' % text)
    return value


def worker(rank, args, port):
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = str(port)
    device = torch.device('cuda', rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, rank=rank, world_size=args.np)
    for size in args.sizes:
        count = size // 4
        x = torch.ones(count, device=device)
        for _ in range(3):
            dist.all_reduce(x)
        x.fill_(1.0)
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
        if not torch.all(x == args.np):
            raise SystemExit('rank %d: wrong allreduce result at %d bytes' % (rank, size))
        batch = 1
        while True:
            dist.barrier()
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(batch):
                dist.all_reduce(x)
            torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            # Every rank must agree on whether the batch was long enough.
            done = torch.tensor([1.0 if elapsed >= args.time else 0.0], device=device)
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            if done.item() == 1.0 or batch >= 1 << 20:
                break
            batch *= 2
        us = elapsed / batch * 1e6
        algbw = size / (us * 1e-6) / 1e9
        busbw = algbw * 2 * (args.np - 1) / args.np
        if rank == 0:
            print('%12d %12d %10.2f %8.3f %8.3f' % (size, count, us, algbw, busbw), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--np', type=int, default=1)
    parser.add_argument('--backend', choices=['nccl', 'gloo'], default='nccl')
    parser.add_argument('--sizes', default='8,4K,64K,1M,16M,64M',
                        type=lambda s: [parse_size(v) for v in s.split(',')])
    parser.add_argument('--time', type=float, default=0.3, help='seconds per size')
    args = parser.parse_args()
    if args.np < 1:
        parser.error('--np must be at least 1')
    if not torch.cuda.is_available():
        raise SystemExit('torch sees no GPU')
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    print('# torch %s, %s, np %d: size(B) count time(us) algbw busbw'
          % (torch.__version__, args.backend, args.np), flush=True)
    mp.spawn(worker, args=(args, port), nprocs=args.np, join=True)


if __name__ == '__main__':
    main()
