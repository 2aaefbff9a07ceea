"""hvd.torch's collectives give exact results: allreduce (every op, scaled,
in place or not, many in flight), grouped allreduce, allgather, grouped
allgather, broadcast, alltoall, reducescatter, grouped reducescatter, the
sparse allreduce, barrier, fp16 compression, and the gradients of the
differentiable forms, for every dtype hvd takes.

Each rank builds every rank's input (exact.values), so the expected result
is computed locally and compared bit for bit. Tests issue all their
collectives before asserting, so that a wrong value on one rank does not
leave the others waiting.
"""

import gc
import os
import time

import pytest
import torch

import hvd.torch as hvd
from exact import (DTYPES, EMPTY_SHAPES, FLOATS, INTEGERS, NUMERIC, OP_NAMES, SHAPES, balanced,
                   dtype_id, reduced, rows, same, scaled, share, values)

REDUCE_OPS = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]


def op_id(op):
    return OP_NAMES[op]


def wait_until(predicate, seconds=60):
    """Polls predicate until it holds; False after `seconds`."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


# ==== allreduce ==================================================================================

@pytest.mark.parametrize('inplace', [False, True], ids=['new', 'inplace'])
@pytest.mark.parametrize('op', REDUCE_OPS, ids=op_id)
@pytest.mark.parametrize('dtype', DTYPES, ids=dtype_id)
def test_allreduce(dtype, op, inplace, rank, size):
    results = []
    for shape in SHAPES + EMPTY_SHAPES + [()]:
        inputs = [values(shape, dtype, r) for r in range(size)]
        mine = inputs[rank].clone()
        out = hvd.allreduce_(mine, op=op) if inplace else hvd.allreduce(mine, op=op)
        results.append((shape, mine, out, inputs))
    for shape, mine, out, inputs in results:
        assert same(out, reduced(inputs, op)), shape
        if inplace:
            assert out is mine
        else:
            assert same(mine, inputs[rank]), 'the input changed'


@pytest.mark.parametrize('inplace', [False, True], ids=['new', 'inplace'])
@pytest.mark.parametrize('dtype', NUMERIC, ids=dtype_id)
def test_allreduce_average(dtype, inplace, size, rank):
    results = []
    for shape in SHAPES + EMPTY_SHAPES:
        base, inputs = balanced(shape, dtype, size)
        mine = inputs[rank].clone()
        out = hvd.allreduce_(mine, op=hvd.Average) if inplace else hvd.allreduce(mine)
        results.append((shape, base, out))
    for shape, base, out in results:
        assert same(out, base), shape


@pytest.mark.parametrize('dtype', INTEGERS, ids=dtype_id)
def test_allreduce_average_of_integers_truncates_toward_zero(dtype, rank, size):
    # rank r sends +-(r+1) (+ for uint8): the averages 1.5, -1.5 (2 ranks)
    # or 2, -2 (3 ranks); and 1, 2, 4: 3/2 or 7/3.
    signs = torch.tensor([1, -1] if dtype != torch.uint8 else [1, 1])
    inputs = [(signs * (r + 1)).to(dtype) for r in range(size)]
    uneven = [torch.tensor([1 << r]).to(dtype) for r in range(size)]
    out = hvd.allreduce(inputs[rank], op=hvd.Average)
    out_uneven = hvd.allreduce(uneven[rank], op=hvd.Average)
    assert same(out, reduced(inputs, hvd.Average))
    assert same(out_uneven, reduced(uneven, hvd.Average))


def test_allreduce_default_op_is_average_and_average_flag_still_works(rank, size):
    base, inputs = balanced((17,), torch.float32, size)
    out = hvd.allreduce(inputs[rank])
    with pytest.deprecated_call():
        summed = hvd.allreduce(inputs[rank], average=False)
    with pytest.deprecated_call():
        averaged = hvd.allreduce(inputs[rank], average=True)
    assert same(out, base)
    assert same(summed, reduced(inputs, hvd.Sum))
    assert same(averaged, base)


SCALES = [(2.0, 1.0), (1.0, 3.0), (0.5, 2.0), (0.25, 0.5)]


@pytest.mark.parametrize('dtype', NUMERIC, ids=dtype_id)
def test_allreduce_prescale_postscale(dtype, rank, size):
    results = []
    for pre, post in SCALES:
        for shape in SHAPES[:2]:
            inputs = [values(shape, dtype, r) for r in range(size)]
            out = hvd.allreduce(inputs[rank], op=hvd.Sum, prescale_factor=pre,
                                postscale_factor=post)
            inplace = inputs[rank].clone()
            hvd.allreduce_(inplace, op=hvd.Sum, prescale_factor=pre, postscale_factor=post)
            expected = scaled(reduced([scaled(t, pre) for t in inputs], hvd.Sum), post)
            results.append(((pre, post, shape), out, inplace, expected))
    for case, out, inplace, expected in results:
        assert same(out, expected), case
        assert same(inplace, expected), case


@pytest.mark.parametrize('dtype', FLOATS, ids=dtype_id)
def test_allreduce_average_with_scales_is_the_predivided_average(dtype, rank, size):
    # DistributedOptimizer's gradient_predivide_factor f: prescale 1/f, postscale f.
    base, inputs = balanced((17, 17), dtype, size)
    out = hvd.allreduce(inputs[rank], op=hvd.Average, prescale_factor=0.5, postscale_factor=2.0)
    assert same(out, base)


def test_allreduce_many_in_flight_synchronized_in_reverse(rank, size):
    pending = []
    for i, (dtype, shape) in enumerate((d, s) for d in DTYPES for s in SHAPES + [(0,)]):
        inputs = [values(shape, dtype, r) for r in range(size)]
        name = 'reverse.%d' % i if i % 2 else None
        handle = hvd.allreduce_async(inputs[rank], name=name, op=hvd.Sum)
        pending.append((handle, reduced(inputs, hvd.Sum)))
    polled = [hvd.poll(h) for h, _ in pending]
    results = [(hvd.synchronize(h), expected) for h, expected in reversed(pending)]
    assert all(isinstance(p, bool) for p in polled)
    for out, expected in results:
        assert same(out, expected)
    # A synchronized handle is gone: synchronize gives None, poll refuses it.
    assert hvd.synchronize(pending[0][0]) is None
    with pytest.raises(ValueError):
        hvd.poll(pending[0][0])


def test_poll_is_false_until_every_rank_has_submitted(rank, size):
    # The other ranks submit the allreduce only after a broadcast that rank
    # 0 starts after its poll: at that poll the allreduce cannot be done.
    t = torch.full((5,), float(rank + 1))
    if rank == 0:
        handle = hvd.allreduce_async(t, name='poll.gated', op=hvd.Sum)
        early = hvd.poll(handle)
        hvd.broadcast(torch.zeros(1), 0, name='poll.gate')
    else:
        hvd.broadcast(torch.zeros(1), 0, name='poll.gate')
        handle = hvd.allreduce_async(t, name='poll.gated', op=hvd.Sum)
        early = False
    done = wait_until(lambda: hvd.poll(handle))
    out = hvd.synchronize(handle)
    assert done, 'poll never turned True'
    assert same(out, torch.full((5,), float(size * (size + 1) // 2)))
    if size > 1:
        assert early is False


def test_async_inputs_outlive_the_callers_references(rank, size):
    # The handle keeps the tensors alive: nothing here holds them.
    shape = (33, 17)
    inputs = [values(shape, torch.float32, r) for r in range(size)]
    new = hvd.allreduce_async(inputs[rank].clone(), op=hvd.Sum)
    inplace = hvd.allreduce_async_(inputs[rank].clone(), op=hvd.Sum)
    gathered = hvd.allgather_async(rows(rank + 1, (17,), torch.float32, rank))
    broadcast = hvd.broadcast_async_(inputs[rank].clone(), 0)
    scattered = hvd.reducescatter_async(inputs[rank].clone(), op=hvd.Sum)
    gc.collect()
    litter = [torch.full(shape, -7.0) for _ in range(64)]  # reuses freed memory
    results = [hvd.synchronize(h) for h in (new, inplace, gathered, broadcast, scattered)]
    del litter
    first, n = share(shape[0], rank, size)
    summed = reduced(inputs, hvd.Sum)
    assert same(results[0], summed)
    assert same(results[1], summed)
    assert same(results[2], torch.cat([rows(r + 1, (17,), torch.float32, r)
                                       for r in range(size)]))
    assert same(results[3], inputs[0])
    assert same(results[4], summed[first:first + n])


# ==== grouped allreduce ==========================================================================

@pytest.mark.parametrize('inplace', [False, True], ids=['new', 'inplace'])
@pytest.mark.parametrize('dtype', DTYPES, ids=dtype_id)
def test_grouped_allreduce(dtype, inplace, rank, size):
    results = []
    for shape in SHAPES:
        inputs = [[values(shape, dtype, r + 3 * i) for i in range(5)] for r in range(size)]
        mine = [t.clone() for t in inputs[rank]]
        if inplace:
            out = hvd.grouped_allreduce_(mine, op=hvd.Sum)
        else:
            out = hvd.grouped_allreduce(mine, op=hvd.Sum, name='grouped.%d' % len(shape))
        results.append((shape, mine, out, inputs))
    for shape, mine, out, inputs in results:
        assert len(out) == 5
        for i in range(5):
            assert same(out[i], reduced([inputs[r][i] for r in range(size)], hvd.Sum)), \
                (shape, i)
            if inplace:
                assert out[i] is mine[i]
            else:
                assert same(mine[i], inputs[rank][i])


# One group, one tensor of each dtype and of several shapes.
MIXED = [(torch.float32, (17,)), (torch.int32, (17, 17)), (torch.float16, (3,)),
         (torch.int8, (2, 3, 4)), (torch.bfloat16, (5,)), (torch.float64, ()),
         (torch.uint8, (0,)), (torch.int64, (7, 1)), (torch.int16, (4,)), (torch.bool, (9,))]


@pytest.mark.parametrize('op', REDUCE_OPS, ids=op_id)
def test_grouped_allreduce_of_mixed_dtypes(op, rank, size):
    inputs = [[values(shape, dtype, r + i) for i, (dtype, shape) in enumerate(MIXED)]
              for r in range(size)]
    out = hvd.grouped_allreduce(inputs[rank], op=op)
    inplace = [t.clone() for t in inputs[rank]]
    hvd.grouped_allreduce_(inplace, op=op, name='mixed')
    for i in range(len(MIXED)):
        expected = reduced([inputs[r][i] for r in range(size)], op)
        assert same(out[i], expected), MIXED[i]
        assert same(inplace[i], expected), MIXED[i]


def test_grouped_allreduce_average_and_async(rank, size):
    numeric = [(d, s) for d, s in MIXED if d != torch.bool]
    groups = [balanced(shape, dtype, size) for dtype, shape in numeric]
    handle = hvd.grouped_allreduce_async([inputs[rank] for _, inputs in groups],
                                         op=hvd.Average, name='async.average')
    mine = [inputs[rank].clone() for _, inputs in groups]
    handle_ = hvd.grouped_allreduce_async_(mine, op=hvd.Average)
    out = hvd.synchronize(handle)
    out_ = hvd.synchronize(handle_)
    for i, (base, _) in enumerate(groups):
        assert same(out[i], base), numeric[i]
        assert same(out_[i], base), numeric[i]
        assert out_[i] is mine[i]


# ==== allgather ==================================================================================

# Rows each rank sends: equal, rank r sends r+1, rank 0 sends none, nobody sends any.
ROW_COUNTS = {'equal': lambda r: 17, 'rank_plus_one': lambda r: r + 1,
              'rank0_empty': lambda r: 0 if r == 0 else r + 2, 'all_empty': lambda r: 0}


@pytest.mark.parametrize('counts', list(ROW_COUNTS), ids=str)
@pytest.mark.parametrize('dtype', DTYPES, ids=dtype_id)
def test_allgather(dtype, counts, rank, size):
    results = []
    for dims in (1, 2, 3):
        tail = (17,) * (dims - 1)
        inputs = [rows(ROW_COUNTS[counts](r), tail, dtype, r) for r in range(size)]
        results.append((dims, hvd.allgather(inputs[rank]), inputs))
    for dims, out, inputs in results:
        assert same(out, torch.cat(inputs)), dims


def test_allgather_async_many_in_flight(rank, size):
    pending = []
    for dtype in DTYPES:
        for dims in (1, 2, 3):
            tail = (17,) * (dims - 1)
            inputs = [rows(r + 2, tail, dtype, r) for r in range(size)]
            pending.append((hvd.allgather_async(inputs[rank]), torch.cat(inputs)))
    results = [(hvd.synchronize(h), expected) for h, expected in reversed(pending)]
    for out, expected in results:
        assert same(out, expected)
    # The output is an ordinary, writable tensor.
    out = results[0][0]
    assert out.is_contiguous()
    out.zero_()
    assert not out.any()


def test_allgather_output_is_torchs_own(rank, size):
    # hvd's output is copied into a tensor torch allocated, and hvd's buffer
    # goes with the handle: no DLPack tensor stays behind, and torch grows
    # the output as any tensor of its own, keeping its values.
    from hvd import _dlpack
    before = len(_dlpack._live)
    out = hvd.allgather(torch.ones(3, 5) * rank, name='torchs_own')
    assert len(_dlpack._live) == before
    out.resize_(3 * size + 2, 5)
    assert out.shape == (3 * size + 2, 5)
    assert torch.equal(out[:3 * size], (torch.arange(size).repeat_interleave(3) * 1.0)
                       .reshape(-1, 1).expand(-1, 5))


def test_grouped_allgather(rank, size):
    specs = [(torch.float32, (4,)), (torch.int64, ()), (torch.uint8, (2, 3)),
             (torch.bfloat16, (5,)), (torch.bool, (3,)), (torch.float16, (1, 1))]
    inputs = [[rows(r + i % 2, tail, dtype, r) for i, (dtype, tail) in enumerate(specs)]
              for r in range(size)]
    out = hvd.grouped_allgather(inputs[rank], name='grouped')
    out_async = hvd.synchronize(hvd.grouped_allgather_async(inputs[rank]))
    for i in range(len(specs)):
        expected = torch.cat([inputs[r][i] for r in range(size)])
        assert same(out[i], expected), specs[i]
        assert same(out_async[i], expected), specs[i]


# ==== broadcast ==================================================================================

@pytest.mark.parametrize('inplace', [False, True], ids=['new', 'inplace'])
@pytest.mark.parametrize('dtype', DTYPES, ids=dtype_id)
def test_broadcast(dtype, inplace, rank, size):
    results = []
    for root in range(size):
        for shape in SHAPES + [(0,), ()]:
            inputs = [values(shape, dtype, r) for r in range(size)]
            mine = inputs[rank].clone()
            out = hvd.broadcast_(mine, root) if inplace else hvd.broadcast(mine, root)
            results.append(((root, shape), mine, out, inputs))
    for case, mine, out, inputs in results:
        root = case[0]
        assert same(out, inputs[root]), case
        if inplace:
            assert out is mine
        else:
            assert same(mine, inputs[rank]), 'the input changed'


def test_broadcast_async_from_every_root(rank, size):
    pending = []
    for root in range(size):
        inputs = [values((17, 17), torch.float64, r) for r in range(size)]
        pending.append((hvd.broadcast_async(inputs[rank], root, name='async.%d' % root),
                        inputs[root]))
        mine = inputs[rank].clone()
        pending.append((hvd.broadcast_async_(mine, root), inputs[root]))
    for handle, expected in pending:
        assert same(hvd.synchronize(handle), expected)


# ==== alltoall ===================================================================================

def _to_each_rank_tensor(dtype, dims, rank, size):
    """What rank sends in Horovod's alltoall test: rank+1 rows of value p
    for each rank p (bool: p odd), widened along 2**(dims-1) columns."""
    vals = []
    for p in range(size):
        vals += [p] * (rank + 1)
    t = torch.tensor(vals, dtype=torch.int64)
    for _ in range(dims - 1):
        t = t.unsqueeze(1)
        t = torch.cat((t, t), dim=1)
    return (t % 2 == 1) if dtype == torch.bool else t.to(dtype)


@pytest.mark.parametrize('dtype', DTYPES, ids=dtype_id)
def test_alltoall_with_splits(dtype, rank, size):
    results = []
    for dims in (1, 2, 3):
        t = _to_each_rank_tensor(dtype, dims, rank, size)
        splits = torch.tensor([rank + 1] * size, dtype=torch.int32)
        results.append((dims, hvd.alltoall(t, splits)))
    for dims, (out, received) in results:
        mine = (rank % 2 == 1) if dtype == torch.bool else rank
        assert out.dtype == dtype
        assert bool((out == mine).all()), dims
        assert out.numel() == size * (size + 1) // 2 * 2 ** (dims - 1)
        assert received.dtype == torch.int32
        assert received.tolist() == [r + 1 for r in range(size)]


def _sends(src, dst):
    """Rows rank src sends to rank dst (some zero)."""
    return (src + 2 * dst) % 3


def _block(src, dst, dtype):
    """The rows src sends dst: each says who sent it to whom, and which it is."""
    n = _sends(src, dst)
    v = torch.arange(n, dtype=torch.int64) + 100 * src + 10 * dst
    return v.reshape(n, 1).expand(n, 3).contiguous().to(dtype)


@pytest.mark.parametrize('as_list', [False, True], ids=['tensor_splits', 'list_splits'])
@pytest.mark.parametrize('dtype', [torch.int16, torch.int32, torch.int64, torch.float32,
                                   torch.float64], ids=dtype_id)
def test_alltoall_uneven_splits_exact(dtype, as_list, rank, size):
    t = torch.cat([_block(rank, p, dtype) for p in range(size)])
    splits = [_sends(rank, p) for p in range(size)]
    if not as_list:
        splits = torch.tensor(splits, dtype=torch.int32)
    out, received = hvd.alltoall(t, splits)
    out_async, received_async = hvd.synchronize(hvd.alltoall_async(t, splits, name='uneven'))
    expected = torch.cat([_block(q, rank, dtype) for q in range(size)])
    assert same(out, expected)
    assert same(out_async, expected)
    assert received.tolist() == [_sends(q, rank) for q in range(size)]
    assert received_async.tolist() == received.tolist()


@pytest.mark.parametrize('dtype', DTYPES, ids=dtype_id)
def test_alltoall_equal_split_without_splits(dtype, rank, size):
    # Horovod's equal-split test: size*(rank+1) rows, value p to rank p.
    results = []
    for dims in (1, 2, 3):
        results.append((dims, hvd.alltoall(_to_each_rank_tensor(dtype, dims, rank, size))))
    exact_in = torch.cat([rows(2, (4,), dtype, 10 * rank + p) for p in range(size)])
    exact_out = hvd.alltoall(exact_in)
    for dims, out in results:
        mine = (rank % 2 == 1) if dtype == torch.bool else rank
        assert isinstance(out, torch.Tensor)
        assert bool((out == mine).all()), dims
        assert out.numel() == size * (size + 1) // 2 * 2 ** (dims - 1)
    assert same(exact_out, torch.cat([rows(2, (4,), dtype, 10 * q + rank) for q in range(size)]))


def test_alltoall_of_nothing(rank, size):
    out, received = hvd.alltoall(torch.zeros(0, 5), [0] * size)
    assert same(out, torch.zeros(0, 5))
    assert received.tolist() == [0] * size


# ==== reducescatter ==============================================================================

def _first_dims(size):
    # Divisible, not divisible, fewer rows than ranks.
    return [size * 4, size * 4 + 1, size + 2, 1]


@pytest.mark.parametrize('dtype', DTYPES, ids=dtype_id)
def test_reducescatter_sum(dtype, rank, size):
    results = []
    for dim0 in _first_dims(size):
        for tail in [(), (5,), (3, 2)]:
            inputs = [values((dim0,) + tail, dtype, r) for r in range(size)]
            out = hvd.reducescatter(inputs[rank], op=hvd.Sum)
            results.append(((dim0, tail), out, inputs))
    for (dim0, tail), out, inputs in results:
        first, n = share(dim0, rank, size)
        assert same(out, reduced(inputs, hvd.Sum)[first:first + n]), (dim0, tail)


@pytest.mark.parametrize('dtype', NUMERIC, ids=dtype_id)
def test_reducescatter_average_is_the_default(dtype, rank, size):
    results = []
    for dim0 in _first_dims(size):
        base, inputs = balanced((dim0, 3), dtype, size)
        results.append((dim0, base, hvd.reducescatter(inputs[rank]),
                        hvd.reducescatter(inputs[rank], op=hvd.Average)))
    for dim0, base, default, average in results:
        first, n = share(dim0, rank, size)
        assert same(default, base[first:first + n]), dim0
        assert same(average, base[first:first + n]), dim0


@pytest.mark.parametrize('dtype', NUMERIC, ids=dtype_id)
def test_reducescatter_prescale_postscale(dtype, rank, size):
    results = []
    for pre, post in SCALES:
        dim0 = size * 2 + 1
        inputs = [values((dim0, 4), dtype, r) for r in range(size)]
        out = hvd.reducescatter(inputs[rank], op=hvd.Sum, prescale_factor=pre,
                                postscale_factor=post)
        expected = scaled(reduced([scaled(t, pre) for t in inputs], hvd.Sum), post)
        results.append(((pre, post), dim0, out, expected))
    for case, dim0, out, expected in results:
        first, n = share(dim0, rank, size)
        assert same(out, expected[first:first + n]), case


def test_reducescatter_async_many_in_flight(rank, size):
    pending = []
    for dtype in NUMERIC:
        dim0 = size * 3 + 2
        inputs = [values((dim0, 17), dtype, r) for r in range(size)]
        pending.append((hvd.reducescatter_async(inputs[rank], op=hvd.Sum), dim0,
                        reduced(inputs, hvd.Sum)))
    for handle, dim0, summed in reversed(pending):
        first, n = share(dim0, rank, size)
        assert same(hvd.synchronize(handle), summed[first:first + n])


@pytest.mark.parametrize('op', [hvd.Sum, hvd.Average], ids=op_id)
def test_grouped_reducescatter(op, rank, size):
    specs = [(torch.float32, (size * 2, 3)), (torch.int32, (size + 1,)),
             (torch.float64, (1, 2)), (torch.bfloat16, (size * 3 + 2, 2)),
             (torch.int64, (5, 1, 2))]
    groups = [balanced(shape, dtype, size) for dtype, shape in specs]
    out = hvd.grouped_reducescatter([inputs[rank] for _, inputs in groups], op=op,
                                    name='grouped')
    out_async = hvd.synchronize(hvd.grouped_reducescatter_async(
        [inputs[rank] for _, inputs in groups], op=op))
    for i, (base, inputs) in enumerate(groups):
        first, n = share(specs[i][1][0], rank, size)
        expected = (base if op == hvd.Average else reduced(inputs, hvd.Sum))[first:first + n]
        assert same(out[i], expected), specs[i]
        assert same(out_async[i], expected), specs[i]


# ==== sparse allreduce, barrier ==================================================================

def _sparse(rank, dtype=torch.float32):
    """Rows rank and rank+1 of a 6x3 matrix, holding 6*(rank+1)*[1, 2, 3]."""
    indices = torch.tensor([[rank, rank + 1]])
    row = torch.tensor([1.0, 2.0, 3.0], dtype=dtype) * 6 * (rank + 1)
    return torch.sparse_coo_tensor(indices, torch.stack([row, row]), (6, 3))


@pytest.mark.parametrize('op', [hvd.Sum, hvd.Average], ids=op_id)
def test_sparse_allreduce(op, rank, size):
    wait = hvd.sparse_allreduce_async(_sparse(rank), name='sparse.%s' % op_id(op), op=op)
    out = wait()
    dense = sum(_sparse(r).to_dense() for r in range(size))
    if op == hvd.Average:
        dense = dense / size
    assert out.is_sparse
    assert out.shape == (6, 3)
    assert same(out.to_dense(), dense)


def test_barrier(rank, size, shared_dir):
    # What rank 0 writes before the barrier every rank sees after it.
    marker = os.path.join(shared_dir, 'before_barrier')
    if rank == 0:
        with open(marker, 'w') as f:
            f.write('written')
    assert hvd.barrier() is None
    hvd.barrier(process_set=hvd.global_process_set)
    assert os.path.exists(marker)


# ==== compression ================================================================================

def test_fp16_compression_sends_float16_and_returns_the_input_dtype(rank, size):
    # 2049 is not a float16: it travels as 2048, which proves the cast.
    x = torch.tensor([1.0, -3.0, 2049.0, 0.5], dtype=torch.float32)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    as_double = hvd.allreduce(x.double(), op=hvd.Sum, compression=hvd.Compression.fp16)
    ints = hvd.allreduce(torch.arange(4, dtype=torch.int32), op=hvd.Sum,
                         compression=hvd.Compression.fp16)
    grouped = hvd.grouped_allreduce([x, x.double()], op=hvd.Sum,
                                    compression=hvd.Compression.fp16)
    plain = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.none)
    shares = hvd.reducescatter(x.repeat(size), op=hvd.Sum, compression=hvd.Compression.fp16)
    via_fp16 = torch.tensor([1.0, -3.0, 2048.0, 0.5]) * size
    assert same(out, via_fp16)
    assert same(as_double, via_fp16.double())
    assert same(ints, torch.arange(4, dtype=torch.int32) * size)
    assert same(grouped[0], via_fp16) and same(grouped[1], via_fp16.double())
    assert same(plain, x * size)
    assert same(shares, via_fp16)


# ==== gradients ==================================================================================
# Horovod's conventions (test_torch.py): each rank's gradient is reduced
# across ranks. Allreduce: the gradients' allreduce with the same op and
# scales. Alltoall: sent back the way it came. Allgather and broadcast:
# the gradients' average (this rank's rows; on the root only).
# Reducescatter: every rank's part gathered, times size for Sum.

GRAD_DTYPES = [torch.float32, torch.float64]

# The gradients follow horovod.torch's conventions: allgather and
# broadcast average the gradients over the ranks, reducescatter gathers
# them back (times the size for Sum).


def _leaf(shape, dtype, seed):
    return values(shape, dtype, seed).requires_grad_()


@pytest.mark.parametrize('op', [hvd.Sum, hvd.Average], ids=op_id)
def test_allreduce_grad(op, rank, size):
    cases = []
    for dtype in GRAD_DTYPES:
        for shape in SHAPES:
            x = _leaf(shape, dtype, rank)
            hvd.allreduce(x, op=op).backward(torch.ones(shape, dtype=dtype))
            cases.append(x)
            y = _leaf(shape, dtype, rank)
            hvd.allreduce(y, op=op, prescale_factor=0.5, postscale_factor=3.0).backward(
                torch.ones(shape, dtype=dtype))
            cases.append(y)
    factor = size if op == hvd.Sum else 1
    for i, x in enumerate(cases):
        scale = 1.5 if i % 2 else 1.0
        assert same(x.grad, torch.full_like(x, factor * scale).detach()), i


@pytest.mark.parametrize('op', [hvd.Sum, hvd.Average], ids=op_id)
def test_grouped_allreduce_grad(op, rank, size):
    cases = []
    for dtype in GRAD_DTYPES:
        for shape in SHAPES:
            xs = [_leaf(shape, dtype, rank + i) for i in range(3)]
            for s in hvd.grouped_allreduce(xs, op=op):
                s.backward(torch.ones(shape, dtype=dtype))
            cases += xs
    factor = size if op == hvd.Sum else 1
    for x in cases:
        assert same(x.grad, torch.full_like(x, factor).detach())


def _gathered_rows_grad(rank, size, grouped):
    """allgather's gradient: rank r's rows of the gradient hold r+1 on every
    rank, so their average is r+1 and their sum (r+1)*size."""
    counts = [3, 2, 7][:size] + [4] * max(0, size - 3)
    grads = []
    for dtype in GRAD_DTYPES:
        for dims in (1, 2, 3):
            tail = (17,) * (dims - 1)
            grad_out = torch.cat([torch.full((counts[r],) + tail, r + 1.0, dtype=dtype)
                                  for r in range(size)])
            xs = [_leaf((counts[rank],) + tail, dtype, rank + i)
                  for i in range(2 if grouped else 1)]
            gathered = hvd.grouped_allgather(xs) if grouped else [hvd.allgather(xs[0])]
            for g in gathered:
                g.backward(grad_out)
            grads += [x.grad for x in xs]
    return grads


@pytest.mark.parametrize('grouped', [False, True], ids=['allgather', 'grouped_allgather'])
def test_allgather_grad(grouped, rank, size):
    for grad in _gathered_rows_grad(rank, size, grouped):
        assert same(grad, torch.full_like(grad, rank + 1.0))


def test_broadcast_grad(rank, size):
    grads = []
    for root in range(size):
        for dtype in GRAD_DTYPES:
            for shape in SHAPES:
                x = _leaf(shape, dtype, rank)
                hvd.broadcast(x, root).backward(torch.ones(shape, dtype=dtype))
                grads.append((root, x.grad))
    for root, grad in grads:
        assert same(grad, torch.full_like(grad, 1.0 if rank == root else 0.0)), root


@pytest.mark.parametrize('with_splits', [False, True], ids=['equal', 'splits'])
def test_alltoall_grad(with_splits, rank, size):
    grads = []
    for dtype in GRAD_DTYPES:
        for dims in (1, 2, 3):
            x = _to_each_rank_tensor(dtype, dims, rank, size).requires_grad_()
            if with_splits:
                out, _ = hvd.alltoall(x, torch.tensor([rank + 1] * size, dtype=torch.int32))
            else:
                out = hvd.alltoall(x)
            # Weight each received row by the rank it came from.
            weights = torch.cat([torch.full((r + 1,) + tuple(x.shape[1:]), r + 1.0, dtype=dtype)
                                 for r in range(size)])
            out.backward(weights)
            grads.append(x.grad)
    # Rows sent to rank p come back weighted by this rank + 1.
    for grad in grads:
        assert same(grad, torch.full_like(grad, rank + 1.0))


def _scattered_grads(op, rank, size, grouped):
    grads = []
    for dtype in GRAD_DTYPES:
        for dims in (1, 2, 3):
            shape = (size * 4,) + (size * 4,) * (dims - 1)
            xs = [_leaf(shape, dtype, rank + i) for i in range(2 if grouped else 1)]
            outs = hvd.grouped_reducescatter(xs, op=op) if grouped else \
                [hvd.reducescatter(xs[0], op=op)]
            for out in outs:
                out.backward(torch.ones(out.shape, dtype=dtype))
            grads += [x.grad for x in xs]
    return grads


@pytest.mark.parametrize('grouped', [False, True], ids=['reducescatter', 'grouped'])
@pytest.mark.parametrize('op', [hvd.Sum, hvd.Average], ids=op_id)
def test_reducescatter_grad(op, grouped, rank, size):
    expected = size if op == hvd.Sum else 1
    for grad in _scattered_grads(op, rank, size, grouped):
        assert same(grad, torch.full_like(grad, float(expected)))
