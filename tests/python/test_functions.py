"""broadcast_parameters, broadcast_optimizer_state, broadcast_object and
allgather_object.

Run on 2 and 3 ranks: build/bin/hvdrun -np N /usr/bin/python3 -m pytest ...
Every rank can rebuild what any other rank holds (models, data and steps
come from seeds that name the rank), so each checks the result of a
broadcast against the root's values computed locally, exactly.
"""

import pytest
import torch

import hvd.torch as hvd


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                               torch.nn.Linear(3, 2))


def _integer_model(seed):
    """A model whose every value is an integer-valued float (seed + offset)."""
    model = _model(0)
    with torch.no_grad():
        for i, t in enumerate(model.state_dict().values()):
            t.copy_(torch.arange(t.numel()).reshape(t.shape) + 100 * seed + i)
    return model


def _assert_same_state(actual, expected):
    assert list(actual.keys()) == list(expected.keys())
    for key in expected:
        assert torch.equal(actual[key], expected[key]), key


def _roots():
    """Rank 0 and the last rank."""
    return sorted({0, hvd.size() - 1})


# ==== broadcast_parameters ======================================================================

@pytest.mark.parametrize('root', _roots())
@pytest.mark.parametrize('form', ['state_dict', 'named_parameters', 'named_parameters_list',
                                  'parameters', 'parameters_list'])
def test_broadcast_parameters_takes_every_form(form, root):
    model = _integer_model(hvd.rank())
    expected = _integer_model(root)
    params = {
        'state_dict': lambda: model.state_dict(),
        'named_parameters': lambda: model.named_parameters(),
        'named_parameters_list': lambda: list(model.named_parameters()),
        'parameters': lambda: model.parameters(),
        'parameters_list': lambda: list(model.parameters()),
    }[form]()
    hvd.broadcast_parameters(params, root_rank=root)
    if form == 'state_dict':  # buffers too (the running statistics)
        _assert_same_state(model.state_dict(), expected.state_dict())
    else:
        for (name, p), q in zip(model.named_parameters(), expected.parameters()):
            assert torch.equal(p, q), name
        assert model[1].running_mean[0].item() == 100 * hvd.rank() + 4  # untouched


def test_broadcast_parameters_keeps_parameters_trainable():
    model = _integer_model(hvd.rank())
    hvd.broadcast_parameters(model.named_parameters(), 0)
    assert all(p.requires_grad and p.grad_fn is None for p in model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    assert model[0].weight.grad is not None


def test_broadcast_parameters_of_pairs_with_one_name_twice():
    a = torch.full((3,), float(hvd.rank()))
    b = torch.full((2, 2), 10.0 + hvd.rank())
    hvd.broadcast_parameters([('w', a), ('w', b), ('none', None)], root_rank=0)
    assert torch.equal(a, torch.zeros(3))
    assert torch.equal(b, torch.full((2, 2), 10.0))


def test_broadcast_parameters_into_tensors_that_are_not_contiguous():
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4) + hvd.rank()
    view = base.t()
    assert not view.is_contiguous()
    hvd.broadcast_parameters({'t': view, 'int': torch.tensor([7 + hvd.rank()])}, root_rank=0)
    assert torch.equal(base, torch.arange(12, dtype=torch.float64).reshape(3, 4))


def test_broadcast_parameters_in_a_row_under_the_same_names():
    for width in (3, 5, 1):
        params = {'weight': torch.full((width, 2), float(hvd.rank() + width)),
                  'bias': torch.full((width,), float(-hvd.rank()))}
        hvd.broadcast_parameters(params, root_rank=0, prefix='row')
        assert torch.equal(params['weight'], torch.full((width, 2), float(width)))
        assert torch.equal(params['bias'], torch.zeros(width))


@pytest.mark.parametrize('params', [
    torch.zeros(3), 5, 'weights', [1, 2], [('w', 3.0)], [('a', torch.zeros(1), 'b')],
], ids=['tensor', 'int', 'str', 'ints', 'pair-of-float', 'triple'])
def test_broadcast_parameters_refuses_other_forms(params):
    with pytest.raises(ValueError):
        hvd.broadcast_parameters(params, root_rank=0)


