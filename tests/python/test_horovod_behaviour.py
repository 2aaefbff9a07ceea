"""Horovod's behaviour where a Horovod user's script, checkpoint or test
depends on it, through hvd.torch and through the compatibility tree's
horovod.torch alike (every test runs the same calls against both):
ElasticSampler's order and state_dict, broadcast_optimizer_state's model
argument and the gradients it leaves, allgather's output as torch's own
tensor, the exception reducescatter raises for Adasum, the warnings'
texts, set_backward_passes_per_step, and the error of a collective called
before hvd.init().
"""

import importlib
import os
import random
import sys

import pytest
import torch

import hvd

# The compatibility tree beside the hvd package (the build's, or the
# source tree's), as hvdrun --horovod-compat puts it on PYTHONPATH.
COMPAT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(hvd.__file__))), 'compat')

# Horovod's texts, which scripts and tests match or filter on.
STEP_AFTER_SYNCHRONIZE = (
    'optimizer.step() called without optimizer.skip_synchronize() context after '
    'optimizer.synchronize(). This can cause training slowdown. You may want to consider using '
    'optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.')
NUM_GROUPS = ('Parameter `num_groups` has been replaced by `groups` and will be removed in '
              'v0.23.0.')
AVERAGE = 'Parameter `average` has been replaced with `op` and will be removed in v1.0'
NOT_INITIALIZED = 'Horovod has not been initialized; use hvd.init().'


@pytest.fixture(params=['hvd.torch', 'horovod.torch'])
def api(request):
    if request.param.startswith('horovod') and COMPAT not in sys.path:
        sys.path.insert(0, COMPAT)
    return importlib.import_module(request.param)


def _compat_exceptions():
    if COMPAT not in sys.path:
        sys.path.insert(0, COMPAT)
    return importlib.import_module('horovod.common.exceptions')


# ==== ElasticSampler ==============================================================================

def _epoch_order(n, seed, epoch):
    """Horovod's order of an epoch (since 0.24): Python's shuffle seeded
    with seed + epoch."""
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    return order


def _share(remaining, rank, size):
    """Horovod's share of a rank: padded with the first indices, then every
    size-th from the rank."""
    total = -(-len(remaining) // size) * size
    padded = remaining + remaining[:total - len(remaining)]
    return padded[rank:total:size]


def test_sampler_order_is_horovods(api, rank, size):
    # What random.Random(4).shuffle gives a list of 0..9, written out, so
    # that a change of the interpreter's shuffle would show here too.
    assert _epoch_order(10, 3, 1) == [8, 2, 0, 7, 6, 9, 5, 1, 4, 3]
    sampler = api.elastic.ElasticSampler(list(range(10)), seed=3)
    assert list(sampler) == _share(_epoch_order(10, 3, 0), rank, size)
    sampler.set_epoch(1)
    assert list(sampler) == _share(_epoch_order(10, 3, 1), rank, size)
    assert len(sampler) == -(-10 // size)
    plain = api.elastic.ElasticSampler(list(range(10)), shuffle=False)
    assert list(plain) == _share(list(range(10)), rank, size)


def test_sampler_state_is_horovods(api, rank, size):
    sampler = api.elastic.ElasticSampler(list(range(10)), seed=3)
    sampler.set_epoch(1)
    assert sampler.state_dict() == {'epoch': 1, 'processed_num': 0}
    iter(sampler)
    sampler.record_batch(0, 1)
    assert sampler.state_dict() == {'epoch': 1, 'processed_num': size}
    sampler.record_indices(sampler.get_indices(1, 1))  # hvd's: the next one of this pass
    assert sampler.processed_num == 2 * size
    with pytest.raises(ValueError):
        sampler.record_indices(sampler.get_indices(0, 1))  # not the next one
    # A checkpoint Horovod wrote: the order's first 3 indices are done.
    sampler.load_state_dict({'epoch': 1, 'processed_num': 3})
    assert list(sampler) == _share(_epoch_order(10, 3, 1)[3:], rank, size)
    # One of Horovod 0.20 to 0.23: a set of indices; its longest done prefix counts.
    done = set(_epoch_order(10, 3, 1)[:4]) | {_epoch_order(10, 3, 1)[6]}
    sampler.load_state_dict({'epoch': 1, 'processed_indices': done})
    assert sampler.state_dict() == {'epoch': 1, 'processed_num': 4}
    sampler.set_epoch(2)
    assert sampler.state_dict() == {'epoch': 2, 'processed_num': 0}


def test_torch_state_syncs_the_samplers_count_from_rank_0(api, rank, size):
    sampler = api.elastic.ElasticSampler(list(range(4 * size)), seed=5)
    state = api.elastic.TorchState(sampler=sampler)
    iter(sampler)
    for batch in range(rank + 1):
        sampler.record_batch(batch, 1)
    state.sync()
    assert sampler.state_dict() == {'epoch': 0, 'processed_num': size}
    assert list(sampler) == _share(_epoch_order(4 * size, 5, 0)[size:], rank, size)


# ==== broadcast_optimizer_state ===================================================================

def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(5, 2, sparse=True), torch.nn.Linear(2, 1))


def test_broadcast_optimizer_state_takes_a_model(api, rank, size):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    api.broadcast_optimizer_state(opt, 0, model)  # positional, Horovod's third argument
    api.broadcast_optimizer_state(opt, root_rank=0, model=model)
    embedding, linear = model[0], model[1]
    assert embedding.weight.grad.is_sparse  # as the embedding's real gradients
    assert torch.equal(embedding.weight.grad.to_dense(), torch.zeros(5, 2))
    for p in linear.parameters():
        assert not p.grad.is_sparse and torch.equal(p.grad, torch.zeros_like(p))
    with pytest.raises(ValueError):
        api.broadcast_optimizer_state(opt, 0, 'a name prefix')


def test_broadcast_optimizer_state_leaves_a_zero_gradient_to_broadcast(api, rank, size):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    api.broadcast_optimizer_state(opt, root_rank=0)
    for i, p in enumerate(model.parameters()):
        assert torch.equal(api.broadcast(p.grad, 0, name='behaviour.grad.%d' % i),
                           torch.zeros_like(p))


# ==== allgather's output is torch's own tensor ====================================================

def test_allgather_output_behaves_as_torchs(api, rank, size):
    # A shape error is torch's RuntimeError (not a SystemError from a
    # Python deleter), and resize_ grows the output and keeps its values.
    out = api.allgather(torch.ones(2), name='behaviour.allgather_output')
    with pytest.raises(RuntimeError):
        out + torch.ones(3)
    out.resize_(1000)
    assert out.shape == (1000,)
    assert out[:2 * size].tolist() == [1.0] * (2 * size)


# ==== reducescatter with Adasum ===================================================================

def test_reducescatter_adasum_raises_horovods_class(api, rank, size):
    exceptions = _compat_exceptions()
    calls = [lambda: api.reducescatter(torch.ones(2 * size), op=api.Adasum),
             lambda: api.grouped_reducescatter([torch.ones(2 * size)], op=api.Adasum)]
    for call in calls:
        with pytest.raises(RuntimeError) as info:
            call()
        assert type(info.value) is exceptions.HorovodInternalError is api.HorovodInternalError
    share = api.reducescatter(torch.ones(2 * size), op=api.Sum, name='behaviour.after_adasum')
    assert torch.equal(share, torch.full((2,), float(size)))  # the job goes on


# ==== warnings ====================================================================================

def _messages(record, category):
    return [str(w.message) for w in record if issubclass(w.category, category)]


def test_step_after_synchronize_warns_in_horovods_words(api, rank, size):
    model = torch.nn.Linear(2, 1)
    opt = api.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning) as record:
        opt.step()
    assert STEP_AFTER_SYNCHRONIZE in _messages(record, UserWarning)


