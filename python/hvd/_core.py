"""What every framework binding shares: lifecycle and topology, statuses
turned into exceptions, the handle table, process sets.

DESIGN. hvd borrows the buffers of an operation until its handle completes,
so the handle table keeps, per Python handle, the C handle, everything the
operation points at (tensors, the hvd_tensor array and its shapes, the
options) and a function that builds the result once the operation is done.
An entry leaves the table when the handle is synchronized; entries nobody
synchronized are released after hvd_shutdown, which completes every
pending operation (hvd_handle_release would wait for one that is not).
Completion is observed by poll and wait, never by a callback: a callback
would take the GIL on hvd's loop thread.

Threads may synchronize, poll and shut down at once, and hvd_handle_wait
releases the GIL, so an entry counts the threads using its C handle
(users) and is released exactly once: by whoever leaves it last after it
left the table (retired). The first thread whose wait returns settles the
entry (builds the result or the error, takes it out of the table); other
threads waiting on it then return the same outcome. _table_lock guards
_ops and every entry's users, retired, freed and settling; it is never
held across a call that blocks (wait, release).
"""

import atexit
import itertools
import sys
import threading
import weakref

from hvd import _lib
from hvd._lib import lib
from hvd.exceptions import HorovodInternalError

# Horovod's values of the reduce ops, which its users compare against.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_OPS = {Average: _lib.AVERAGE, Sum: _lib.SUM, Adasum: _lib.ADASUM, Min: _lib.MIN, Max: _lib.MAX,
        Product: _lib.PRODUCT}
_OP_NAMES = {Average: 'Average', Sum: 'Sum', Adasum: 'Adasum', Min: 'Min', Max: 'Max',
             Product: 'Product'}

NOT_INITIALIZED = 'Horovod has not been initialized; use hvd.init().'


def version():
    return lib.hvd_version().decode()


def last_error(status=None):
    """This thread's last hvd message (hvd_last_error_message)."""
    msg = lib.hvd_last_error_message().decode('utf-8', 'replace')
    if not msg and status is not None:
        msg = lib.hvd_strerror(status).decode()
    return msg


def raise_for(status, invalid=ValueError):
    """Raises what Horovod raises for a failed call: `invalid` (ValueError)
    for a bad argument or a process set that exists already,
    HorovodInternalError for every other failure."""
    msg = last_error(status)
    if status in (_lib.ERR_INVALID_ARGUMENT, _lib.ERR_EXISTS) and invalid is not None:
        raise invalid(msg)
    raise HorovodInternalError(msg)


def check(status, invalid=ValueError):
    if status != _lib.OK:
        raise_for(status, invalid)


def reduce_op(op, what):
    """hvd's value of one of Horovod's ops (Average, Sum, ...)."""
    try:
        return _OPS[op]
    except (KeyError, TypeError):
        raise ValueError('%s: op must be one of hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, '
                         'hvd.Max, hvd.Product, not %r' % (what, op)) from None


def op_name(op):
    return _OP_NAMES.get(op, repr(op))


# ==== lifecycle and topology =====================================================================

_lock = threading.Lock()
_atexit_registered = False


