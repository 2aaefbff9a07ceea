"""op=hvd.Adasum from Python: allreduce and grouped allreduce against a
serial reference of the documented tree (docs/adasum.md), the same bits on
every rank, and DistributedOptimizer(op=hvd.Adasum)'s delta semantics."""

import pytest
import torch

import hvd.torch as hvd


def adasum_pair(a, b):
    dot, aa, bb = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
    ca = 1 - dot / (2 * aa) if aa >= 1e-8 else 1.0
    cb = 1 - dot / (2 * bb) if bb >= 1e-8 else 1.0
    return ca * a + cb * b


def adasum_tree(vectors):
    """The first 2 * rem fold in pairs, then distance 1, 2, 4, ... (float64)."""
    n = len(vectors)
    p = 1
    while p * 2 <= n:
        p *= 2
    rem = n - p
    v = [adasum_pair(vectors[2 * i], vectors[2 * i + 1]) for i in range(rem)]
    v += vectors[2 * rem:]
    d = 1
    while d < p:
        v = [adasum_pair(v[i], v[i + 1]) if i % 2 == 0 else None for i in range(len(v))]
        v = [x for x in v if x is not None]
        d *= 2
    return v[0]


def rank_tensor(rank, shape, dtype, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)


def everyone_has(t, name):
    every = hvd.allgather(t.reshape(1, -1).contiguous(), name=name)
    return all(torch.equal(every[r], every[0]) for r in range(hvd.size()))


TOLERANCE = {torch.float64: 1e-11, torch.float32: 1e-5, torch.float16: 2e-2,
             torch.bfloat16: 8e-2}


@pytest.mark.parametrize('dtype', list(TOLERANCE), ids=str)
def test_allreduce_adasum_matches_reference(rank, size, dtype):
    shape = (33, 7)
    got = hvd.allreduce(rank_tensor(rank, shape, dtype), op=hvd.Adasum,
                        name='adasum.%s' % dtype)
    ref = adasum_tree([rank_tensor(r, shape, dtype).double() for r in range(size)])
    assert got.dtype == dtype and got.shape == shape
    assert float((got.double() - ref).abs().max()) <= TOLERANCE[dtype] * float(ref.abs().max())
    assert everyone_has(got, 'adasum.same.%s' % dtype)


def test_grouped_adasum_is_per_tensor(rank, size):
    # Fused into one buffer, each tensor still gets its own coefficients.
    shapes = [(5,), (100, 3), (1,), (17, 2)]
    inputs = [rank_tensor(rank, s, torch.float32, salt=k) for k, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce(inputs, op=hvd.Adasum, name='adasum.grouped')
    for k, s in enumerate(shapes):
        ref = adasum_tree([rank_tensor(r, s, torch.float32, salt=k).double()
                           for r in range(size)])
        assert torch.allclose(outs[k].double(), ref, rtol=0, atol=1e-5 * float(ref.abs().max()))


def test_identical_and_orthogonal_gradients(rank, size):
    same = hvd.allreduce(torch.arange(12, dtype=torch.float32), op=hvd.Adasum,
                         name='adasum.identical')
    assert torch.equal(same, torch.arange(12, dtype=torch.float32))
    mine = torch.zeros(4 * size)
    mine[rank * 4:(rank + 1) * 4] = rank + 1.0
    total = hvd.allreduce(mine, op=hvd.Adasum, name='adasum.orthogonal')
    expect = torch.arange(1, size + 1, dtype=torch.float32).repeat_interleave(4)
    assert torch.equal(total, expect)


def test_distributed_optimizer_adasum_applies_combined_deltas(rank, size):
    if size == 1:
        pytest.skip('one rank: op=Adasum is the plain optimizer')
    torch.manual_seed(5)  # the same initial weights everywhere
    model = torch.nn.Linear(6, 3)
    start = [p.detach().clone() for p in model.parameters()]
    lr = 0.1
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    data = rank_tensor(rank, (8, 6), torch.float32, salt=3)
    loss = model(data).pow(2).sum()
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    # Every rank's delta is -lr * its gradient; the result is start + adasum(deltas).
    every = [hvd.allgather(g.reshape(1, -1), name='adasum.opt.grad.%d' % i)
             for i, g in enumerate(grads)]
    for i, p in enumerate(model.parameters()):
        deltas = [(-lr * every[i][r]).double() for r in range(size)]
        expect = start[i].double() + adasum_tree(deltas).reshape(p.shape)
        assert torch.allclose(p.detach().double(), expect, atol=1e-5), \
            'parameter %d is not start + adasum(deltas)' % i
        assert everyone_has(p.detach(), 'adasum.opt.same.%d' % i)
    opt.zero_grad()
    with pytest.raises(AssertionError):
        with opt.skip_synchronize():
            pass


def test_distributed_optimizer_adasum_refuses_groups(size):
    if size == 1:
        pytest.skip('one rank: op=Adasum is the plain optimizer')
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), op=hvd.Adasum,
                                 groups=2)
