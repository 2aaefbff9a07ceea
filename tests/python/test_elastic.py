"""hvd.elastic and hvd.torch.elastic inside one static job: ElasticSampler's
shares and resharding, ObjectState's and TorchState's save, restore and
sync, and run_fn's loop with a stand-in reset (a real reset needs hvdrun's
elastic driver: tests/python/elastic.sh covers that).

The loop's elastic behaviour (the sync vote, the host-update broadcast)
is switched on by setting HOROVOD_ELASTIC=1 after hvd.init(), which is
all run_fn and check_host_updates look at.
"""

import contextlib

import pytest
import torch

import hvd.elastic as elastic
import hvd.torch as hvd
from hvd import _lib
from hvd.torch.elastic import sampler as sampler_module

needs_two = pytest.mark.skipif(hvd.size() < 2, reason='a disagreement needs two ranks')


def _bcast(obj):
    return hvd.broadcast_object(obj, root_rank=0, name='test.elastic.object')


class CountingState(elastic.ObjectState):
    """An ObjectState that counts its syncs and resets."""

    def __init__(self, **kwargs):
        super().__init__(bcast_object=_bcast, get_rank=hvd.rank, **kwargs)
        self.syncs = 0
        self.resets = 0

    def sync(self):
        self.syncs += 1
        super().sync()

    def reset(self):
        self.resets += 1


@pytest.fixture
def elastic_env(monkeypatch):
    monkeypatch.setenv('HOROVOD_ELASTIC', '1')


@pytest.fixture
def static_env(monkeypatch):
    monkeypatch.delenv('HOROVOD_ELASTIC', raising=False)


class FakeReset(object):
    def __init__(self, error=None):
        self.calls = 0
        self.error = error

    def __call__(self):
        self.calls += 1
        if self.error is not None:
            raise self.error


# ==== ElasticSampler ==============================================================================

def _fake_world(monkeypatch, rank, size):
    monkeypatch.setattr(sampler_module, 'rank', lambda: rank)
    monkeypatch.setattr(sampler_module, 'size', lambda: size)


def _shares(monkeypatch, n, size, state=None, shuffle=True):
    """Every fake rank's indices for one pass, with the same state."""
    shares = []
    for r in range(size):
        _fake_world(monkeypatch, r, size)
        s = hvd.elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=3)
        if state is not None:
            s.load_state_dict(state)
        shares.append(list(iter(s)))
        assert len(shares[-1]) == len(s)
    return shares


@pytest.mark.parametrize('n', [0, 1, 2, 10, 17])
@pytest.mark.parametrize('size', [1, 2, 3, 4])
def test_sampler_shares_cover_the_dataset_evenly(monkeypatch, n, size):
    shares = _shares(monkeypatch, n, size)
    assert len({len(s) for s in shares}) == 1  # as many batches on every rank
    covered = [i for s in shares for i in s]
    assert set(covered) == set(range(n))
    assert len(covered) == -(-n // size) * size  # padded by fewer than size


def test_sampler_order_depends_on_seed_and_epoch_only(monkeypatch):
    _fake_world(monkeypatch, 0, 1)
    a = hvd.elastic.ElasticSampler(list(range(50)), seed=1)
    b = hvd.elastic.ElasticSampler(list(range(50)), seed=1)
    assert list(a) == list(b) != list(range(50))
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(50))
    plain = hvd.elastic.ElasticSampler(list(range(50)), shuffle=False)
    assert list(plain) == list(range(50))


def test_sampler_goes_on_with_what_remains_after_a_reset(monkeypatch):
    n, batch = 30, 2
    # Three ranks each process two batches: every one counts all of them...
    processed = set()
    for r in range(3):
        _fake_world(monkeypatch, r, 3)
        s = hvd.elastic.ElasticSampler(list(range(n)), seed=3)
        mine = list(s)
        s.record_batch(0, batch)
        s.record_batch(1, batch)
        assert s.state_dict() == {'epoch': 0, 'processed_num': 3 * 2 * batch}
        processed |= set(mine[:2 * batch])
    assert len(processed) == 3 * 2 * batch
    assert s.processed_indices == processed
    # ...then two ranks share out the rest, in the epoch's order.
    state = {'epoch': 0, 'processed_num': 3 * 2 * batch}
    shares = _shares(monkeypatch, n, 2, state)
    rest = [i for s in shares for i in s]
    assert set(rest) == set(range(n)) - processed
    assert len(rest) == n - len(processed)
    _fake_world(monkeypatch, 0, 1)
    order = list(hvd.elastic.ElasticSampler(list(range(n)), seed=3))
    assert sorted(rest, key=order.index) == [i for i in order if i not in processed]


