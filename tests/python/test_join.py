"""hvd.torch's join: a rank that runs out of data joins while the others
go on reducing; it contributes the reduction's identity (zeros for a sum
or an average, which still divides by the whole size), the other
collectives fail on the ranks that call them, and join returns the rank
that joined last, the same on every rank.

Collectives that only some ranks call are named: a generated name counts
the calls of each rank, so an unnamed call that the joined rank does not
make would shift the numbering of every later unnamed call on the others.
No barrier and no process set is added in this file: after a join round, a
barrier or add_process_set that one rank called while another was inside
join can hang (a known defect of the C library).
"""

import itertools

import pytest
import torch

import hvd.torch as hvd
from exact import DTYPES, NUMERIC, OP_NAMES, dtype_id, reduced, same, values

needs_two = pytest.mark.skipif(hvd.size() < 2, reason='joining early needs two ranks')


def _contributions(inputs, joined, identity):
    """inputs with the joined rank's replaced by identity."""
    return [identity(t) if r == joined else t for r, t in enumerate(inputs)]


def _zeros(t):
    return torch.zeros_like(t)


def _join_results_agree(ret, rank, size, first):
    """Every rank got the same last rank, and it is not one that joined
    first (while the others were still reducing)."""
    every = hvd.allgather(torch.tensor([ret]), name='join.returned')
    return every.tolist() == [ret] * size and 0 <= ret < size and (size == 1 or ret != first)


@pytest.mark.parametrize('caching', [False, True], ids=['fresh', 'cached'])
@pytest.mark.parametrize('dtype', NUMERIC, ids=dtype_id)
def test_join_allreduce(dtype, caching, rank, size):
    # Horovod's test_horovod_join_allreduce: two tensors (fusion), every
    # rank in turn joining first, with the names seen before or not.
    checks = []
    for dims, first in itertools.product((1, 2, 3), range(size)):
        # Multiples of size: the average of size-1 copies and a zero is exact.
        a = values((5,) * dims, dtype, 1) * size
        b = values((17,) * dims, dtype, 2) * size
        if caching:
            hvd.synchronize(hvd.allreduce_async(a, name='tensor_a', op=hvd.Average))
            hvd.synchronize(hvd.allreduce_async(b, name='tensor_b', op=hvd.Average))
        if rank == first:
            ret = hvd.join()
        else:
            handle_a = hvd.allreduce_async(a, name='tensor_a', op=hvd.Average)
            handle_b = hvd.allreduce_async(b, name='tensor_b', op=hvd.Average)
            averaged = (hvd.synchronize(handle_a), hvd.synchronize(handle_b))
            ret = hvd.join()
            expected = [reduced(_contributions([t] * size, first, _zeros), hvd.Average)
                        for t in (a, b)]
            checks.append(((dims, first), averaged, expected))
        assert _join_results_agree(ret, rank, size, first), (dims, first, ret)
    for case, averaged, expected in checks:
        assert same(averaged[0], expected[0]), case
        assert same(averaged[1], expected[1]), case


IDENTITY = {
    hvd.Sum: _zeros,
    hvd.Min: lambda t: torch.ones_like(t) if t.dtype == torch.bool else
    torch.full_like(t, float('inf') if t.dtype.is_floating_point else torch.iinfo(t.dtype).max),
    hvd.Max: lambda t: torch.zeros_like(t) if t.dtype == torch.bool else
    torch.full_like(t, float('-inf') if t.dtype.is_floating_point else torch.iinfo(t.dtype).min),
    hvd.Product: torch.ones_like,
}


@needs_two
@pytest.mark.parametrize('op', list(IDENTITY), ids=lambda op: OP_NAMES[op])
def test_joined_rank_contributes_the_identity(op, rank, size):
    # hvd's rule (hvd.h, hvd_join): the identity of each op, so that Min,
    # Max and Product reduce over the ranks that have not joined.
    joined = size - 1
    checks = []
    for dtype in DTYPES:
        inputs = [values((3, 7), dtype, r + 1) for r in range(size)]
        if rank == joined:
            ret = hvd.join()
        else:
            out = hvd.allreduce(inputs[rank], op=op, name='identity.%s' % dtype_id(dtype))
            ret = hvd.join()
            checks.append((dtype, out, reduced(_contributions(inputs, joined, IDENTITY[op]), op)))
        assert _join_results_agree(ret, rank, size, joined)
    for dtype, out, expected in checks:
        assert same(out, expected), dtype


