"""The seam between Python and libhvd: the handle table under threads, the
DLPack deleter of the outputs hvd hands to torch, and the names the
package declares checked against the library's.

The handle tests count every hvd_handle_release: each handle must be
released exactly once, whichever threads wait on it, poll it or shut hvd
down meanwhile. The counting wrapper never releases a handle twice itself,
so a second release fails the test instead of corrupting the heap.
(tests/layout/python_abi.py checks the rest of the declarations against
hvd.h at build time.)
"""

import collections
import ctypes
import gc
import threading

import pytest
import torch

import hvd.torch as hvd
from hvd import _abi, _core, _dlpack, _lib
from hvd.torch import mpi_ops
from hvd.exceptions import HorovodInternalError

THREADS = 8


@pytest.fixture
def releases(monkeypatch):
    """Every hvd_handle_release, counted per handle (keyed by the handle's
    ctypes object, kept alive here so that keys are never reused)."""
    counts = collections.Counter()
    seen = []
    lock = threading.Lock()
    real = _lib.lib.hvd_handle_release

    def counting(handle):
        with lock:
            seen.append(handle)
            counts[id(handle)] += 1
            again = counts[id(handle)] > 1
        if not again:
            real(handle)

    monkeypatch.setattr(_lib.lib, 'hvd_handle_release', counting)
    return counts