def test_sampler_set_epoch_forgets_the_processed(monkeypatch):
    _fake_world(monkeypatch, 0, 2)
    s = hvd.elastic.ElasticSampler(list(range(8)))
    mine = list(s)
    s.record_indices(torch.tensor(mine[:1]))
    assert s.state_dict() == {'epoch': 0, 'processed_num': 2}
    assert len(s) == 4  # the share changes at the next reset only
    s.reset()
    assert len(s) == 3
    s.set_epoch(1)
    assert s.state_dict() == {'epoch': 1, 'processed_num': 0}
    assert len(s) == 4


def test_sampler_bad_arguments(monkeypatch):
    _fake_world(monkeypatch, 0, 1)
    with pytest.raises(ValueError):
        hvd.elastic.ElasticSampler(iter(range(3)))
    with pytest.raises(ValueError):
        hvd.elastic.ElasticSampler([1, 2], seed='0')
    s = hvd.elastic.ElasticSampler(list(range(4)))
    iter(s)
    for bad in ([4], [-1], ['1'], [True]):
        with pytest.raises(ValueError):
            s.record_indices(bad)
    with pytest.raises(ValueError):
        s.record_batch(0, 0)
    with pytest.raises(ValueError):
        s.record_batch(-1, 2)
    with pytest.raises(ValueError):
        s.set_epoch(-1)
    with pytest.raises(ValueError):
        s.load_state_dict({'epoch': 0})
    with pytest.raises(ValueError):
        s.load_state_dict({'epoch': 0, 'processed_num': -1})
    assert s.processed_indices == set()


# ==== ObjectState and TorchState ==================================================================

def test_object_state_save_and_restore():
    state = CountingState(epoch=1, batch=2)
    state.epoch, state.batch = 5, 6
    state.restore()
    assert (state.epoch, state.batch) == (1, 2)
    state.epoch = 7
    state.save()
    state.epoch = 8
    state.restore()
    assert state.epoch == 7


def test_object_state_sync_takes_rank0s_commit(rank):
    state = CountingState(value=rank, name='r%d' % rank)
    state.sync()
    assert (state.value, state.name) == (0, 'r0')


def test_object_state_bad_arguments():
    with pytest.raises(ValueError):
        CountingState(commit=1)
    with pytest.raises(ValueError):
        CountingState(_saved_state=1)
    with pytest.raises(ValueError):
        elastic.ObjectState(bcast_object=None, get_rank=hvd.rank)
    with pytest.raises(ValueError):
        elastic.ObjectState(bcast_object=_bcast, get_rank=0)
    with pytest.raises(ValueError):
        CountingState().register_reset_callbacks([1])
    with pytest.raises(ValueError):
        CountingState().register_reset_callbacks(len)


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _local_step(model, optimizer, seed):
    """A step with gradients of this rank's own, reduced nowhere: set by
    hand, as a backward pass would start a DistributedOptimizer's
    reductions."""
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator)
    with getattr(optimizer, 'skip_synchronize', contextlib.nullcontext)():
        optimizer.step()


def test_torch_state_restore_undoes_model_and_optimizer_changes():
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _local_step(model, opt, 1)
    state = hvd.elastic.TorchState(model, opt, epoch=3)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [opt.state[p]['momentum_buffer'].clone() for p in model.parameters()]
    _local_step(model, opt, 2)
    state.epoch = 4
    state.restore()
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(opt.state[p]['momentum_buffer'], m)
               for p, m in zip(model.parameters(), momentum))
    assert state.epoch == 3


def test_torch_state_assigning_a_model_saves_it():
    state = hvd.elastic.TorchState(_model(0))
    other = _model(1)
    state.model = other
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1)
    state.restore()
    assert state.model is other
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), _model(1).parameters()))


def _same_on_every_rank(tensor, name):
    gathered = hvd.allgather(tensor.detach().reshape(1, -1), name=name)
    return torch.equal(gathered, tensor.detach().reshape(1, -1).expand_as(gathered))


def test_torch_state_sync_gives_every_rank_rank0s_state(rank):
    # Only rank 0 has stepped, as when a new worker joins survivors: the
    # others' optimizers have no state, and a DistributedOptimizer must not
    # reduce the zero step that creates it (only they take it).
    model = _model(10 + rank)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 + rank,
                                                   momentum=0.9),
                                   named_parameters=model.named_parameters())
    if rank == 0:
        _local_step(model, opt, 3)
    state = hvd.elastic.TorchState(model, opt, step=rank)
    state.sync()
    results = [_same_on_every_rank(p, 'test.sync.%d' % i)
               for i, p in enumerate(model.parameters())]
    results += [_same_on_every_rank(opt.state[p]['momentum_buffer'], 'test.sync.m%d' % i)
                for i, p in enumerate(model.parameters())]
    assert all(results)
    assert opt.param_groups[0]['lr'] == 0.1
    assert state.step == 0


def test_torch_state_commit_keeps_what_every_rank_processed(rank, size):
    sampler = hvd.elastic.ElasticSampler(list(range(4 * size)), seed=5)
    state = hvd.elastic.TorchState(sampler=sampler)
    mine = list(iter(sampler))
    sampler.record_batch(0, 2)
    state.commit()
    every = hvd.allgather_object(set(mine[:2]), name='test.sampler.mine')
    assert sampler.processed_indices == set().union(*every)
    assert len(sampler.processed_indices) == 2 * size
    sampler.record_batch(1, 2)
    state.restore()
    assert sampler.processed_indices == set().union(*every)
    assert len(sampler) == 2


