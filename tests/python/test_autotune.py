"""HOROVOD_AUTOTUNE=1 in a job (ctest runs this file under hvdrun with the
tuner's variables set: see tests/CMakeLists.txt). While the tuner changes
the fusion threshold, the cycle time, the cache, the ring's switch point
and its segments, every result must stay exact and the same on every rank
(ranks that applied a setting at different operations would pick different
algorithms and hang or disagree), and rank 0's log must have Horovod's
columns and one row per scored sample."""

import csv
import os

import pytest
import torch

import hvd.torch as hvd

pytestmark = pytest.mark.skipif(os.environ.get('HOROVOD_AUTOTUNE') != '1',
                                reason='runs under HOROVOD_AUTOTUNE=1 (ctest python.autotune)')

HORO_COLUMNS = ['hierarchical_allreduce', 'hierarchical_allgather', 'torus_allreduce',
                'cache_enabled', 'cycle_time_ms', 'tensor_fusion_threshold', 'score']


def test_results_stay_exact_while_tuning(rank, size):
    sizes = [1, 7, 300, 4096, 70000, 300000]
    for step in range(120):
        tensors = [torch.full((n,), float(rank + 1 + step % 3)) for n in sizes]
        handles = [hvd.allreduce_async(t, op=hvd.Sum, name='tune.%d' % i)
                   for i, t in enumerate(tensors)]
        outs = [hvd.synchronize(h) for h in handles]
        expect = float(sum(r + 1 + step % 3 for r in range(size)))
        for n, out in zip(sizes, outs):
            assert torch.all(out == expect), 'step %d, %d elements: wrong sum' % (step, n)
    every = hvd.allgather(torch.cat(outs).unsqueeze(0), name='tune.same')
    assert all(torch.equal(every[r], every[0]) for r in range(size))


def test_log_has_horovods_columns(rank, size):
    hvd.barrier()
    if rank != 0:
        return
    path = os.environ['HOROVOD_AUTOTUNE_LOG']
    with open(path, newline='') as f:
        rows = list(csv.reader(f))
    assert rows[0][:7] == HORO_COLUMNS
    assert len(rows) >= 4, 'the log has %d scored samples: %r' % (len(rows) - 1, rows)
    for row in rows[1:]:
        assert len(row) == len(rows[0])
        assert float(row[6]) > 0 and int(row[2]) == 0
