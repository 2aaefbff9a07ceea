"""The small-op path from Python: its cached structures give every call its
own tensor's addresses, op names with a NUL are refused, a rank blocked
in synchronize() or allreduce_() takes Ctrl-C at once (issue 38, points 9
and 10), and unnamed allreduces that wait share one name yet pair across
ranks in call order (issue 36)."""

import os
import signal
import threading
import time

import pytest
import torch

import hvd.torch as hvd

PEER_BUSY_S = 6.0
INTERRUPT_AFTER_S = 0.5


@pytest.mark.parametrize('call', [
    lambda t: hvd.allreduce(t, name='a\0b'),
    lambda t: hvd.allreduce_(t, name='a\0b'),
    lambda t: hvd.allreduce_async(t, name='\0'),
    lambda t: hvd.broadcast(t, 0, name='x\0'),
    lambda t: hvd.allgather(t, name='x\0y'),
    lambda t: hvd.grouped_allreduce([t, t.clone()], name='g\0'),
])
def test_name_with_nul_is_refused(call):
    t = torch.ones(3)
    with pytest.raises(ValueError, match='name'):
        call(t)
    # Nothing was submitted: the job goes on with the same name, whole.
    assert hvd.allreduce(t, name='a', op=hvd.Sum).tolist() == [hvd.size()] * 3


def test_reused_structures_take_each_calls_tensors(rank, size):
    # The same name, dtype and shape every time: one cached hvd_tensor, with
    # each call's input and output addresses.
    for i in range(4):
        t = torch.full((5,), float(rank + i))
        out = hvd.allreduce(t, name='reused', op=hvd.Sum)
        assert out.data_ptr() != t.data_ptr()
        assert out.tolist() == [float(sum(range(size)) + i * size)] * 5
        assert t.tolist() == [float(rank + i)] * 5
    handles = [hvd.allreduce_async_(torch.full((2,), float(i)), name='reused.%d' % i,
                                    op=hvd.Sum) for i in range(3)]
    assert [hvd.synchronize(h).tolist() for h in handles] == \
        [[float(i * size)] * 2 for i in range(3)]


def test_ctrl_c_interrupts_synchronize(rank, size, shared_dir):
    """Rank 0 waits on an allreduce its peers join only after PEER_BUSY_S;
    SIGINT at INTERRUPT_AFTER_S must raise KeyboardInterrupt while they are
    still busy (before they write their file), and the operation goes on:
    synchronize() again returns its result."""
    done = os.path.join(shared_dir, 'peers_busy_done')
    t = torch.full((4,), float(rank + 1))
    hvd.barrier()
    if rank == 0:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        handle = hvd.allreduce_async_(t, name='interrupted', op=hvd.Sum)
        timer = threading.Timer(INTERRUPT_AFTER_S, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                hvd.synchronize(handle)
            peers_done_at_interrupt = os.path.exists(done)
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, previous)
        result = hvd.synchronize(handle)
    else:
        time.sleep(PEER_BUSY_S)
        if rank == 1:
            with open(done, 'w') as f:
                f.write('done\n')
        result = hvd.synchronize(hvd.allreduce_async_(t, name='interrupted', op=hvd.Sum))
        peers_done_at_interrupt = False
    assert result.tolist() == [float(size * (size + 1) // 2)] * 4
    assert not peers_done_at_interrupt, 'KeyboardInterrupt came only after the peers finished'


def test_ctrl_c_interrupts_allreduce(rank, size, shared_dir):
    """The same for allreduce_, which submits, waits and releases in one C
    call while the operation is quick: past its first wait slice, Ctrl-C
    interrupts it too, and the operation still completes into the tensor."""
    done = os.path.join(shared_dir, 'peers_busy_done_allreduce')
    t = torch.full((4,), float(rank + 1))
    want = [float(size * (size + 1) // 2)] * 4
    hvd.barrier()
    if rank == 0:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        timer = threading.Timer(INTERRUPT_AFTER_S, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                hvd.allreduce_(t, name='interrupted_allreduce', op=hvd.Sum)
            peers_done_at_interrupt = os.path.exists(done)
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, previous)
        deadline = time.monotonic() + 60
        while t.tolist() != want and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        time.sleep(PEER_BUSY_S)
        if rank == 1:
            with open(done, 'w') as f:
                f.write('done\n')
        hvd.allreduce_(t, name='interrupted_allreduce', op=hvd.Sum)
        peers_done_at_interrupt = False
    hvd.barrier()
    assert t.tolist() == want
    assert not peers_done_at_interrupt, 'KeyboardInterrupt came only after the peers finished'


# ==== unnamed allreduces that wait: one reused name ==============================================

def test_unnamed_allreduces_pair_in_call_order(rank, size):
    # Blocking unnamed allreduces of changing shapes, dtypes and ops, between
    # unnamed asynchronous ones: every rank's nth call meets the others' nth.
    handles = []
    for i in range(12):
        shape = (i % 4 + 1, 2) if i % 3 else (7,)
        dtype = torch.float64 if i % 5 == 0 else torch.int32
        t = torch.full(shape, rank + i, dtype=dtype)
        op = hvd.Max if i % 4 == 3 else hvd.Sum
        want = size - 1 + i if op == hvd.Max else sum(r + i for r in range(size))
        out = hvd.allreduce(t, op=op) if i % 2 else hvd.allreduce_(t, op=op)
        assert out.shape == shape and out.dtype == dtype
        assert out.flatten().tolist() == [want] * out.numel(), i
        handles.append((hvd.allreduce_async(torch.full((i + 1,), float(rank)), op=hvd.Sum), i))
    for handle, i in handles:
        assert hvd.synchronize(handle).tolist() == [float(sum(range(size)))] * (i + 1)


def test_unnamed_allreduces_from_threads(size):
    # Threads share the one name: a rank runs one such allreduce at a time,
    # never two under one name at once.
    errors = []

    def work():
        try:
            for _ in range(25):
                out = hvd.allreduce(torch.ones(3), op=hvd.Sum)
                assert out.tolist() == [float(size)] * 3
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), 'a thread is stuck'
    assert errors == []


def test_unnamed_allreduce_longer_than_a_wait_slice(rank, size):
    # A late peer: the first C call returns with the operation still
    # running, which synchronize's wait then finishes; the name is free again.
    if rank == size - 1:
        time.sleep(0.3)
    assert hvd.allreduce(torch.full((2,), 1.0), op=hvd.Sum).tolist() == [float(size)] * 2
    assert hvd.allreduce(torch.full((2,), 2.0), op=hvd.Sum).tolist() == [2.0 * size] * 2


def test_unnamed_allreduce_refused_and_failed(rank, size):
    # A call hvd refuses raises ValueError (nothing ran); a mismatch raises
    # HorovodInternalError on every rank, and the job goes on.
    with pytest.raises(ValueError, match='bool'):
        hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Average)
    if size > 1:
        shape = (3,) if rank == 0 else (4,)
        with pytest.raises(hvd.HorovodInternalError, match='allreduce.noname.now'):
            hvd.allreduce(torch.ones(shape), op=hvd.Sum)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).tolist() == [float(size)]
