"""SyncBatchNorm against torch's BatchNorm on the whole batch.

Run on 2 and 3 ranks: build/bin/hvdrun -np N /usr/bin/python3 -m pytest ...
Every rank builds every rank's batch from one seed and keeps the reference,
a torch BatchNorm fed the concatenation of all of them, so each rank checks
its own outputs and gradients against its slice of the reference's. The
reference loss is the sum of every rank's loss, so the weight and bias
gradients (each rank's share) must add up to the reference's.
"""

import pytest
import torch

import hvd.torch as hvd

TOL = dict(rtol=1e-5, atol=1e-5)

REFERENCES = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
              5: torch.nn.BatchNorm3d}
SPATIAL = {2: (), 3: (5,), 4: (3, 2), 5: (2, 2, 3)}
CHANNELS = 3


def setup_module(module):
    hvd.init()


def _sizes(kind, ranks):
    """Batch sizes per rank."""
    if kind == 'even':
        return [4] * ranks
    if ranks == 1:  # a job of one rank: one batch, as big as torch wants
        return [3]
    if kind == 'uneven':  # rank 0 holds a single sample
        return [1] + [2 + r for r in range(1, ranks)]
    if kind == 'empty':   # the last rank holds none
        return [3 + r for r in range(ranks - 1)] + [0]
    raise AssertionError(kind)


def _batches(sizes, dims, generator, dtype):
    shape = (CHANNELS,) + SPATIAL[dims]
    # an offset and a scale per channel, so that the statistics are far from (0, 1)
    offset = torch.randn(CHANNELS, generator=generator, dtype=dtype) * 5
    scale = torch.rand(CHANNELS, generator=generator, dtype=dtype) * 3 + 0.5
    view = [1, CHANNELS] + [1] * (dims - 2)
    return [torch.randn((n,) + shape, generator=generator, dtype=dtype) * scale.view(view) +
            offset.view(view) for n in sizes]


def _modules(dims, dtype, generator, process_set=hvd.global_process_set, **kwargs):
    ours = hvd.SyncBatchNorm(CHANNELS, process_set=process_set, **kwargs).to(dtype)
    reference = REFERENCES[dims](CHANNELS, **kwargs).to(dtype)
    if ours.affine:
        with torch.no_grad():
            for m in (ours, reference):
                m.weight.copy_(torch.linspace(0.5, 2.0, CHANNELS, dtype=dtype))
                m.bias.copy_(torch.linspace(-1.0, 1.0, CHANNELS, dtype=dtype))
    return ours, reference


def _mine(tensors):
    return tensors[hvd.rank()]


def _slice(whole, sizes):
    start = sum(sizes[:hvd.rank()])
    return whole[start:start + sizes[hvd.rank()]]


def _assert_close(actual, expected, what):
    assert actual.shape == expected.shape, '%s: shape %s != %s' % (what, actual.shape,
                                                                   expected.shape)
    assert torch.allclose(actual, expected, **TOL), \
        '%s: max difference %g' % (what, (actual - expected).abs().max().item())


def _train_step(ours, reference, sizes, dims, generator, dtype):
    """One forward and backward of both modules; checks outputs and gradients."""
    batches = _batches(sizes, dims, generator, dtype)
    weights = _batches(sizes, dims, generator, dtype)  # the loss is sum(output * weights)

    x = _mine(batches).clone().requires_grad_()
    out = ours(x)
    (out * _mine(weights)).sum().backward()

    whole = torch.cat(batches).requires_grad_()
    expected = reference(whole)
    (expected * torch.cat(weights)).sum().backward()

    _assert_close(out.detach(), _slice(expected.detach(), sizes), 'output')
    _assert_close(x.grad, _slice(whole.grad, sizes), 'input gradient')
    if ours.affine:
        for name in ('weight', 'bias'):
            share = getattr(ours, name).grad
            total = hvd.allreduce(share, op=hvd.Sum, name='sbn_test.' + name)
            _assert_close(total, getattr(reference, name).grad, name + ' gradient')
    ours.zero_grad()
    reference.zero_grad()


def _assert_same_running_stats(ours, reference):
    if not reference.track_running_stats:
        assert ours.running_mean is None and ours.running_var is None
        return
    _assert_close(ours.running_mean, reference.running_mean, 'running_mean')
    _assert_close(ours.running_var, reference.running_var, 'running_var')
    assert int(ours.num_batches_tracked) == int(reference.num_batches_tracked)


@pytest.mark.parametrize('dims', [2, 3, 4, 5])
@pytest.mark.parametrize('kind', ['even', 'uneven', 'empty'])
def test_training_matches_batch_norm_on_the_whole_batch(dims, kind):
    generator = torch.Generator().manual_seed(10 * dims + len(kind))
    ours, reference = _modules(dims, torch.float64, generator)
    sizes = _sizes(kind, hvd.size())
    for _ in range(3):
        _train_step(ours, reference, sizes, dims, generator, torch.float64)
        _assert_same_running_stats(ours, reference)


