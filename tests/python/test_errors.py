"""The exceptions hvd.torch raises, as Horovod's tests assert them.

Ranks that disagree about an operation (shapes, ranks of tensors, dtypes,
ops, scale factors, broadcast roots) all get HorovodInternalError, a
RuntimeError, from synchronize, and the job goes on: the next collective
works. A bad argument is a ValueError at the call, before anything is
submitted; a name already in flight too.
"""

import pytest
import torch

import hvd.torch as hvd
from exact import reduced, same, values

needs_two = pytest.mark.skipif(hvd.size() < 2, reason='a disagreement needs two ranks')


def _job_goes_on(rank, size):
    """A correct allreduce after a failed one gives the right sum."""
    inputs = [values((17, 3), torch.float32, r) for r in range(size)]
    assert same(hvd.allreduce(inputs[rank], op=hvd.Sum), reduced(inputs, hvd.Sum))


def _fails_everywhere(call, rank, size):
    with pytest.raises(hvd.HorovodInternalError) as info:
        call()
    assert isinstance(info.value, RuntimeError)
    assert str(info.value), 'the error carries no message'
    _job_goes_on(rank, size)
    return str(info.value)


# ==== disagreements between ranks ================================================================

@needs_two
def test_allreduce_of_different_shapes(rank, size):
    _fails_everywhere(lambda: hvd.allreduce(torch.ones([17 + rank] * 3)), rank, size)


@needs_two
def test_allreduce_of_different_ndims(rank, size):
    # The same number of elements in 2 and 3 dimensions.
    shape = [17, 23 * 57] if rank == 0 else [17, 23, 57]
    _fails_everywhere(lambda: hvd.allreduce(torch.ones(shape)), rank, size)


@needs_two
def test_allreduce_of_different_dtypes(rank, size):
    dtype = torch.int32 if rank % 2 == 0 else torch.float32
    message = _fails_everywhere(lambda: hvd.allreduce(torch.ones(17, 17, dtype=dtype)),
                                rank, size)
    assert 'allreduce' in message


@needs_two
def test_allreduce_of_different_ops_and_scales(rank, size):
    op = hvd.Sum if rank == 0 else hvd.Max
    _fails_everywhere(lambda: hvd.allreduce(torch.ones(5), op=op), rank, size)
    scale = 1.0 if rank == 0 else 2.0
    _fails_everywhere(lambda: hvd.allreduce(torch.ones(5), op=hvd.Sum, prescale_factor=scale),
                      rank, size)


@needs_two
def test_grouped_allreduce_disagreeing_in_one_tensor(rank, size):
    tensors = [torch.ones(4), torch.ones(3 if rank == 0 else 4), torch.ones(2)]
    _fails_everywhere(lambda: hvd.grouped_allreduce(tensors, name='disagree'), rank, size)


@needs_two
def test_allgather_of_different_inner_dims(rank, size):
    shape = [17, 10 * (rank + 1), 17]
    _fails_everywhere(lambda: hvd.allgather(torch.ones(shape)), rank, size)


@needs_two
def test_allgather_of_different_dtypes(rank, size):
    dtype = torch.int32 if rank % 2 == 0 else torch.float32
    _fails_everywhere(lambda: hvd.allgather(torch.ones(17, 17, dtype=dtype)), rank, size)


@needs_two
def test_broadcast_of_different_shapes_and_dtypes(rank, size):
    shape = [17, 10 * (rank + 1), 17]
    _fails_everywhere(lambda: hvd.broadcast(torch.ones(shape), 0), rank, size)
    dtype = torch.int32 if rank % 2 == 0 else torch.float32
    _fails_everywhere(lambda: hvd.broadcast(torch.ones(17, dtype=dtype), 0), rank, size)


@needs_two
def test_broadcast_from_different_roots(rank, size):
    _fails_everywhere(lambda: hvd.broadcast(torch.ones(17, 17), rank), rank, size)
    _fails_everywhere(lambda: hvd.broadcast_(torch.ones(17, 17), rank, name='roots'),
                      rank, size)