def init(comm=None, process_sets=None):
    """Joins the job (hvd_init); a no-op when hvd is already initialized, as
    Horovod's init is. process_sets: ProcessSets (or rank lists) to register
    at once, the same on every rank, or "dynamic" (hvd's sets always are)."""
    global _atexit_registered
    if comm is not None:
        raise NotImplementedError('hvd.init(comm=...) selects an MPI communicator, and hvd has '
                                  'no MPI; start the job with hvdrun instead')
    with _lock:
        if not lib.hvd_is_initialized():
            status = lib.hvd_init()
            if status == _lib.ERR_REMOVED:
                exit_removed(last_error(status))
            if status != _lib.OK:
                raise_for(status, invalid=ValueError)
            begin_round()
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    if process_sets is not None and process_sets != 'dynamic':
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Leaves the job (hvd_shutdown) and releases the handles nobody
    synchronized; every pending operation fails. A no-op when not initialized."""
    lib.hvd_shutdown()
    end_round()


def begin_round():
    """hvd was initialized (by init, or again by an elastic reset)."""
    global_process_set.ranks = list(range(lib.hvd_size()))


def end_round():
    """hvd was shut down (by shutdown, or by an elastic reset before it
    joins the next round): every operation has completed, so the handles
    nobody synchronized are released; the process sets added are gone from
    the library, so their ProcessSet objects become unregistered (add them
    again to use them)."""
    release_all()
    for ps in list(_registered):
        ps._invalidate()
    _registered.clear()


def exit_removed(message):
    """The elastic driver has no place for this worker (the job finished, or
    shrank without it): say so and exit 0, as hvd.h advises; the driver
    does not count a removed worker's exit."""
    end_round()
    print('hvd: this worker was removed from the elastic job (%s); exiting' % message,
          file=sys.stderr, flush=True)
    sys.exit(0)


def is_initialized():
    return lib.hvd_is_initialized() != 0


def _query(fn):
    v = fn()
    if v < 0:
        raise ValueError(NOT_INITIALIZED)
    return v


def rank():
    return _query(lib.hvd_rank)


def size():
    return _query(lib.hvd_size)


def local_rank():
    return _query(lib.hvd_local_rank)


def local_size():
    return _query(lib.hvd_local_size)


def cross_rank():
    return _query(lib.hvd_cross_rank)


def cross_size():
    return _query(lib.hvd_cross_size)


def is_homogeneous():
    return _query(lib.hvd_is_homogeneous) == 1


def mpi_threads_supported():
    raise ValueError('Horovod MPI is not enabled: hvd has no MPI')


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    """True: hvd is the Gloo-style path (its own controller over TCP)."""
    return True


def gloo_built():
    return True


def nccl_built():
    """The NCCL version code hvd was built with (truthy), 0 without."""
    return lib.hvd_nccl_built()


