"""A rank that trains for a while: tests/slurm/spin.py DIR SECONDS

hvd.init(), one allreduce, then its pid (DIR/pid.<rank>) and, on rank 1, its
Slurm variables (DIR/env.1, for an impostor to copy); then allreduces until
SECONDS have passed. Exits 0 when the job ran to its end."""
import os
import shlex
import sys
import time

import torch

import hvd.torch as hvd

out_dir, seconds = sys.argv[1], float(sys.argv[2])
hvd.init()
t = torch.ones(1)
hvd.allreduce(t, name='first')
if hvd.rank() == 1:
    with open(os.path.join(out_dir, 'env.1'), 'w') as f:
        for k, v in sorted(os.environ.items()):
            if k.startswith('SLURM') or k in ('HVD_MUNGE_SOCKET', 'PYTHONPATH'):
                f.write('export %s=%s\n' % (k, shlex.quote(v)))
with open(os.path.join(out_dir, 'pid.%d' % hvd.rank()), 'w') as f:
    f.write('%d\n' % os.getpid())
end = time.time() + seconds
while time.time() < end:
    assert hvd.allreduce(t, name='spin', op=hvd.Sum).item() == hvd.size()
    time.sleep(0.01)
print('rank %d: done' % hvd.rank(), flush=True)
