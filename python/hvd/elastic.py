"""Elastic training for every framework binding: the state that survives a
reset (State, ObjectState), the loop that resets (run_fn) and the reset
itself (reset: leave this round, join the next one).

DESIGN. run_fn drives the loop in Python rather than through
hvd_elastic_run, so that the training function, the state's steps and the
reset callbacks are plain Python with their tracebacks. The order is
hvd_elastic_run's: sync, train; on HorovodInternalError restore the last
commit, reset, run the reset callbacks, sync, train again; on
HostsUpdatedInterrupt the same without the restore. The reset is
hvd_elastic_reset, which shuts hvd down, waits for the driver's next round
and initializes hvd with its ranks.

Host updates: the driver tells rank 0 of each round, and
hvd_elastic_hosts_updated says what rank 0 has heard (a local, non-blocking
read). check_host_updates broadcasts rank 0's answer, so every rank raises
HostsUpdatedInterrupt at the same commit; skip_sync is True when hosts were
only removed, since the survivors have just committed the same state.

The sync vote. Skipping the sync is only safe when no rank of the new round
runs it: a worker that is new in the round always syncs (it has no state),
and a survivor that skipped the sync's broadcasts would leave it waiting
forever (Horovod's issue #3494, which a removal followed by an addition
before the next round starts triggers). So in an elastic job every sync
point starts with one tiny allreduce (max) of "I need a sync": 1 from a
new worker, from a rank that restored after a failure and from any rank
that is unsure, 0 only from a survivor whose interrupt said skip_sync. The
state is synced when any rank asks for it, skipped only when none does.
Outside an elastic job (HOROVOD_ELASTIC unset) there is no vote.

The vote and the host-update broadcast are single int64 collectives made
through hvd's C API directly, so they need no framework: a binding gives
only its object broadcast and its rank, as in Horovod.
"""

import functools
import logging
import os

from hvd import _core, _lib
from hvd._lib import lib
from hvd.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ['State', 'ObjectState', 'run_fn', 'reset', 'is_elastic_job']

_log = logging.getLogger('hvd.elastic')

# Names of the loop's own collectives: fixed, as every rank of a round
# makes them in the same order and one at a time.
_VOTE_NAME = b'hvd.elastic.python.sync_vote'
_UPDATES_NAME = b'hvd.elastic.python.hosts_updated'


def is_elastic_job():
    """Whether this process is a worker of an elastic job (hvdrun sets
    HOROVOD_ELASTIC=1 for them, as horovodrun does)."""
    return os.environ.get('HOROVOD_ELASTIC') == '1'


# ==== the loop's own collectives ==================================================================

def _int64_collective(submit_fn, name, value, options):
    """One int64 through an hvd_*_async call; returns the result."""
    cell = _lib.Int64Cell(value)
    tensor = _lib.tensor_ref(name, _lib.INT64, (1,), cell.address, cell.address)
    handle = _core.submit(submit_fn, (tensor, _lib.options_ref(options)), (cell, options), None)
    _core.synchronize(handle)
    return cell.value


def _broadcast_from_rank0(name, value):
    return _int64_collective(lib.hvd_broadcast_async, name, value, _lib.Options(root=0))


def _max_over_ranks(name, value):
    return _int64_collective(lib.hvd_allreduce_async, name, value, _lib.Options(op=_lib.MAX))


def _sync_needed(mine):
    """Whether this sync point syncs: in an elastic job the round's vote
    (see the module's DESIGN), else always."""
    if not is_elastic_job():
        return True
    return _max_over_ranks(_VOTE_NAME, 1 if mine else 0) > 0


# ==== state =======================================================================================

class State(object):
    """What an elastic training function must not lose when workers come
    and go: saved by commit(), put back by restore() after a failure,
    broadcast from rank 0 by sync() when a round starts.

    bcast_object(obj) returns rank 0's obj on every rank; get_rank() returns
    this worker's rank (it changes from round to round). Subclasses define
    save, restore and sync, and may define reset (run after every reset,
    before the sync: redo what depends on the rank or the size)."""

    def __init__(self, bcast_object, get_rank):
        if not callable(bcast_object):
            raise ValueError('bcast_object must be a function, not %r' % (bcast_object,))
        if not callable(get_rank):
            raise ValueError('get_rank must be a function, not %r' % (get_rank,))
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds functions (no arguments) to call after every reset, in order,
        once hvd has this worker's new rank and before the state is synced:
        the place to rescale a learning rate to the new size, say."""
        try:
            callbacks = list(callbacks)
        except TypeError:
            raise ValueError('register_reset_callbacks takes a list of functions, not %r'
                             % (callbacks,)) from None
        for callback in callbacks:
            if not callable(callback):
                raise ValueError('register_reset_callbacks: %r is not callable' % (callback,))
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Runs after a reset: reset(), then the registered callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state, then checks for host updates (a collective: every
        rank commits at the same step). Raises HostsUpdatedInterrupt on every
        rank when the driver announced hosts added or removed. A commit costs
        a copy of the state: commit every few steps, not every step."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when rank 0 has heard of
        hosts added or removed since this round began (skip_sync=True when
        they were only removed). Collective in an elastic job; outside one
        there is nothing to check."""
        if not is_elastic_job():
            return
        kinds = lib.hvd_elastic_hosts_updated() if self._rank() == 0 else 0
        # Rank 0 is the only one that hears from the driver: its answer is
        # everyone's, so all ranks interrupt at the same commit.
        kinds = _broadcast_from_rank0(_UPDATES_NAME, max(kinds, 0))
        if kinds:
            raise HostsUpdatedInterrupt(skip_sync=(kinds == _lib.HOSTS_REMOVED))

    def save(self):
        """Keeps a copy of the current state (host memory)."""
        raise NotImplementedError('%s.save' % type(self).__name__)

    def restore(self):
        """Puts back the last saved state, dropping later changes."""
        raise NotImplementedError('%s.restore' % type(self).__name__)

    def sync(self):
        """Makes every rank's state rank 0's (collective)."""
        raise NotImplementedError('%s.sync' % type(self).__name__)

    def reset(self):
        """Called after every reset, before the callbacks and the sync."""


