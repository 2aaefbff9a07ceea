"""Integer-valued test data and the exact results collectives must give.

Every rank can build every other rank's input (values(shape, dtype, r)), so
a test computes the expected result locally, in int64 or float64, and
compares bit for bit. The values are small enough that sums and products
over up to three ranks are exact in every dtype (bfloat16 holds integers up
to 256 exactly, int8 up to 127).
"""

import math

import torch

import hvd.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
NUMERIC = [d for d in DTYPES if d != torch.bool]
INTEGERS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

# 1, 2 and 3 dimensions of 17 (not a multiple of any fusion or pipeline
# size), and shapes with no elements at all.
SHAPES = [(17,), (17, 17), (17, 17, 17)]
EMPTY_SHAPES = [(0,), (4, 0)]

OP_NAMES = {hvd.Sum: 'sum', hvd.Average: 'average', hvd.Min: 'min', hvd.Max: 'max',
            hvd.Product: 'product'}


def dtype_id(dtype):
    """'float32' for torch.float32: test ids that read well."""
    return str(dtype).replace('torch.', '')


def values(shape, dtype, seed):
    """Deterministic integer-valued data in [-4, 5] (uint8: [0, 5]; bool:
    a mix of both), different for each seed; seed is usually the rank."""
    n = math.prod(shape)
    v = (torch.arange(n, dtype=torch.int64) * 7 + seed * 3) % 10
    if dtype == torch.bool:
        v = v >= 5
    elif dtype == torch.uint8:
        v = v % 6
    else:
        v = v - 4
    return v.reshape(shape).to(dtype)


def rows(n, tail, dtype, seed):
    """n rows of shape tail, each row holding seed and its row number, so
    that a gathered or exchanged row says where it came from."""
    shape = (n,) + tuple(tail)
    if dtype == torch.bool:
        return values(shape, dtype, seed)
    per_row = math.prod(tail)
    v = (torch.arange(n * per_row, dtype=torch.int64) // max(per_row, 1)) % 5 + seed
    return v.reshape(shape).to(dtype)


def wide(t):
    """t in int64 or float64, where the expected results are computed."""
    return t.to(torch.float64 if t.dtype.is_floating_point else torch.int64)


def reduced(inputs, op):
    """What reducing inputs (one tensor per rank) with op gives, in their dtype."""
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        stacked = torch.stack(inputs)
        either = op in (hvd.Sum, hvd.Max)
        return (stacked.any(0) if either else stacked.all(0)).reshape(inputs[0].shape)
    stacked = torch.stack([wide(t) for t in inputs])
    if op == hvd.Sum:
        out = stacked.sum(0)
    elif op == hvd.Average:
        out = stacked.sum(0)
        out = out / len(inputs) if dtype.is_floating_point else \
            torch.div(out, len(inputs), rounding_mode='trunc')
    elif op == hvd.Min:
        out = stacked.min(0).values
    elif op == hvd.Max:
        out = stacked.max(0).values
    elif op == hvd.Product:
        out = stacked.prod(0)
    else:
        raise AssertionError('no such op %r' % op)
    return out.reshape(inputs[0].shape).to(dtype)


def balanced(shape, dtype, size):
    """One input per rank whose average is exactly values(shape, dtype, 0):
    ranks 0 and 1 add and subtract 2, so that the sum is size times the
    base and dividing it is exact whatever the rounding of 1/size."""
    base = values(shape, dtype, 0)
    if dtype == torch.uint8:
        base = base + 2
    inputs = [base.clone() for _ in range(size)]
    if size > 1:
        inputs[0] += 2
        inputs[1] -= 2
    return base, inputs


def scaled(t, factor):
    """t times factor as hvd scales: in the dtype for floating point, in
    double then truncated toward zero for integers."""
    if t.dtype.is_floating_point:
        return (t.double() * factor).to(t.dtype)
    return (t.double() * factor).trunc().to(t.dtype)


def share(dim0, rank, size):
    """(first row, rows) of rank's part of a reducescatter of dim0 rows: the
    first dim0 % size ranks get one row more."""
    q, extra = divmod(dim0, size)
    return rank * q + min(rank, extra), q + (1 if rank < extra else 0)


def same(actual, expected):
    """True when actual has expected's dtype, shape and every value."""
    return actual.dtype == expected.dtype and actual.shape == expected.shape and \
        torch.equal(actual, expected)