@needs_two
def test_alltoall_of_different_dtypes_and_inner_dims(rank, size):
    dtype = torch.int32 if rank % 2 == 0 else torch.float32
    _fails_everywhere(lambda: hvd.alltoall(torch.ones(size, dtype=dtype)), rank, size)
    _fails_everywhere(lambda: hvd.alltoall(torch.ones(size, rank + 1)), rank, size)


@needs_two
def test_reducescatter_of_different_shapes_and_dtypes(rank, size):
    _fails_everywhere(lambda: hvd.reducescatter(torch.ones([size * 4 + rank, 3])), rank, size)
    dtype = torch.int32 if rank % 2 == 0 else torch.float32
    _fails_everywhere(lambda: hvd.reducescatter(torch.ones(size * 4, dtype=dtype)), rank, size)


# ==== a name in flight twice =====================================================================

DUPLICATES = {
    'allreduce': lambda t: hvd.allreduce_async(t, name='duplicate_name'),
    'allreduce_': lambda t: hvd.allreduce_async_(t, name='duplicate_name'),
    'allgather': lambda t: hvd.allgather_async(t, name='duplicate_name'),
    'broadcast': lambda t: hvd.broadcast_async(t, 0, name='duplicate_name'),
    'alltoall': lambda t: hvd.alltoall_async(t, name='duplicate_name'),
    'reducescatter': lambda t: hvd.reducescatter_async(t, name='duplicate_name'),
    'grouped_allreduce': lambda t: hvd.grouped_allreduce_async([t, t + 1], name='duplicate_name'),
}


@needs_two
@pytest.mark.parametrize('kind', list(DUPLICATES), ids=str)
def test_duplicate_name_in_flight(kind, rank, size):
    # An operation every rank has submitted may complete within the submit
    # call itself (on rank 0, the coordinator), and its name is then free.
    # So each rank in turn tries the duplicates while the others have not
    # submitted the first operation yet: they submit it only after a
    # broadcast the tester starts when it is done.
    submit = DUPLICATES[kind]
    t = torch.ones(size * 2, 3)
    for tester in range(size):
        gate = 'duplicate.gate.%s.%d' % (kind, tester)
        if rank == tester:
            first = submit(t.clone())
            with pytest.raises(ValueError):
                for _ in range(10):
                    submit(t.clone())
            hvd.broadcast(torch.zeros(1), tester, name=gate)
        else:
            hvd.broadcast(torch.zeros(1), tester, name=gate)
            first = submit(t.clone())
        hvd.synchronize(first)
    # Once synchronized, the name is free again.
    hvd.synchronize(submit(t.clone()))


# ==== bad arguments ==============================================================================

def _non_contiguous():
    t = torch.ones(4, 6).t()
    assert not t.is_contiguous()
    return t


def _splits(size):
    return torch.tensor([1] * size, dtype=torch.int32)