def cuda_built():
    return lib.hvd_cuda_built() != 0


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome trace on rank 0 (hvd_timeline_start)."""
    if not isinstance(file_path, str) or not file_path:
        raise ValueError('start_timeline: file_path must be a non-empty str')
    check(lib.hvd_timeline_start(file_path.encode(), 1 if mark_cycles else 0), invalid=ValueError)


def stop_timeline():
    check(lib.hvd_timeline_stop())


def join():
    """Blocks until every rank has joined; returns the rank that joined last."""
    status, last = _lib.join()
    check(status, invalid=ValueError)
    return last


def barrier(process_set=None):
    ps = process_set if process_set is not None else global_process_set
    check(lib.hvd_barrier(_set_id(ps)), invalid=ValueError)


# ==== handles ====================================================================================

class _Op(object):
    __slots__ = ('c', 'keep', 'finish', 'users', 'retired', 'freed', 'settling', 'done',
                 'settled', 'result', 'error')

    def __init__(self, c, keep, finish):
        self.c = c            # the hvd_handle (an int)
        self.keep = keep      # what hvd points at until completion
        self.finish = finish  # the result from the completed handle
        self.users = 0        # threads between _use and _unuse
        self.retired = False  # out of the table: the last user releases c
        self.freed = False    # c was released
        self.settling = False  # a thread builds the outcome
        self.done = False     # result or error is there
        self.settled = None   # an Event for threads waiting on the settling one, made by them
        self.result = None
        self.error = None


_ops = {}
_numbers = itertools.count(1)
_table_lock = threading.Lock()
# How long one wait lasts before Python may run its signal handlers (Ctrl-C
# raises KeyboardInterrupt within it); an operation that ends sooner
# returns at once.
WAIT_SLICE_MS = 50


def _use(handle):
    """The entry of a handle in flight, marked in use; None if it is not."""
    with _table_lock:
        op = _ops.get(handle)
        if op is not None:
            op.users += 1
        return op


def _releasable(op):
    """Under _table_lock: True, once, when op is out of the table and
    unused; the caller then releases it."""
    if op.retired and op.users == 0 and not op.freed:
        op.freed = True
        return True
    return False


def _retire(handle, op):
    """Under _table_lock: takes op out of the table (if it is still there);
    True when the caller must release it."""
    if _ops.get(handle) is op:
        del _ops[handle]
    op.retired = True
    return _releasable(op)


def _unuse(op):
    with _table_lock:
        op.users -= 1
        free = _releasable(op)
    if free:
        lib.hvd_handle_release(op.c)


def submit(call, args, keep, finish):
    """Calls an hvd_*_async function (args without the handle pointer) and
    registers the handle; returns its number. A rejected call raises
    ValueError (bad argument, name in flight) or HorovodInternalError."""
    status, c = _lib.submit(call, args)
    if status != _lib.OK:
        raise_for(status)
    op = _Op(c, keep, finish)
    number = next(_numbers)  # itertools.count is atomic under the GIL
    with _table_lock:
        _ops[number] = op
    return number


def outcome(status, pending, keep, finish):
    """The result of a call that submitted and waited at once
    (_lib.allreduce_wait_for) and did not return success: raises what
    submit raises for a refused submission (pending False), what
    synchronize raises for a failed operation (pending None); an operation
    still running (pending, its C handle) enters the table as submit's do,
    and synchronize waits for it (interruptible, released once)."""
    if pending is False:
        raise_for(status)
    if pending is None:
        raise HorovodInternalError(last_error(status))
    op = _Op(pending, keep, finish)
    number = next(_numbers)
    with _table_lock:
        _ops[number] = op
    return synchronize(number)


def poll(handle):
    """True when the operation has completed; never blocks."""
    op = _use(handle)
    if op is None:
        raise ValueError('poll: handle %r is not an operation in flight (synchronized already?)'
                         % (handle,))
    try:
        return lib.hvd_handle_poll(op.c) != 0
    finally:
        _unuse(op)


def wait(c):
    """hvd_handle_wait in slices, so that a signal (Ctrl-C) interrupts the
    wait at once with its exception; the operation itself goes on."""
    status = lib.hvd_handle_wait_for(c, WAIT_SLICE_MS)
    while status == _lib.ERR_TIMEOUT:
        if lib.hvd_handle_poll(c):
            return lib.hvd_handle_wait(c)  # the operation's own status, a timeout too
        status = lib.hvd_handle_wait_for(c, WAIT_SLICE_MS)
    return status


def _await_settled(op):
    """Waits for the thread settling op; its outcome."""
    with _table_lock:
        if not op.done and op.settled is None:
            op.settled = threading.Event()
        event = op.settled
    if event is not None:
        event.wait()
    if op.error is not None:
        raise op.error
    return op.result


def synchronize(handle):
    """Waits for the operation (the GIL released meanwhile) and returns its
    result; None for a handle that is not in flight, as Horovod does.
    Threads that wait on one handle together all get its result (or its
    error)."""
    op = _use(handle)
    if op is None:
        return None
    settled = False
    try:
        status = wait(op.c)
        message = last_error(status) if status != _lib.OK else None
        with _table_lock:
            mine = not op.settling
            op.settling = True
        if not mine:
            return _await_settled(op)
        try:
            if status != _lib.OK:
                raise HorovodInternalError(message)
            op.result = op.finish(op.c) if op.finish is not None else None
            return op.result
        except BaseException as e:
            op.error = e
            raise
        finally:
            # Settled, out of the table and unused by this thread at once.
            with _table_lock:
                _retire(handle, op)
                op.done = True
                event = op.settled
                op.users -= 1
                settled = True
                free = _releasable(op)
            if event is not None:
                event.set()
            if free:
                lib.hvd_handle_release(op.c)
    finally:
        if not settled:
            _unuse(op)


def release_all():
    """Releases every completed handle in the table (after hvd_shutdown:
    all of them); a handle a thread still uses is released when that
    thread is done with it."""
    with _table_lock:
        done = [(h, op) for h, op in _ops.items() if lib.hvd_handle_poll(op.c)]
        free = [op for h, op in done if _retire(h, op)]
    for op in free:
        lib.hvd_handle_release(op.c)


def output_at(c, index=0):
    """(address, bytes, shape) of an output hvd allocated, still the
    handle's: valid until the handle is released."""
    status, address, nbytes, shape = _lib.output_at(c, index)
    check(status, invalid=None)
    return address, nbytes, shape