@needs_two
def test_join_with_scaled_and_grouped_allreduce(rank, size):
    joined = 0
    inputs = [values((17,), torch.float32, r) for r in range(size)]
    ints = [values((4, 4), torch.int32, r) for r in range(size)]
    if rank == joined:
        ret = hvd.join()
    else:
        scaled = hvd.allreduce(inputs[rank], op=hvd.Sum, prescale_factor=2.0,
                               postscale_factor=0.5, name='scaled_in_join')
        grouped = hvd.grouped_allreduce([inputs[rank], ints[rank]], op=hvd.Sum,
                                        name='grouped_new_in_join')
        inplace = [inputs[rank].clone(), ints[rank].clone()]
        hvd.grouped_allreduce_(inplace, op=hvd.Sum, name='grouped_in_join')
        ret = hvd.join()
    assert _join_results_agree(ret, rank, size, joined)
    if rank != joined:
        summed = reduced(_contributions(inputs, joined, _zeros), hvd.Sum)
        summed_ints = reduced(_contributions(ints, joined, _zeros), hvd.Sum)
        assert same(scaled, summed)
        assert same(grouped[0], summed) and same(grouped[1], summed_ints)
        assert same(inplace[0], summed) and same(inplace[1], summed_ints)


# Named, as the module's docstring says why.
OTHER_COLLECTIVES = {
    'allgather': lambda size, name: hvd.allgather(torch.ones(17, 17), name=name),
    'broadcast': lambda size, name: hvd.broadcast(torch.ones(17, 17), 1, name=name),
    'alltoall': lambda size, name: hvd.alltoall(torch.ones(size * 2, 3), name=name),
    'reducescatter': lambda size, name: hvd.reducescatter(torch.ones(size * 2, 3), name=name),
    'grouped_allgather': lambda size, name: hvd.grouped_allgather([torch.ones(2), torch.ones(3)],
                                                                  name=name),
}


@needs_two
@pytest.mark.parametrize('kind', list(OTHER_COLLECTIVES), ids=str)
def test_other_collectives_fail_while_a_rank_has_joined(kind, rank, size):
    # Horovod's test_horovod_join_allgather and _join_broadcast: rank 0 joins,
    # the others' collective raises, then they join too.
    error = None
    if rank == 0:
        ret = hvd.join()
    else:
        try:
            OTHER_COLLECTIVES[kind](size, 'while_joined')
        except hvd.HorovodInternalError as e:
            error = e
        ret = hvd.join()
    assert _join_results_agree(ret, rank, size, 0)
    if rank != 0:
        assert isinstance(error, RuntimeError), '%s did not fail while rank 0 had joined' % kind
    # After the round, the same collective works again.
    out = OTHER_COLLECTIVES[kind](size, 'after_join')
    assert out is not None


def test_joins_back_to_back(rank, size):
    # Nothing to reduce: every rank joins at once, several rounds in a row.
    rets = [hvd.join() for _ in range(3)]
    rets.append(hvd.join(device=-1))
    every = hvd.allgather(torch.tensor([rets]), name='join.back_to_back')
    assert every.tolist() == [rets] * size
    assert all(isinstance(r, int) and 0 <= r < size for r in rets)


def test_collectives_work_after_join_rounds(rank, size):
    inputs = [values((17, 5), torch.float64, r) for r in range(size)]
    assert same(hvd.allreduce(inputs[rank], op=hvd.Sum), reduced(inputs, hvd.Sum))
    assert same(hvd.allgather(inputs[rank]), torch.cat(inputs))
    assert same(hvd.broadcast(inputs[rank], size - 1), inputs[size - 1])