@pytest.mark.parametrize('options', [
    dict(momentum=None), dict(momentum=0.5), dict(affine=False),
    dict(track_running_stats=False), dict(eps=0.1),
], ids=['cumulative', 'momentum', 'no-affine', 'no-running-stats', 'eps'])
def test_options_match_batch_norm(options):
    generator = torch.Generator().manual_seed(7)
    ours, reference = _modules(4, torch.float64, generator, **options)
    sizes = _sizes('uneven', hvd.size())
    for _ in range(3):
        _train_step(ours, reference, sizes, 4, generator, torch.float64)
        _assert_same_running_stats(ours, reference)


def test_float32_matches_batch_norm():
    generator = torch.Generator().manual_seed(3)
    ours, reference = _modules(3, torch.float32, generator)
    sizes = _sizes('uneven', hvd.size())
    for _ in range(2):
        _train_step(ours, reference, sizes, 3, generator, torch.float32)
        _assert_same_running_stats(ours, reference)


@pytest.mark.parametrize('track_running_stats', [True, False])
def test_eval_is_batch_norm_on_this_ranks_batch(track_running_stats):
    """In eval mode nothing is shared: with track_running_stats=False the
    statistics are this rank's batch's, not the whole batch's."""
    generator = torch.Generator().manual_seed(5)
    ours, reference = _modules(4, torch.float64, generator,
                               track_running_stats=track_running_stats)
    sizes = _sizes('even', hvd.size())
    _train_step(ours, reference, sizes, 4, generator, torch.float64)
    ours.eval()
    reference.eval()
    batch = _mine(_batches([2 + r for r in range(hvd.size())], 4, generator, torch.float64))
    _assert_close(ours(batch).detach(), reference(batch).detach(), 'eval output')
    _assert_same_running_stats(ours, reference)


def _every_rank_but_the_last():
    """A process set of every rank but the last (the global set when alone)."""
    if hvd.size() == 1:
        return [0], hvd.global_process_set
    members = list(range(hvd.size() - 1))
    return members, hvd.add_process_set(members)


def test_process_set_shares_among_its_ranks_only():
    members, process_set = _every_rank_but_the_last()
    try:
        generator = torch.Generator().manual_seed(11)
        ours, reference = _modules(2, torch.float64, generator, process_set=process_set)
        sizes = [3 + r for r in members]
        batches = _batches(sizes, 2, generator, torch.float64)
        if hvd.rank() in members:
            out = ours(batches[hvd.rank()])
            _assert_close(out.detach(), _slice(reference(torch.cat(batches)).detach(), sizes),
                          'output')
            _assert_same_running_stats(ours, reference)
        else:
            with pytest.raises(ValueError, match='not in'):
                ours(torch.zeros(2, CHANNELS, dtype=torch.float64))
    finally:
        hvd.remove_process_set(process_set)


def test_whole_batch_of_one_value_raises_on_every_rank():
    sizes = [1] + [0] * (hvd.size() - 1)
    ours = hvd.SyncBatchNorm(CHANNELS)
    x = torch.ones((sizes[hvd.rank()], CHANNELS))
    with pytest.raises(ValueError, match='more than 1 value per channel'):
        ours(x)


@pytest.mark.parametrize('shape', [(CHANNELS,), (2, CHANNELS, 1, 1, 1, 1)], ids=['1D', '6D'])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_wrong_dimensions_raise_value_error(shape, training):
    ours = hvd.SyncBatchNorm(CHANNELS)
    ours.train(training)
    with pytest.raises(ValueError, match='expected 2D to 5D input'):
        ours(torch.zeros(shape))


def test_wrong_channels_raise_value_error():
    with pytest.raises(ValueError, match='channels'):
        hvd.SyncBatchNorm(CHANNELS)(torch.zeros(4, CHANNELS + 1))


@pytest.mark.parametrize('arguments', [
    dict(num_features=0), dict(num_features=2.0), dict(num_features=2, eps=-1.0),
    dict(num_features=2, momentum='fast'), dict(num_features=2, process_set=[0, 1]),
], ids=['zero-features', 'float-features', 'negative-eps', 'momentum', 'process-set'])
def test_bad_arguments_raise_value_error(arguments):
    with pytest.raises(ValueError):
        hvd.SyncBatchNorm(**arguments)


def test_is_a_torch_batch_norm():
    assert isinstance(hvd.SyncBatchNorm(CHANNELS), torch.nn.modules.batchnorm._BatchNorm)
