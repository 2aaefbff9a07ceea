"""The small-op path from Python: its cached structures give every call its
own tensor's addresses, op names with a NUL are refused, and a rank blocked
in synchronize() takes Ctrl-C at once (issue 38, points 9 and 10)."""

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