def test_broadcast_parameters_within_a_process_set():
    if hvd.size() < 2:
        pytest.skip('needs 2 ranks')
    members = list(range(1, hvd.size()))
    process_set = hvd.add_process_set(members)
    try:
        t = {'x': torch.full((4,), float(hvd.rank()))}
        if hvd.rank() in members:
            hvd.broadcast_parameters(t, root_rank=hvd.size() - 1, process_set=process_set)
        expected = hvd.size() - 1 if hvd.rank() in members else 0
        assert torch.equal(t['x'], torch.full((4,), float(expected)))
    finally:
        hvd.remove_process_set(process_set)


# ==== broadcast_optimizer_state =================================================================

OPTIMIZERS = {
    'sgd-momentum': lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9, weight_decay=0.01),
    'adam': lambda ps, lr: torch.optim.Adam(ps, lr=lr, betas=(0.8, 0.9)),
}


def _trained(kind, data_seed, lr, steps=1):
    """A model (seed 0 on every rank) and its optimizer after `steps` local
    steps on data from data_seed."""
    model = _model(0)
    opt = OPTIMIZERS[kind](model.parameters(), lr)
    g = torch.Generator().manual_seed(data_seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 4, generator=g)).pow(2).sum().backward()
        opt.step()
    return model, opt


def _assert_same_optimizer(actual, expected):
    a, e = actual.state_dict(), expected.state_dict()
    assert a['param_groups'] == e['param_groups']
    assert sorted(a['state']) == sorted(e['state'])
    for pid, entries in e['state'].items():
        assert sorted(a['state'][pid]) == sorted(entries), pid
        for key, value in entries.items():
            mine = a['state'][pid][key]
            if isinstance(value, torch.Tensor):
                assert mine.dtype == value.dtype and torch.equal(mine, value), (pid, key)
            else:
                assert mine == value, (pid, key)


@pytest.mark.parametrize('root', _roots())
@pytest.mark.parametrize('kind', sorted(OPTIMIZERS))
def test_broadcast_optimizer_state_after_steps_on_different_data(kind, root):
    _, opt = _trained(kind, data_seed=hvd.rank(), lr=0.1 * (hvd.rank() + 1),
                      steps=1 + hvd.rank())
    _, expected = _trained(kind, data_seed=root, lr=0.1 * (root + 1), steps=1 + root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    _assert_same_optimizer(opt, expected)
    assert opt.param_groups[0]['lr'] == pytest.approx(0.1 * (root + 1))


@pytest.mark.parametrize('kind', sorted(OPTIMIZERS))
def test_broadcast_optimizer_state_to_ranks_that_have_not_stepped(kind):
    """Only the root has state: the others create theirs with a zero step
    that leaves their parameters as they were and, as Horovod's, zero
    gradients where there were none."""
    if hvd.rank() == 0:
        model, opt = _trained(kind, data_seed=0, lr=0.1)
    else:
        model = _model(0)
        opt = OPTIMIZERS[kind](model.parameters(), 0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    _assert_same_optimizer(opt, _trained(kind, data_seed=0, lr=0.1)[1])
    _assert_same_state(model.state_dict(), before)
    if hvd.rank() != 0:
        assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


def test_broadcast_optimizer_state_of_distributed_optimizer_without_state_on_some_ranks():
    """The zero step of a DistributedOptimizer reduces nothing: only the
    ranks without state take it, which would otherwise never complete."""
    model = _model(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    if hvd.rank() == 0:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        with opt.skip_synchronize():
            opt.step()  # a local step: rank 0 alone has state
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for p in model.parameters():
        assert torch.equal(opt.state[p]['momentum_buffer'], torch.ones_like(p))


class _Counting(torch.optim.Optimizer):
    """An optimizer whose state holds a plain int and a tensor."""

    def __init__(self, params):
        super().__init__(params, dict(lr=1.0, tag='counting'))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group['params']:
                state = self.state[p]
                state['count'] = state.get('count', 0) + 1
                state['total'] = state.get('total', torch.zeros_like(p)) + p.grad


def test_broadcast_optimizer_state_of_values_that_are_not_tensors():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = _Counting([p])
    for _ in range(hvd.rank() + 2):
        p.grad = torch.full((3,), float(hvd.rank()))
        opt.step()
    opt.param_groups[0]['tag'] = 'rank%d' % hvd.rank()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.state[p]['count'] == 2
    assert torch.equal(opt.state[p]['total'], torch.zeros(3))
    assert opt.param_groups[0]['tag'] == 'rank0'


def test_broadcast_optimizer_state_drops_what_the_root_does_not_have():
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.5)
    params[0].grad = torch.ones(2)
    if hvd.rank() != 0:
        params[1].grad = torch.ones(2)  # state for params[1] here, not on rank 0
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert params[1] not in opt.state
    assert torch.equal(opt.state[params[0]]['momentum_buffer'], torch.ones(2))


def test_broadcast_optimizer_state_of_a_different_optimizer_raises_after_the_broadcasts():
    """A rank whose optimizer has fewer parameters than the root's still
    takes part in every broadcast, then raises ValueError; the others go on."""
    count = 3 if hvd.rank() == 0 else 2
    params = [torch.nn.Parameter(torch.full((2,), float(i))) for i in range(count)]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.5)
    for p in params:
        p.grad = torch.ones(2)
    opt.step()
    if hvd.rank() == 0:
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    else:
        with pytest.raises(ValueError, match='does not match'):
            hvd.broadcast_optimizer_state(opt, root_rank=0)
    hvd.broadcast_optimizer_state(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                                  root_rank=0)  # and the job goes on


def test_broadcast_optimizer_state_refuses_lbfgs_and_non_optimizers():
    with pytest.raises(ValueError, match='LBFGS'):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS([torch.nn.Parameter(torch.zeros(1))]),
                                      root_rank=0)
    with pytest.raises(ValueError, match='Optimizer'):
        hvd.broadcast_optimizer_state({'state': {}}, root_rank=0)