def run_threads(n, target):
    """target(i) on n threads started together; their results or exceptions."""
    start = threading.Barrier(n)
    outcomes = [None] * n

    def main(i):
        start.wait()
        try:
            outcomes[i] = ('ok', target(i))
        except BaseException as e:  # the test looks at every outcome
            outcomes[i] = ('raised', e)

    threads = [threading.Thread(target=main, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), 'a thread is stuck'
    return outcomes


def test_threads_synchronize_one_handle(releases, size):
    # Every thread that finds the handle in flight gets its result; a
    # thread that comes once another has settled it gets None (not in
    # flight, as for any synchronized handle). One release either way.
    for i in range(20):
        handle = hvd.allreduce_async(torch.ones(257), name='seam.shared.%d' % i, op=hvd.Sum)
        outcomes = run_threads(THREADS, lambda _: hvd.synchronize(handle))
        for kind, value in outcomes:
            assert kind == 'ok', value
            assert value is None or torch.equal(value, torch.full((257,), float(size)))
        assert any(value is not None for _, value in outcomes)
    assert len(releases) == 20
    assert set(releases.values()) == {1}, 'a handle was released more than once'


def test_threads_each_with_their_own_handles(releases, size):
    def work(t):
        for i in range(25):
            name = 'seam.own.%d.%d' % (t, i)
            handle = hvd.allreduce_async(torch.full((3,), float(t)), name=name, op=hvd.Sum)
            hvd.poll(handle)
            out = hvd.synchronize(handle)
            assert torch.equal(out, torch.full((3,), float(t * size))), name
        return True

    outcomes = run_threads(THREADS, work)
    assert [kind for kind, _ in outcomes] == ['ok'] * THREADS, outcomes
    assert len(releases) == THREADS * 25
    assert set(releases.values()) == {1}, 'a handle was released more than once'


def submitted(i):
    """Returns once every rank has submitted what it submitted before: a
    shutdown fails the other ranks' later submissions at once. (Their own
    wait here may fail too, if a rank shuts down first.)"""
    try:
        hvd.allreduce(torch.ones(1), name='seam.submitted.%s' % i)
    except HorovodInternalError:
        pass


def test_shutdown_while_threads_wait_and_poll(releases, rank, size):
    # Each rank's operations bear names no other rank submits: they stay
    # pending until shutdown fails them. Meanwhile threads wait on them and
    # poll them; the shutdown must release every handle exactly once, no
    # sooner than its last waiter is done with it.
    if size == 1:
        pytest.skip('an operation of a job of one rank never pends')
    pending = 6
    for i in range(5):
        handles = [hvd.allreduce_async(torch.ones(2), name='seam.never.%d.%d.%d' % (i, rank, k))
                   for k in range(pending)]
        submitted(i)

        def role(t):
            # Two threads wait on each handle, one polls it, the last shuts down.
            handle = handles[t % pending]
            if t == 3 * pending:
                hvd.shutdown()
                return 'shut down'
            if t >= 2 * pending:
                polls = 0
                try:
                    while True:
                        hvd.poll(handle)
                        polls += 1
                except ValueError:
                    return polls  # the handle left the table
            try:
                return hvd.synchronize(handle)
            except HorovodInternalError as e:
                return e

        outcomes = run_threads(3 * pending + 1, role)
        hvd.init()
        for kind, value in outcomes:
            assert kind == 'ok', value
        for kind, value in outcomes[:2 * pending]:
            assert value is None or isinstance(value, HorovodInternalError), value
    # (seam.submitted's allreduce waits and releases in one C call)
    assert len(releases) == 5 * pending
    assert set(releases.values()) == {1}, 'a handle was released more than once'


def test_synchronize_after_shutdown_is_none(releases, rank):
    handle = hvd.allreduce_async(torch.ones(1), name='seam.late.%d' % rank)
    submitted('late')
    hvd.shutdown()
    assert hvd.synchronize(handle) is None
    with pytest.raises(ValueError):
        hvd.poll(handle)
    hvd.init()
    assert list(releases.values()) == [1]  # submitted's allreduce releases in C


# ==== DLPack =====================================================================================

def hvd_memory(t, name):
    """hvd.allgather(t)'s output left in hvd's own memory, as the GPU path
    holds it before torch copies it: a uint8 tensor over it, whose DLPack
    deleter (libhvd's C) frees it when the last tensor over it goes."""
    tensor = _lib.tensor_ref(name.encode(), _lib.FLOAT32, t.shape, t.data_ptr(), None)
    options = mpi_ops._options(what='allgather')
    number = _core.submit(_lib.lib.hvd_allgather_async, (tensor, options), (t,),
                          lambda c: mpi_ops._hvd_bytes(c, 0, _lib.DEVICE_CPU))
    raw, shape = _core.synchronize(number)
    return raw.view(torch.float32).view(tuple(shape[:t.dim()]))


def test_deleter_runs_while_an_exception_is_pending(size):
    # The sum fails in torch, which frees the view over hvd's memory while
    # its exception is pending: a deleter that ran Python there turned
    # torch's RuntimeError into a SystemError.
    before = len(_dlpack._live)
    with pytest.raises(RuntimeError, match='must match the size') as info:
        hvd_memory(torch.ones(2), 'seam.pending_exception') + torch.ones(3)
    assert type(info.value) is RuntimeError
    gc.collect()
    assert len(_dlpack._live) == before


def test_outputs_freed_on_other_threads(size):
    before = len(_dlpack._live)
    outs = [hvd_memory(torch.full((2, 3), float(i)), 'seam.freed.%d' % i)
            for i in range(THREADS)]
    assert len(_dlpack._live) == before + THREADS
    run_threads(THREADS, lambda i: outs.__setitem__(i, None))
    gc.collect()
    assert len(_dlpack._live) == before


def test_view_is_freed_with_its_last_tensor(size):
    before = len(_dlpack._live)
    out = hvd_memory(torch.ones(3, 5) * hvd.rank(), 'seam.freed_with_tensor')
    view = out[1:]
    assert len(_dlpack._live) == before + 1
    del out
    gc.collect()
    assert len(_dlpack._live) == before + 1, 'freed while a view still holds it'
    assert torch.equal(view[-1], torch.full((5,), float(size - 1)))
    del view
    gc.collect()
    assert len(_dlpack._live) == before


def test_failed_resize_leaves_hvds_buffer_whole(size):
    # resize_ cannot grow memory hvd allocated (its storage is not
    # torch's): it raises, and the buffer stays the tensor's storage, all
    # of it readable through the storage, until the tensor goes.
    before = len(_dlpack._live)
    out = hvd_memory(torch.arange(4.0).reshape(2, 2), 'seam.resize')
    expected = torch.arange(4.0).reshape(2, 2).repeat(size, 1)
    storage = out.storage()
    assert storage.nbytes() == expected.numel() * 4
    with pytest.raises(RuntimeError, match='not resizable'):
        out.resize_(1000, 2)
    assert out.storage().nbytes() == storage.nbytes()
    whole = torch.empty(0).set_(out.storage(), 0, tuple(expected.shape))
    assert torch.equal(whole, expected)
    del out, storage, whole
    gc.collect()
    assert len(_dlpack._live) == before


def test_failed_resize_keeps_the_shape(size):
    # What torch 1.13 does with a tensor over memory it cannot grow (any
    # non-resizable storage: from_dlpack, from_numpy, frombuffer): resize_
    # sets the new sizes before it finds that out, so the tensor then
    # claims more than its memory. hvd's outputs are therefore copied into
    # storage torch allocated, which resize_ grows as Horovod's outputs.
    out = hvd.allgather(torch.ones(2), name='seam.resize_shape')
    out.resize_(1000)
    assert out.shape == (1000,)
    assert out.storage().nbytes() >= 1000 * 4
    assert out[:2 * size].tolist() == [1.0] * (2 * size)


# ==== names checked at load ======================================================================

def test_library_names_match(monkeypatch):
    _lib.check_names(_lib.lib)  # what `import hvd` did
    monkeypatch.setattr(_abi, 'DTYPE_NAMES', _abi.DTYPE_NAMES[:-1] + ('boolean',))
    with pytest.raises(ImportError, match="hvd_dtype_name\\(10\\) is 'bool'.*'boolean'"):
        _lib.check_names(_lib.lib)
    monkeypatch.undo()
    monkeypatch.setattr(_abi, 'OP_NAMES', ('total',) + _abi.OP_NAMES[1:])
    with pytest.raises(ImportError, match="hvd_reduce_op_name\\(0\\) is 'sum'"):
        _lib.check_names(_lib.lib)


def test_structures_sizes_checked(monkeypatch):
    _lib.check_abi(_lib.lib)

    class Shorter(ctypes.Structure):
        c_name = 'hvd_tensor'
        _fields_ = [('name', ctypes.c_char_p)]

    monkeypatch.setattr(_abi, 'STRUCTURES', (Shorter,))
    size = ctypes.sizeof(_abi.Tensor)
    with pytest.raises(ImportError, match='hvd_tensor of %d bytes, this package declares 8' % size):
        _lib.check_abi(_lib.lib)
