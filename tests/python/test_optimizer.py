"""DistributedOptimizer's semantics: N ranks with a batch of b each train
the model exactly as one process does on the whole N*b batch.

Every rank builds the same global batches from one seed and trains on its
slice; the reference model, trained by one process on the whole batch,
lives on every rank too, so each rank checks its own parameters against it.
"""

import warnings

import pytest
import torch

import hvd.torch as hvd

PER_RANK = 4


def setup_module(module):
    hvd.init()


def _models(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                                    torch.nn.Linear(5, 3))
    reference.load_state_dict(model.state_dict())
    return model, reference


def _batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = hvd.size() * PER_RANK
    return [(torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g))
            for _ in range(steps)]


def _mine(x):
    r = hvd.rank()
    return x[r * PER_RANK:(r + 1) * PER_RANK]


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


def _assert_close(model, reference, atol=1e-5):
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(a, b, atol=atol), '%s: %s != %s' % (name, a, b)


def _assert_same_on_every_rank(model):
    for name, p in model.named_parameters():
        gathered = hvd.allgather(p.detach().reshape(1, -1), name='same.' + name)
        assert torch.equal(gathered, p.detach().reshape(1, -1).expand_as(gathered)), name


@pytest.mark.parametrize('make', [
    lambda ps: torch.optim.SGD(ps, lr=0.1),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01),
], ids=['sgd', 'momentum', 'adam'])
def test_ranks_train_like_one_process_on_the_whole_batch(make):
    model, reference = _models()
    opt = hvd.DistributedOptimizer(make(model.parameters()),
                                   named_parameters=model.named_parameters())
    ref_opt = make(reference.parameters())
    assert isinstance(opt, type(ref_opt))
    for x, y in _batches(4):
        opt.zero_grad()
        _loss(model, _mine(x), _mine(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        _loss(reference, x, y).backward()
        ref_opt.step()
    _assert_close(model, reference)
    _assert_same_on_every_rank(model)


def test_backward_passes_per_step_accumulates_locally():
    model, reference = _models()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = _batches(6)
    for (x1, y1), (x2, y2) in zip(batches[0::2], batches[1::2]):
        opt.zero_grad()
        _loss(model, _mine(x1), _mine(y1)).backward()
        _loss(model, _mine(x2), _mine(y2)).backward()
        opt.step()
        ref_opt.zero_grad()
        (_loss(reference, x1, y1) + _loss(reference, x2, y2)).backward()
        ref_opt.step()
    _assert_close(model, reference)


def test_gradient_predivide_factor_gives_the_average():
    model, reference = _models()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   gradient_predivide_factor=2.0)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in _batches(3):
        opt.zero_grad()
        _loss(model, _mine(x), _mine(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        _loss(reference, x, y).backward()
        ref_opt.step()
    _assert_close(model, reference)


def test_sum_op_adds_the_gradients():
    model, reference = _models()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), op=hvd.Sum)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for x, y in _batches(3):
        opt.zero_grad()
        _loss(model, _mine(x), _mine(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        # The sum over ranks of each rank's mean loss.
        sum(_loss(reference, x[r * PER_RANK:(r + 1) * PER_RANK], y[r * PER_RANK:(r + 1) *
                                                                     PER_RANK])
            for r in range(hvd.size())).backward()
        ref_opt.step()
    _assert_close(model, reference)


@pytest.mark.parametrize('groups', ['count', 'lists'])
def test_groups_reduce_like_single_tensors(groups):
    model, reference = _models()
    params = list(model.parameters())
    chosen = 2 if groups == 'count' else [[params[0], params[3]], [params[1]]]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=chosen)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in _batches(3):
        opt.zero_grad()
        _loss(model, _mine(x), _mine(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        _loss(reference, x, y).backward()
        ref_opt.step()
    _assert_close(model, reference)


def test_fp16_compression_reduces_in_half_precision():
    model, reference = _models()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in _batches(3):
        opt.zero_grad()
        _loss(model, _mine(x), _mine(y)).backward()
        opt.step()
        for p in model.parameters():
            assert p.grad.dtype == torch.float32
        ref_opt.zero_grad()
        _loss(reference, x, y).backward()
        ref_opt.step()
    _assert_close(model, reference, atol=1e-2)
    _assert_same_on_every_rank(model)


def test_sparse_gradients_dense_or_gathered():
    for sparse_as_dense in (False, True):
        torch.manual_seed(3)
        model = torch.nn.Embedding(10, 3, sparse=True)
        reference = torch.nn.Embedding(10, 3, sparse=True)
        reference.load_state_dict(model.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                       named_parameters=model.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
        g = torch.Generator().manual_seed(4)
        for _ in range(3):
            idx = torch.randint(0, 10, (hvd.size() * PER_RANK,), generator=g)
            opt.zero_grad()
            model(_mine(idx)).sum().backward()
            opt.step()
            ref_opt.zero_grad()
            (reference(idx).sum() / hvd.size()).backward()
            ref_opt.step()
        assert torch.allclose(model.weight, reference.weight, atol=1e-5), sparse_as_dense


def test_synchronize_then_step_in_skip_synchronize():
    model, reference = _models()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in _batches(2):
        opt.zero_grad()
        _loss(model, _mine(x), _mine(y)).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            with opt.skip_synchronize():
                opt.step()
        ref_opt.zero_grad()
        _loss(reference, x, y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        ref_opt.step()
    _assert_close(model, reference)


def test_zero_grad_before_step_is_refused():
    model, _ = _models()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = _batches(1)[0]
    _loss(model, _mine(x), _mine(y)).backward()
    if hvd.size() > 1:
        with pytest.raises(AssertionError):
            opt.zero_grad()
    opt.step()
    opt.zero_grad()


def test_a_parameter_unused_in_a_step_gets_a_zero_gradient():
    torch.manual_seed(5)
    used, unused = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    params = list(used.named_parameters()) + [('unused.' + n, p)
                                               for n, p in unused.named_parameters()]
    before = unused.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1),
                                   named_parameters=params)
    used(torch.ones(2, 3)).sum().backward()
    opt.step()
    assert torch.equal(unused.weight.detach(), before)
    assert torch.equal(unused.weight.grad, torch.zeros_like(before))


def test_bad_arguments_raise_value_error():
    model, _ = _models()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd, named_parameters=[named[0], named[0]] + named[1:])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd, named_parameters=named[1:])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd, named_parameters=[p for _, p in named])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd, groups=-1)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer('not an optimizer')


def test_state_dict_round_trips():
    model, _ = _models()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    x, y = _batches(1)[0]
    _loss(model, _mine(x), _mine(y)).backward()
    opt.step()
    state = opt.state_dict()
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(state)
    assert len(fresh.state) == len(list(model.parameters()))