BAD_CALLS = {
    'non_contiguous_allreduce': lambda size: hvd.allreduce(_non_contiguous()),
    'non_contiguous_allgather': lambda size: hvd.allgather(_non_contiguous()),
    'non_contiguous_broadcast': lambda size: hvd.broadcast_(_non_contiguous(), 0),
    'sparse_allgather': lambda size: hvd.allgather(_sparse()),
    'sparse_alltoall': lambda size: hvd.alltoall(_sparse()),
    'sparse_reducescatter': lambda size: hvd.reducescatter(_sparse()),
    'sparse_allreduce_async_': lambda size: hvd.allreduce_async_(_sparse()),
    'complex_allreduce': lambda size: hvd.allreduce(torch.ones(3, dtype=torch.complex64)),
    'complex_broadcast': lambda size: hvd.broadcast(torch.ones(3, dtype=torch.complex128), 0),
    'list_allreduce': lambda size: hvd.allreduce([1.0, 2.0]),
    'list_allreduce_async_': lambda size: hvd.allreduce_async_([1.0, 2.0]),
    'list_broadcast': lambda size: hvd.broadcast([1.0], 0),
    'list_alltoall': lambda size: hvd.alltoall([1.0] * size),
    'list_reducescatter': lambda size: hvd.reducescatter([1.0] * size),
    'not_a_list_grouped': lambda size: hvd.grouped_allreduce(torch.ones(3)),
    'empty_group': lambda size: hvd.grouped_allreduce([]),
    'op_and_average': lambda size: hvd.allreduce(torch.ones(3), average=True, op=hvd.Sum),
    'op_and_average_async': lambda size: hvd.allreduce_async(torch.ones(3), average=False,
                                                            op=hvd.Sum),
    'unknown_op': lambda size: hvd.allreduce(torch.ones(3), op=42),
    'unknown_op_grouped': lambda size: hvd.grouped_allreduce([torch.ones(3)], op='sum'),
    'unknown_op_reducescatter': lambda size: hvd.reducescatter(torch.ones(size), op=-1),
    'bool_average': lambda size: hvd.allreduce(torch.ones(3, dtype=torch.bool), op=hvd.Average),
    'bool_prescale': lambda size: hvd.allreduce(torch.ones(3, dtype=torch.bool), op=hvd.Sum,
                                                prescale_factor=2.0),
    'scale_not_a_number': lambda size: hvd.allreduce(torch.ones(3), prescale_factor='two'),
    'splits_too_short': lambda size: hvd.alltoall(torch.ones(size), _splits(size - 1)),
    'splits_too_long': lambda size: hvd.alltoall(torch.ones(size + 1), _splits(size + 1)),
    'splits_int64': lambda size: hvd.alltoall(torch.ones(size),
                                              torch.ones(size, dtype=torch.int64)),
    'splits_float': lambda size: hvd.alltoall(torch.ones(size),
                                              torch.ones(size, dtype=torch.float32)),
    'splits_2d': lambda size: hvd.alltoall(torch.ones(size),
                                           torch.ones(size, 1, dtype=torch.int32)),
    'splits_past_dim0': lambda size: hvd.alltoall(torch.ones(size - 1), _splits(size)),
    'splits_negative': lambda size: hvd.alltoall(torch.ones(size + 1),
                                                 torch.tensor([2] + [-1] * (size - 1),
                                                              dtype=torch.int32)),
    'splits_not_ints': lambda size: hvd.alltoall(torch.ones(size), ['a'] * size),
    'alltoall_not_divisible': lambda size: hvd.alltoall(torch.ones(size + 1)),
    'alltoall_scalar': lambda size: hvd.alltoall(torch.tensor(1.0)),
    'allgather_scalar': lambda size: hvd.allgather(torch.tensor(1.0)),
    'grouped_allgather_scalar': lambda size: hvd.grouped_allgather([torch.ones(2),
                                                                    torch.tensor(1.0)]),
    'reducescatter_scalar': lambda size: hvd.reducescatter(torch.tensor(1.0), op=hvd.Average),
    'name_not_str': lambda size: hvd.allreduce(torch.ones(3), name=5),
    'name_bytes': lambda size: hvd.allgather(torch.ones(3), name=b'x'),
    'grouped_name_not_str': lambda size: hvd.grouped_allreduce([torch.ones(3)], name=1.5),
    'root_out_of_range': lambda size: hvd.broadcast(torch.ones(3), size),
    'root_negative': lambda size: hvd.broadcast(torch.ones(3), -1),
    'root_not_an_int': lambda size: hvd.broadcast(torch.ones(3), 'zero'),
    'process_set_not_a_set': lambda size: hvd.allreduce(torch.ones(3),
                                                        process_set=list(range(size))),
    'process_set_id': lambda size: hvd.allgather(torch.ones(3), process_set=0),
    'barrier_process_set_id': lambda size: hvd.barrier(process_set=0),
    'unregistered_process_set': lambda size: hvd.allreduce(torch.ones(3),
                                                           process_set=hvd.ProcessSet([0])),
}


def _sparse():
    return torch.ones(3, 3).to_sparse()