def take_output(c, index=0):
    """(address, bytes, shape) of an output hvd allocated, now the caller's:
    free it with lib.hvd_output_free (lib.hvd_output_free_gpu if it is a GPU
    tensor's), or hand it to a framework (hvd._dlpack)."""
    status, address, nbytes, shape = _lib.take_output(c, index)
    check(status, invalid=None)
    return address, nbytes, shape


def received_splits(c):
    status, splits = _lib.received_splits(c)
    check(status, invalid=None)
    return splits


# ==== process sets ================================================================================

class ProcessSet(object):
    """A group of ranks with collectives of their own. Register it with
    add_process_set (or hvd.init(process_sets=[...])) on every rank, then
    pass it as process_set= to collectives."""

    def __init__(self, ranks):
        try:
            ranks = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise ValueError('ProcessSet takes a list of ranks, not %r' % (ranks,)) from None
        self.ranks = sorted(ranks)
        self.process_set_id = None
        self.mpi_comm = None  # Horovod's MPI communicator of a set; hvd has no MPI

    def _invalidate(self):
        self.process_set_id = None

    def _id(self):
        if self.process_set_id is None:
            raise ValueError('process set %s is not registered (add_process_set)' % self)
        return self.process_set_id

    def size(self):
        """The number of ranks; None when the set is not registered."""
        if self.process_set_id is None:
            return None
        return _query(lambda: lib.hvd_process_set_size(self.process_set_id))

    def rank(self):
        """This rank's rank in the set (-1 outside it); None when not registered."""
        if self.process_set_id is None:
            return None
        if not is_initialized():
            raise ValueError(NOT_INITIALIZED)
        return lib.hvd_process_set_rank(self.process_set_id)

    def included(self):
        """Whether this rank is a member; None when the set is not registered."""
        if self.process_set_id is None:
            return None
        return self.rank() >= 0

    def __str__(self):
        return 'ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=None)' % (self.process_set_id,
                                                                           self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = _lib.PROCESS_SET_GLOBAL
_registered = weakref.WeakSet()  # the sets add_process_set registered, until end_round


def _set_id(process_set):
    if not isinstance(process_set, ProcessSet):
        raise ValueError('process_set must be a ProcessSet, not %r' % (process_set,))
    return process_set._id()


def set_id(process_set):
    """The hvd id of a registered ProcessSet (ValueError otherwise)."""
    return _set_id(process_set)


def set_ranks(set_id_):
    status, ranks = _lib.process_set_ranks(set_id_)
    check(status, invalid=None)
    return ranks


def add_process_set(process_set):
    """Registers a set (a ProcessSet or a list of ranks) on every rank, which
    all call this in the same order; returns the ProcessSet with its id.
    ValueError when a set with these ranks exists (the global one too)."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError('%s is registered already' % ps)
    if not is_initialized():
        raise ValueError(NOT_INITIALIZED)
    status, new_id = _lib.process_set_add(ps.ranks)
    check(status, invalid=ValueError)
    ps.process_set_id = new_id
    _registered.add(ps)
    return ps


def remove_process_set(process_set):
    """Removes a registered set on every rank (collective); returns False for
    the global set or a set that is not registered, True once removed."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError('remove_process_set takes a ProcessSet, not %r' % (process_set,))
    if process_set.process_set_id is None or \
            process_set.process_set_id == _lib.PROCESS_SET_GLOBAL:
        return False
    check(lib.hvd_process_set_remove(process_set.process_set_id), invalid=ValueError)
    process_set._invalidate()
    _registered.discard(process_set)
    return True


def process_set_ids():
    """The ids of every registered set, ascending."""
    status, ids = _lib.process_set_ids()
    check(status, invalid=None)
    return ids