def test_deprecated_arguments_warn_in_horovods_words(api, rank, size):
    model = torch.nn.Linear(2, 1)
    with pytest.warns(DeprecationWarning) as record:
        api.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), num_groups=1)
    assert NUM_GROUPS in _messages(record, DeprecationWarning)
    with pytest.warns(DeprecationWarning) as record:
        total = api.allreduce(torch.ones(2), average=False, name='behaviour.average')
    assert AVERAGE in _messages(record, DeprecationWarning)
    assert torch.equal(total, torch.full((2,), float(size)))


# ==== set_backward_passes_per_step ================================================================

@pytest.mark.parametrize('op', ['Average', 'Adasum'])
def test_set_backward_passes_per_step(api, rank, size, op):
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = api.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(),
                                   op=getattr(api, op))
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2
    x = torch.tensor([[float(rank + 1)]])
    for _ in range(2):  # with 1, the second pass would be refused
        model(x).sum().backward()
    opt.step()
    if op == 'Average':
        # Each rank's gradient is 2 (rank + 1); their average is size + 1.
        assert torch.equal(model.weight.grad, torch.tensor([[float(size + 1)]]))
        assert torch.equal(model.weight, torch.tensor([[-float(size + 1)]]))


# ==== before hvd.init() ===========================================================================

def test_collectives_before_init_say_use_hvd_init(api, rank, size):
    calls = {
        'allreduce': lambda: api.allreduce(torch.ones(2)),
        'allreduce_async_': lambda: api.allreduce_async_(torch.ones(2)),
        'grouped_allreduce': lambda: api.grouped_allreduce([torch.ones(2)]),
        'allgather': lambda: api.allgather(torch.ones(2)),
        'grouped_allgather': lambda: api.grouped_allgather([torch.ones(2)]),
        'broadcast': lambda: api.broadcast(torch.ones(2), 0),
        'alltoall': lambda: api.alltoall(torch.ones(2)),
        'alltoall with splits': lambda: api.alltoall(torch.ones(2), splits=[2]),
        'reducescatter': lambda: api.reducescatter(torch.ones(2)),
        'grouped_reducescatter': lambda: api.grouped_reducescatter([torch.ones(2)]),
        'join': lambda: api.join(),
        'barrier': lambda: api.barrier(),
    }
    api.shutdown()
    try:
        for what, call in calls.items():
            with pytest.raises(api.HorovodInternalError) as info:
                call()
            assert str(info.value) == NOT_INITIALIZED, what
        # Horovod's queries and timeline calls raise ValueError instead.
        for query in (api.rank, lambda: api.start_timeline('/nonexistent/timeline.json'),
                      api.stop_timeline):
            with pytest.raises(ValueError) as info:
                query()
            assert str(info.value) == NOT_INITIALIZED
    finally:
        api.init()
    assert api.allreduce(torch.ones(1), op=api.Sum, name='behaviour.init_again').item() == size
