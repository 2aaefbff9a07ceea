"""hvd.torch's lifecycle and queries: rank, size and the local and cross
topology against the environment hvdrun sets, the *_built and *_enabled
answers, the timeline, and shutdown/init cycles.
"""

import json
import os
import shutil
import sys
import tempfile
import threading
import time

import pytest
import torch

import hvd.torch as hvd
from exact import reduced, same, values


def _env(name, default):
    return int(os.environ.get(name, default))


def test_topology_matches_hvdruns_environment():
    # Without hvdrun's environment the process is a job of one rank.
    assert hvd.rank() == _env('HOROVOD_RANK', 0)
    assert hvd.size() == _env('HOROVOD_SIZE', 1)
    assert hvd.local_rank() == _env('HOROVOD_LOCAL_RANK', 0)
    assert hvd.local_size() == _env('HOROVOD_LOCAL_SIZE', 1)
    assert hvd.cross_rank() == _env('HOROVOD_CROSS_RANK', 0)
    assert hvd.cross_size() == _env('HOROVOD_CROSS_SIZE', 1)
    # One host here, so every host runs the same number of ranks.
    assert hvd.is_homogeneous() is True
    assert hvd.is_initialized() is True


def test_topology_is_consistent_across_ranks(rank, size):
    mine = torch.tensor([[hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                          hvd.cross_rank(), hvd.cross_size()]])
    every = hvd.allgather(mine, name='topology')
    assert every[:, 0].tolist() == list(range(size))
    assert every[:, 1].tolist() == [size] * size
    assert sorted(every[:, 2].tolist()) == list(range(hvd.local_size()))
    assert hvd.local_size() * hvd.cross_size() == size


def test_build_queries():
    assert hvd.mpi_built() is False
    assert hvd.mpi_enabled() is False
    assert hvd.gloo_built() is True
    assert hvd.gloo_enabled() is True
    assert hvd.rocm_built() is False
    assert hvd.ddl_built() is False
    assert hvd.ccl_built() is False
    assert isinstance(hvd.cuda_built(), bool)
    nccl = hvd.nccl_built()
    assert isinstance(nccl, int) and nccl >= 0
    assert not nccl or hvd.cuda_built(), 'NCCL without CUDA'
    with pytest.raises(ValueError):
        hvd.mpi_threads_supported()


def test_init_twice_is_a_no_op(rank, size):
    hvd.init()
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (rank, size)
    with pytest.raises(NotImplementedError):
        hvd.init(comm=[0])


def test_timeline_names_an_allreduce(rank, size):
    # Only rank 0 writes; every rank calls start and stop.
    folder = tempfile.mkdtemp(prefix='hvd-timeline-')
    path = os.path.join(folder, 'timeline.json')
    try:
        hvd.start_timeline(path)
        hvd.allreduce(torch.ones(17), name='timeline_probe')
        hvd.stop_timeline()
        hvd.start_timeline(path + '.cycles', mark_cycles=True)
        hvd.allreduce(torch.ones(3), name='timeline_probe_cycles')
        hvd.stop_timeline()
        if rank == 0:
            with open(path) as f:
                events = json.load(f)
            names = [e.get('args', {}).get('name') for e in events if e.get('ph') == 'M']
            assert 'allreduce.timeline_probe' in names, names
            with open(path + '.cycles') as f:
                assert json.load(f)
        else:
            assert not os.path.exists(path)
        with pytest.raises(ValueError):
            hvd.start_timeline('')
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _allreduce_works(rank, size):
    inputs = [values((17, 2), torch.float32, r) for r in range(size)]
    return same(hvd.allreduce(inputs[rank], op=hvd.Sum), reduced(inputs, hvd.Sum))


QUERIES = [hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank, hvd.cross_size,
           hvd.is_homogeneous]


def test_shutdown_init_cycles(rank, size):
    for _ in range(3):
        hvd.shutdown()
        assert hvd.is_initialized() is False
        for query in QUERIES:
            with pytest.raises(ValueError):
                query()
        with pytest.raises(ValueError):
            hvd.add_process_set([0])
        hvd.shutdown()  # a no-op when not initialized
        hvd.init()
        assert hvd.is_initialized() is True
        assert (hvd.rank(), hvd.size()) == (rank, size)
        assert hvd.global_process_set.ranks == list(range(size))
        assert _allreduce_works(rank, size)


def test_shutdown_releases_pending_operations_and_the_job_goes_on(rank, size):
    # An operation this rank alone submits cannot complete; shutdown ends
    # it and releases its handle (synchronize then returns None, as for any
    # handle not in flight), and the next init starts afresh. The matched
    # allreduce makes sure every rank has submitted (and polled: a rank that
    # shuts down ends the others' pending operations) before any shuts down.
    handle = hvd.allreduce_async(torch.ones(3), name='never_matched.%d' % rank)
    pending = not hvd.poll(handle)
    assert _allreduce_works(rank, size)
    hvd.shutdown()
    released = hvd.synchronize(handle)
    hvd.init()
    assert _allreduce_works(rank, size)
    assert pending or size == 1
    assert released is None


def test_waiting_releases_the_gil(rank, size, shared_dir):
    """Rank 0 waits in synchronize() for an allreduce that the last rank
    submits only once a Python thread of rank 0 has written a file while
    rank 0 waits: if the wait held the GIL, that thread could not run, the
    file would never appear, and the last rank gives up after 30 s. With a
    switch interval no test outlasts, rank 0's main thread hands the GIL
    over only where it lets go of it: after waiting.set(), the first such
    place is the wait itself, so the thread writes only from inside it."""
    alive = os.path.join(shared_dir, 'rank0_thread_ran')
    if size == 1:
        return
    if rank == 0:
        waiting = threading.Event()

        def write_while_rank0_waits():
            waiting.wait()
            with open(alive, 'w') as f:
                f.write('ran')

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        try:
            thread = threading.Thread(target=write_while_rank0_waits)
            thread.start()
            handle = hvd.allreduce_async(torch.ones(3), name='gil.wait', op=hvd.Sum)
            waiting.set()
            result = hvd.synchronize(handle)
        finally:
            sys.setswitchinterval(interval)
        thread.join()
    else:
        if rank == size - 1:
            deadline = time.monotonic() + 30
            while not os.path.exists(alive) and time.monotonic() < deadline:
                time.sleep(0.01)
        result = hvd.allreduce(torch.ones(3), name='gil.wait', op=hvd.Sum)
        seen = os.path.exists(alive)
        assert seen or rank != size - 1, 'rank 0\'s thread never ran while rank 0 waited'
    assert torch.equal(result, torch.full((3,), float(size)))