class ObjectState(State):
    """State made of plain Python values, given as keyword arguments and
    kept as attributes (state.epoch, state.batch, ...). save() copies the
    attributes' current values (a shallow copy: assign new values rather
    than change them in place), restore() assigns the saved ones back, and
    sync() replaces them with rank 0's saved values."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._check_names(kwargs)
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super(ObjectState, self).__init__(bcast_object=bcast_object, get_rank=get_rank)

    @classmethod
    def _check_names(cls, names):
        """ValueError for a value named like the state's own attributes."""
        reserved = sorted(n for n in names if n.startswith('_') or hasattr(cls, n))
        if reserved:
            raise ValueError('%s cannot keep a value named %s: the name belongs to the state '
                             'object itself' % (cls.__name__, ', '.join(reserved)))

    def save(self):
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)


# ==== reset and the loop ==========================================================================

def reset():
    """Leaves the current round and joins the next one (hvd_elastic_reset):
    hvd is shut down without waiting for peers that are gone, and initialized
    again with this worker's new rank and size. Handles of the old round are
    released. Raises HorovodInternalError when no next round can be joined
    (hvd's message: no round within HOROVOD_ELASTIC_TIMEOUT, this worker's
    HOROVOD_ELASTIC_RESET_LIMIT reached, not an elastic job); exits the
    process with status 0 when the driver removed this worker."""
    status = lib.hvd_elastic_reset()
    if status == _lib.ERR_REMOVED:
        _core.exit_removed(_core.last_error(status))
    if status != _lib.OK:
        raise HorovodInternalError(_core.last_error(status))
    # hvd_elastic_reset shut hvd down first: every old handle has completed.
    _core.end_round()
    _core.begin_round()


def _check_state(state, func):
    if not isinstance(state, State):
        raise ValueError('%s: the first argument of an elastic training function must be an '
                         'hvd elastic State (TorchState, ObjectState, ...), not %r'
                         % (getattr(func, '__name__', 'elastic run'), state))


def run_fn(func, reset):
    """Wraps func(state, *args, **kwargs) into an elastic training loop and
    returns the wrapper (see the module's DESIGN for the order). reset() is
    the binding's way to join the next round (hvd.elastic.reset for hvd's
    bindings). The wrapper returns func's result once it succeeds, after
    telling hvd the training is done (hvd_elastic_done, so that a pod's
    driver ends the job). Outside an elastic job a failure is raised as is.

    func must make no collective before it is called: a worker started in a
    later round begins with the sync, and the others are already in it."""
    if not callable(func):
        raise ValueError('run_fn: func must be a function, not %r' % (func,))
    if not callable(reset):
        raise ValueError('run_fn: reset must be a function, not %r' % (reset,))

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        _check_state(state, func)
        need_sync = True  # this worker is new: it has no state of its own yet
        after_reset = False
        while True:
            try:
                if after_reset:
                    state.on_reset()
                if _sync_needed(need_sync):
                    state.sync()
                else:
                    _log.info('state sync skipped: hosts were only removed, and every rank '
                              'of this round has the last commit')
                result = func(state, *args, **kwargs)
            except HorovodInternalError as e:
                if not is_elastic_job():
                    raise
                _log.info('restoring the last commit and resetting after: %s', e)
                state.restore()
                failure, need_sync = e, True
            except HostsUpdatedInterrupt as e:
                _log.info('resetting: hosts were %s', 'removed' if e.skip_sync else 'updated')
                failure, need_sync = e, not e.skip_sync
            else:
                lib.hvd_elastic_done()
                return result
            try:
                reset()
            except HorovodInternalError as e:
                raise e from failure
            after_reset = True
    return wrapper