# ==== run_fn ======================================================================================

def test_run_retries_after_internal_error_with_the_last_commit(elastic_env):
    state = CountingState(value=0)
    calls = []
    callbacks = []
    state.register_reset_callbacks([lambda: callbacks.append(state.resets)])
    reset = FakeReset()

    def train(state, offset):
        calls.append(state.value)
        state.value = 10
        if len(calls) == 1:
            raise hvd.HorovodInternalError('a peer failed')
        return state.value + offset

    assert elastic.run_fn(train, reset)(state, offset=1) == 11
    assert calls == [0, 0]  # restored before the second call
    assert (reset.calls, state.resets, state.syncs, callbacks) == (1, 1, 2, [1])


def test_run_skips_the_sync_only_when_every_rank_may(elastic_env):
    state = CountingState()
    reset = FakeReset()

    def train(state):
        if reset.calls == 0:
            raise hvd.HostsUpdatedInterrupt(skip_sync=True)

    elastic.run_fn(train, reset)(state)
    assert (reset.calls, state.syncs) == (1, 1)


@needs_two
def test_run_syncs_when_one_rank_needs_it(elastic_env, rank):
    # Rank 0 is like a worker new in the round, the others like survivors
    # told they may skip: skipping would leave rank 0 alone in the sync.
    state = CountingState(value=rank)
    reset = FakeReset()

    def train(state):
        if reset.calls == 0:
            raise hvd.HostsUpdatedInterrupt(skip_sync=(rank != 0))
        return state.value

    assert elastic.run_fn(train, reset)(state) == 0
    assert (reset.calls, state.syncs) == (1, 2)


def test_run_outside_an_elastic_job_raises_the_failure(static_env):
    state = CountingState()
    reset = FakeReset()

    def train(state):
        raise hvd.HorovodInternalError('a peer failed')

    with pytest.raises(hvd.HorovodInternalError, match='a peer failed'):
        elastic.run_fn(train, reset)(state)
    assert reset.calls == 0


def test_run_raises_a_failed_reset_caused_by_the_failure(elastic_env):
    state = CountingState()
    reset = FakeReset(hvd.HorovodInternalError('reset 3 times, the limit'))

    def train(state):
        raise hvd.HorovodInternalError('a peer failed')

    with pytest.raises(hvd.HorovodInternalError, match='the limit') as info:
        elastic.run_fn(train, reset)(state)
    assert 'a peer failed' in str(info.value.__cause__)


def test_run_lets_other_exceptions_through(elastic_env):
    reset = FakeReset()

    def train(state):
        raise KeyError('mine')

    with pytest.raises(KeyError):
        elastic.run_fn(train, reset)(CountingState())
    assert reset.calls == 0


def test_run_bad_arguments():
    with pytest.raises(ValueError):
        elastic.run_fn(None, FakeReset())
    with pytest.raises(ValueError):
        elastic.run_fn(lambda s: s, None)
    with pytest.raises(ValueError):
        hvd.elastic.run(lambda s: s)({'not': 'a state'})


def test_torch_run_is_a_decorator():
    @hvd.elastic.run
    def train(state, x):
        """doc"""
        return x

    assert train.__name__ == 'train' and train.__doc__ == 'doc'
    assert train(CountingState(), 4) == 4


def test_reset_outside_an_elastic_job_says_so():
    with pytest.raises(hvd.HorovodInternalError, match='not an elastic job'):
        elastic.reset()
    assert hvd.is_initialized()


# ==== check_host_updates ==========================================================================

def test_no_host_updates_outside_an_elastic_job(static_env):
    CountingState().commit()


@pytest.mark.parametrize('kinds, skip_sync', [
    (_lib.HOSTS_REMOVED, True),
    (_lib.HOSTS_ADDED, False),
    (_lib.HOSTS_ADDED | _lib.HOSTS_REMOVED, False),
])
def test_every_rank_interrupts_on_rank0s_host_updates(elastic_env, monkeypatch, rank, kinds,
                                                        skip_sync):
    # Only rank 0's answer counts: the others report something else.
    monkeypatch.setattr(elastic.lib, 'hvd_elastic_hosts_updated',
                        lambda: kinds if rank == 0 else _lib.HOSTS_ADDED)
    with pytest.raises(hvd.HostsUpdatedInterrupt) as info:
        CountingState().commit()
    assert info.value.skip_sync is skip_sync


def test_no_interrupt_without_host_updates(elastic_env, monkeypatch, rank):
    monkeypatch.setattr(elastic.lib, 'hvd_elastic_hosts_updated',
                        lambda: 0 if rank == 0 else _lib.HOSTS_REMOVED)
    CountingState().commit()