# Calls that fail in an autograd function or an output's allocation unless
# checked first.
BAD_CALLS.update({
    'list_allgather': lambda size: hvd.allgather([[1.0], [2.0]]),
    'list_in_grouped_allgather': lambda size: hvd.grouped_allgather([torch.ones(2), [1.0]]),
    'sparse_allreduce': lambda size: hvd.allreduce(_sparse()),
    'sparse_allreduce_async': lambda size: hvd.allreduce_async(_sparse()),
    'sparse_grouped_allreduce': lambda size: hvd.grouped_allreduce([_sparse()]),
    'sparse_broadcast': lambda size: hvd.broadcast(_sparse(), 0),
    'sparse_broadcast_async': lambda size: hvd.broadcast_async(_sparse(), 0),
})


@pytest.mark.parametrize('call', list(BAD_CALLS), ids=str)
def test_bad_argument_is_a_value_error_at_the_call(call, rank, size):
    bad = BAD_CALLS[call]
    with pytest.raises(ValueError):
        bad(size)


def test_bad_arguments_leave_the_job_working(rank, size):
    _job_goes_on(rank, size)


ADASUM = {
    'allreduce of int32': lambda: hvd.allreduce(torch.ones(4, dtype=torch.int32), op=hvd.Adasum),
    'allreduce_ of bool': lambda: hvd.allreduce_(torch.ones(4, dtype=torch.bool), op=hvd.Adasum),
    'grouped_allreduce of int64': lambda: hvd.grouped_allreduce(
        [torch.ones(4), torch.ones(4, dtype=torch.int64)], op=hvd.Adasum),
}


@pytest.mark.parametrize('call', list(ADASUM), ids=str)
def test_adasum_bad_use_is_a_value_error(call, rank, size):
    with pytest.raises(ValueError) as info:
        ADASUM[call]()
    assert 'adasum' in str(info.value)
    _job_goes_on(rank, size)


# ==== a bad tensor in a group submits nothing ====================================================

GROUPED = {
    'grouped_allreduce': lambda ts, name: hvd.grouped_allreduce(ts, name=name, op=hvd.Sum),
    'grouped_allreduce_': lambda ts, name: hvd.grouped_allreduce_(ts, name=name, op=hvd.Sum),
    'grouped_allgather': lambda ts, name: hvd.grouped_allgather(ts, name=name),
    'grouped_reducescatter': lambda ts, name: hvd.grouped_reducescatter(ts, name=name,
                                                                        op=hvd.Sum),
}


@pytest.mark.parametrize('kind', list(GROUPED), ids=str)
def test_a_bad_third_tensor_submits_nothing(kind, rank, size):
    call = GROUPED[kind]
    good = [values((size * 2, 3), torch.float32, rank), values((size,), torch.int32, rank)]
    bad = _non_contiguous() if kind != 'grouped_reducescatter' else torch.tensor(1.0)
    # Unnamed, then named: neither may leave the first two tensors in flight.
    with pytest.raises(ValueError):
        call(good + [bad], None)
    with pytest.raises(ValueError):
        call(good + [bad], 'bad_third')
    # The same names work in a correct call: nothing of the bad ones is
    # pending (a pending one would be a duplicate name, or would take this
    # call's place in another rank's sequence of unnamed operations).
    third = values((size * 2, 5), torch.float64, rank)
    named = call([t.clone() for t in good] + [third.clone()], 'bad_third')
    unnamed = call([t.clone() for t in good] + [third.clone()], None)
    for out in (named, unnamed):
        assert len(out) == 3
        assert out[2].dtype == torch.float64
    everyone = [[values((size * 2, 3), torch.float32, r), values((size,), torch.int32, r),
                 values((size * 2, 5), torch.float64, r)] for r in range(size)]
    if kind.startswith('grouped_allreduce'):
        for i in range(3):
            expected = reduced([everyone[r][i] for r in range(size)], hvd.Sum)
            assert same(named[i], expected) and same(unnamed[i], expected), i