# ==== broadcast_object and allgather_object =====================================================

@pytest.mark.parametrize('root', _roots())
def test_broadcast_object_from_the_root_only(root):
    scale = 3
    expected = {'epoch': 7, 'names': ['a', 'b'], 'weights': torch.arange(5.0),
                'scaled': lambda x: x * scale}
    # Other ranks pass an object of another type: the default name must not depend on it.
    obj = hvd.broadcast_object(expected if hvd.rank() == root else None, root_rank=root)
    assert obj['epoch'] == 7 and obj['names'] == ['a', 'b']
    assert torch.equal(obj['weights'], torch.arange(5.0))
    assert obj['scaled'](2) == 6


def test_broadcast_object_in_a_row():
    for n in (0, 1, 1000, 3, 50000):
        obj = list(range(n + hvd.rank())) if hvd.rank() == 0 else 'not used'
        assert hvd.broadcast_object(obj) == list(range(n))
        assert hvd.broadcast_object(obj, 0, name='named') == list(range(n))


def test_broadcast_object_within_a_process_set():
    if hvd.size() < 2:
        pytest.skip('needs 2 ranks')
    members = list(range(1, hvd.size()))
    process_set = hvd.add_process_set(members)
    try:
        if hvd.rank() in members:
            got = hvd.broadcast_object(('from', hvd.rank()), root_rank=members[-1],
                                       process_set=process_set)
            assert got == ('from', members[-1])
            everyone = hvd.allgather_object(hvd.rank() * 10, process_set=process_set)
            assert everyone == [r * 10 for r in members]
    finally:
        hvd.remove_process_set(process_set)


def test_allgather_object_of_different_sizes_and_types():
    def obj_of(r):
        return {'rank': r, 'data': list(range(10 * r))} if r % 2 == 0 else ('odd', r)

    assert hvd.allgather_object(obj_of(hvd.rank())) == [obj_of(r) for r in range(hvd.size())]
    assert hvd.allgather_object(None) == [None] * hvd.size()
    assert hvd.allgather_object(hvd.rank(), name='ranks') == list(range(hvd.size()))


def test_object_helpers_refuse_a_name_that_is_not_a_str():
    with pytest.raises(ValueError, match='name'):
        hvd.broadcast_object(1, 0, name=3)
    with pytest.raises(ValueError, match='name'):
        hvd.allgather_object(1, name=b'x')
