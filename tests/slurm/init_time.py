"""How long a job's start takes under srun: init_time.py hvd|hvd.torch|torch

Each task prints one line, "init_time S I D": when its script started
(before any import), when its imports were done, and when its process group
was up (seconds since the epoch; the bed's hosts share one clock). Modes:
hvd's core package alone (no torch: hvd's own cost), hvd.torch as a
training script imports it, and torch.distributed.init_process_group('gloo')
from the variables an sbatch script computes by hand for torch
(MASTER_ADDR, MASTER_PORT) and Slurm's (RANK, WORLD_SIZE from SLURM_PROCID
and SLURM_NTASKS)."""
import os
import sys
import time

started = time.time()
mode = sys.argv[1]
if mode == 'hvd':
    from hvd import _core as group
elif mode == 'hvd.torch':
    import hvd.torch as group
else:
    import torch.distributed as dist
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
imported = time.time()
if mode == 'torch':
    dist.init_process_group('gloo')
    dist.barrier()
else:
    group.init()
print('init_time %.6f %.6f %.6f' % (started, imported, time.time()), flush=True)
