"""horovod.torch's collectives on torch tensors, over hvd's C API.

Every collective checks its arguments before anything is submitted (a bad
one raises ValueError at the call), submits through hvd_*_async and
returns a handle for poll() and synchronize(); a failure in hvd raises
HorovodInternalError carrying hvd's message (Horovod's, for a call before
hvd.init()). Names given by the caller are prefixed with the collective
("allreduce.<name>"), as Horovod does, so that an allreduce and a
broadcast may share a name; without one hvd generates it, and ranks must
then call in the same order (allreduce and allreduce_, which wait, share one
name instead: see _allreduce_now). Outputs hvd allocates (allgather,
alltoall) are copied into tensors torch allocates (see _adopt).
"""

import threading
import warnings

import torch
import torch.utils.dlpack

from hvd import _core, _dlpack, _lib
from hvd._core import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set,
                       barrier as _barrier, ccl_built, cross_rank, cross_size, cuda_built,
                       ddl_built, global_process_set, gloo_built, gloo_enabled, init,
                       is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                       mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
                       remove_process_set, rocm_built, shutdown, size, synchronize)
from hvd._lib import lib
from hvd.exceptions import HorovodInternalError
from hvd.torch.compression import Compression

__all__ = [
    'Adasum', 'Average', 'Max', 'Min', 'Product', 'Sum', 'ProcessSet', 'global_process_set',
    'add_process_set', 'remove_process_set', 'init', 'shutdown', 'is_initialized', 'rank', 'size',
    'local_rank', 'local_size', 'cross_rank', 'cross_size', 'is_homogeneous', 'mpi_built',
    'mpi_enabled', 'mpi_threads_supported', 'gloo_built', 'gloo_enabled', 'nccl_built',
    'cuda_built', 'rocm_built', 'ddl_built', 'ccl_built', 'start_timeline', 'stop_timeline',
    'allreduce', 'allreduce_', 'allreduce_async', 'allreduce_async_', 'grouped_allreduce',
    'grouped_allreduce_', 'grouped_allreduce_async', 'grouped_allreduce_async_', 'allgather',
    'allgather_async', 'grouped_allgather', 'grouped_allgather_async', 'broadcast', 'broadcast_',
    'broadcast_async', 'broadcast_async_', 'alltoall', 'alltoall_async', 'reducescatter',
    'reducescatter_async', 'grouped_reducescatter', 'grouped_reducescatter_async',
    'sparse_allreduce_async', 'join', 'barrier', 'poll', 'synchronize', 'HorovodInternalError',
]

_DTYPES = {
    torch.uint8: _lib.UINT8,
    torch.int8: _lib.INT8,
    torch.int16: _lib.INT16,
    torch.int32: _lib.INT32,
    torch.int64: _lib.INT64,
    torch.float16: _lib.FLOAT16,
    torch.bfloat16: _lib.BFLOAT16,
    torch.float32: _lib.FLOAT32,
    torch.float64: _lib.FLOAT64,
    torch.bool: _lib.BOOL,
}


# ==== checks =====================================================================================

def _dtype_device(tensor, what):
    """hvd's dtype and device of a tensor hvd can take, else ValueError."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError('%s takes a torch.Tensor, not %s' % (what, type(tensor).__name__))
    if tensor.layout != torch.strided:
        raise ValueError('%s: %s tensors are not supported (sparse gradients go through '
                         'sparse_allreduce_async)' % (what, tensor.layout))
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError('Tensor type %s is not supported.' % tensor.type())
    if not tensor.is_contiguous():
        raise ValueError('Tensor is required to be contiguous.')
    if tensor.is_cpu:
        return dtype, _lib.DEVICE_CPU
    if tensor.is_cuda:
        if not _core.cuda_built():
            raise ValueError('%s: the tensor is on %s, and this build of hvd has no GPU support'
                             % (what, tensor.device))
        # hvd's stream does not wait for torch's: the input must be complete.
        torch.cuda.current_stream(tensor.device).synchronize()
        return dtype, tensor.device.index
    raise ValueError('%s: tensors on %s are not supported' % (what, tensor.device))


def _new_output(tensor, what):
    """An output shaped like `tensor`, which is checked first."""
    _dtype_device(tensor, what)
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def _check_list(tensors, what):
    """A grouped call's tensors, every one checked before anything runs."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) == 0:
        raise ValueError('%s takes a non-empty list of tensors' % what)
    for t in tensors:
        _dtype_device(t, what)


_NAMES_MAX = 4096  # names remembered; past it the cache starts again
_names = {}  # (kind, the caller's name): the C name


def _name(kind, name):
    """The C name of a collective's `name` ("allreduce.<name>"), remembered
    per name: training loops pass the same names every step."""
    if name is None:
        return None
    key = (kind, name)
    c_name = _names.get(key)
    if c_name is None:
        if not isinstance(name, str):
            raise ValueError('name must be a str, not %r' % (name,))
        if len(_names) >= _NAMES_MAX:
            _names.clear()
        c_name = _names[key] = _lib.check_name('%s.%s' % (kind, name))
    return c_name


def _group_names(kind, name, n):
    if name is None:
        return [None] * n
    if not isinstance(name, str):
        raise ValueError('name must be a str, not %r' % (name,))
    return [_lib.check_name('%s.%s_%dof%d' % (kind, name, i + 1, n)) for i in range(n)]


def _scale(value, what):
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError('%s must be a number, not %r' % (what, value)) from None


def _op_from(op, average, what):
    """Horovod's op from op and the deprecated average flag."""
    if op is not None and average is not None:
        raise ValueError('The op parameter supersedes average. Please provide only one of them.')
    if average is not None:
        warnings.warn('Parameter `average` has been replaced with `op` and will be removed '
                      'in v1.0', DeprecationWarning)
        return Average if average else Sum
    return Average if op is None else op


_options_made = {}  # (op, prescale, postscale, set id, root, device): Options, its pointer


def _options(op=Sum, prescale=1.0, postscale=1.0, process_set=global_process_set, root=0,
             device=_lib.DEVICE_CPU, what='allreduce'):
    """A pointer to the hvd_options of these arguments. hvd copies the
    options at submission and nothing writes them after, so one structure
    per combination serves every call, on any thread."""
    try:  # the arguments as given, when they were seen before
        return _options_made[(op, prescale, postscale, process_set.process_set_id, root,
                              device)][1]
    except (KeyError, TypeError, AttributeError):
        pass
    key = (op, _scale(prescale, 'prescale_factor'), _scale(postscale, 'postscale_factor'),
           _core.set_id(process_set), root, device)
    made = _options_made.get(key)
    if made is None:
        o = _lib.Options(_core.reduce_op(op, what), key[1], key[2], key[3], root, device)
        if len(_options_made) >= _NAMES_MAX:
            _options_made.clear()
        made = _options_made[key] = (o, _lib.options_ref(o))
    return made[1]


def _not_initialized():
    """Horovod's error for a collective before hvd.init() (its queries, such
    as rank(), raise ValueError with the same words)."""
    return HorovodInternalError(_core.NOT_INITIALIZED)


def _initialized_call(fn, *args):
    """fn(*args), with Horovod's words for a call before hvd.init() instead
    of the C library's."""
    try:
        return fn(*args)
    except HorovodInternalError:
        if not lib.hvd_is_initialized():
            raise _not_initialized() from None
        raise


def _submit(call, args, keep, finish):
    return _initialized_call(_core.submit, call, args, keep, finish)


def _tensors(kind, tensors, names, outputs):
    """The hvd_tensor array of a group, every tensor checked first."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) == 0:
        raise ValueError('%s takes a non-empty list of tensors' % kind)
    checked = [_dtype_device(t, kind) for t in tensors]
    devices = set(d for _, d in checked)
    if len(devices) > 1:
        raise ValueError('%s: the tensors of a group must all be on one device' % kind)
    array = _lib.tensor_array([
        (names[i], checked[i][0], t.shape, t.data_ptr(),
         outputs[i].data_ptr() if outputs is not None else None) for i, t in enumerate(tensors)])
    return array, checked[0][1]


class _NoGraph(object):
    """The ctx of a forward run outside autograd."""

    def mark_non_differentiable(self, *tensors):
        pass


def _run(function, *args):
    """function.apply(*args) when a gradient may be wanted; else just its
    forward, which gives the same result without autograd's bookkeeping
    (several µs per call, more than the rest of a small allreduce's Python)."""
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                       for a in args):
        return function.apply(*args)
    return function.forward(_NoGraph(), *args)


def _adopt(c, index, dtype, ndims, device):
    """The output hvd allocated for tensor `index` of a completed handle,
    copied into a tensor torch allocates: an ordinary tensor whose storage
    torch can grow (resize_), as Horovod's outputs are. hvd's buffer goes
    with the handle. A tensor over hvd's memory could not grow, and torch
    1.13's resize_ sets the new sizes before it finds that out: the tensor
    then claimed memory past hvd's buffer."""
    if device != _lib.DEVICE_CPU:
        raw, shape = _hvd_bytes(c, index, device)
        out = torch.empty(tuple(shape[:ndims]), dtype=dtype, device=torch.device('cuda', device))
        if raw is not None:
            out.view(-1).view(torch.uint8).copy_(raw)
        return out
    address, nbytes, shape = _core.output_at(c, index)
    out = torch.empty(tuple(shape[:ndims]), dtype=dtype)
    if out.numel() * out.element_size() != nbytes:
        raise HorovodInternalError('hvd: output %d has %d bytes, not the %d of its shape %s'
                                   % (index, nbytes, out.numel() * out.element_size(),
                                      tuple(out.shape)))
    if nbytes:
        _lib.copy_bytes(out.data_ptr(), address, nbytes)
    return out


def _hvd_bytes(c, index, device):
    """Output `index` of a completed handle, taken from it: (a uint8 tensor
    over hvd's own memory, host or GPU, None for 0 bytes; the shape). The
    memory goes back to hvd when the last tensor over it is freed
    (hvd/_dlpack.py)."""
    address, nbytes, shape = _core.take_output(c, index)
    if nbytes == 0:
        (lib.hvd_output_free if device == _lib.DEVICE_CPU else lib.hvd_output_free_gpu)(address)
        return None, shape
    return torch.utils.dlpack.from_dlpack(_dlpack.bytes_capsule(address, nbytes, device)), shape


# ==== allreduce ==================================================================================

def _submit_one(call, kind, tensor, output, name, options, dtype):
    """Submits a collective of one tensor into `output`; returns the handle,
    whose result is `output`."""
    t = _lib.tensor_ref(_name(kind, name), dtype, tensor.shape, tensor.data_ptr(),
                        output.data_ptr())
    return _submit(call, (t, options), (tensor, output), lambda c: output)


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set,
                     checked=None):
    dtype, device = checked or _dtype_device(tensor, 'allreduce')
    o = _options(op, prescale_factor, postscale_factor, process_set, device=device)
    return _submit_one(lib.hvd_allreduce_async, 'allreduce', tensor, output, name, o, dtype)


# The name of every unnamed allreduce that waits for its result
# (allreduce, allreduce_): one name, so that its repetitions hit hvd's
# response cache as named ones do. A rank has at most one of them in flight
# per process set (_unnamed_now: a lock per set, so that sets never wait
# for each other), so ranks still pair them in the order they call them,
# and ranks that disagree about one still fail with hvd's mismatch error.
_UNNAMED_NOW = b'allreduce.noname.now'
_unnamed_now = {}  # process set id: its lock


def _allreduce_now(tensor, output, name, op, prescale_factor, postscale_factor, process_set,
                   checked):
    """Reduces `tensor` into `output` and returns `output`: submitted, waited
    for and released in one C call when it completes within a wait slice
    (else waited for as synchronize waits, interruptibly)."""
    dtype, device = checked
    o = _options(op, prescale_factor, postscale_factor, process_set, device=device)
    if name is not None:
        return _wait_for(_name('allreduce', name), dtype, tensor, output, o)
    lock = _unnamed_now.get(process_set.process_set_id)  # a registered set: _options checked
    if lock is None:
        lock = _unnamed_now.setdefault(process_set.process_set_id, threading.Lock())
    with lock:
        return _wait_for(_UNNAMED_NOW, dtype, tensor, output, o)


def _wait_for(c_name, dtype, tensor, output, options):
    t = _lib.tensor_ref(c_name, dtype, tensor.shape, tensor.data_ptr(), output.data_ptr())
    status, pending = _lib.allreduce_wait_for(t, options, _core.WAIT_SLICE_MS)
    if status == _lib.OK:
        return output
    return _initialized_call(_core.outcome, status, pending, (tensor, output), lambda c: output)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the ranks of the process set (op:
    Average by default, Sum, Min, Max, Product) into a new tensor; returns a
    handle for poll() and synchronize(), which returns that tensor. The
    input must not change until then. prescale_factor multiplies every
    input, postscale_factor the result."""
    op = _op_from(op, average, 'allreduce')
    checked = _dtype_device(tensor, 'allreduce')
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set, checked)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """allreduce_async in place: synchronize() returns `tensor`, reduced."""
    op = _op_from(op, average, 'allreduce')
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce with a gradient: the gradient's allreduce, same op and scales."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        checked = _dtype_device(tensor, 'allreduce')
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        return _allreduce_now(tensor, output, name, _op_from(op, average, 'allreduce'),
                              prescale_factor, postscale_factor, process_set, checked)

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                          prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor, process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over the ranks of the process set and returns the
    result as a new tensor (differentiable). compression decides what
    travels (Compression.fp16: float16)."""
    checked = _dtype_device(tensor, 'allreduce')
    if compression is Compression.none and not (tensor.requires_grad and
                                                torch.is_grad_enabled()):
        # No gradient wanted: no autograd Function, and the checks made once.
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        return _allreduce_now(tensor, output, name, _op_from(op, average, 'allreduce'),
                              prescale_factor, postscale_factor, process_set, checked)
    tensor_compressed, ctx = compression.compress(tensor)
    reduced = _run(HorovodAllreduce, tensor_compressed, average, name, op, prescale_factor,
                                     postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` in place and returns it."""
    checked = _dtype_device(tensor, 'allreduce')
    return _allreduce_now(tensor, tensor, name, _op_from(op, average, 'allreduce'),
                          prescale_factor, postscale_factor, process_set, checked)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set):
    names = _group_names('grouped_allreduce', name, len(tensors) if tensors else 0)
    array, device = _tensors('grouped_allreduce', tensors, names, outputs)
    o = _options(op, prescale_factor, postscale_factor, process_set, device=device)
    return _submit(lib.hvd_grouped_allreduce_async, (array, len(tensors), o),
                  (tensors, outputs, array, o), lambda c: list(outputs))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one group (negotiated and completed
    together); synchronize() returns the list of results."""
    op = _op_from(op, average, 'grouped_allreduce')
    _check_list(tensors, 'grouped_allreduce')
    outputs = [_new_output(t, 'grouped_allreduce') for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """grouped_allreduce_async in place."""
    op = _op_from(op, average, 'grouped_allreduce')
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor,
                                    postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set,
                *tensors):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                         postscale_factor, process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], average=ctx.average,
                                  op=ctx.op,
                                  prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one group; returns the list of results
    (differentiable)."""
    _check_list(tensors, 'grouped_allreduce')
    compressed = [compression.compress(t) for t in tensors]
    reduced = _run(HorovodGroupedAllreduce, average, name, op, prescale_factor, postscale_factor,
                                            process_set, *[t for t, _ in compressed])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors in place, as one group; returns them."""
    handle = grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                      postscale_factor, process_set)
    return synchronize(handle)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse tensor by gathering every rank's indices and values
    (duplicates are summed when the result is coalesced). Returns a function
    that waits and returns the reduced sparse tensor."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError('sparse_allreduce_async takes a sparse tensor')
    if op not in (Average, Sum):
        raise ValueError('sparse_allreduce_async: op must be Average or Sum')
    # Allgather concatenates along the first dimension: indices go as rows.
    indices_handle = allgather_async(tensor._indices().t().contiguous(),
                                     name='%s.indices' % name, process_set=process_set)
    values_handle = allgather_async(tensor._values().contiguous(), name='%s.values' % name,
                                    process_set=process_set)

    def wait():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        if indices.dim() == 0 or values.dim() == 0:
            return torch.sparse_coo_tensor(size=tensor.size(), dtype=tensor.dtype)
        return torch.sparse_coo_tensor(indices.t(), values, tensor.size())

    return wait


# ==== allgather ==================================================================================

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along the first dimension
    (ranks may differ in it only); synchronize() returns the result."""
    dtype, device = _dtype_device(tensor, 'allgather')
    t = _lib.tensor_ref(_name('allgather', name), dtype, tensor.shape, tensor.data_ptr(), None)
    o = _options(process_set=process_set, device=device, what='allgather')
    ndims, torch_dtype = tensor.dim(), tensor.dtype
    return _submit(lib.hvd_allgather_async, (t, o), (tensor,),
                  lambda c: _adopt(c, 0, torch_dtype, ndims, device))


class HorovodAllgather(torch.autograd.Function):
    """Allgather with a gradient: this rank's rows of the gradients' average."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 0
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return _gathered_rows_grad(ctx, grad_output.contiguous()), None, None


def _gathered_rows_grad(ctx, grad_output):
    # Horovod's convention: the gradient averaged over the ranks.
    grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
    dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set)
    offset = int(dims[:ctx.process_set.rank()].sum().item())
    return grad_reduced.narrow(0, offset, ctx.dim)


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along the first dimension and
    returns the result (differentiable)."""
    _dtype_device(tensor, 'allgather')
    return _run(HorovodAllgather, tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one group; synchronize() returns the
    list of results."""
    names = _group_names('grouped_allgather', name,
                         len(tensors) if isinstance(tensors, (list, tuple)) else 0)
    array, device = _tensors('grouped_allgather', tensors, names, None)
    o = _options(process_set=process_set, device=device, what='grouped_allgather')
    specs = [(t.dtype, t.dim()) for t in tensors]
    return _submit(lib.hvd_grouped_allgather_async, (array, len(tensors), o),
                  (tensors, array, o),
                  lambda c: [_adopt(c, i, dt, nd, device) for i, (dt, nd) in
                             enumerate(specs)])


class HorovodGroupedAllgather(torch.autograd.Function):

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] if t.dim() > 0 else 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], op=Average,
                                  process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dims], dtype=torch.int64),
                         process_set=ctx.process_set)
        offsets = dims[:ctx.process_set.rank()].sum(dim=0)
        return (None, None) + tuple(g.narrow(0, int(offsets[i].item()), ctx.dims[i])
                                    for i, g in enumerate(grads))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one group; returns the list of results
    (differentiable)."""
    _check_list(tensors, 'grouped_allgather')
    return list(_run(HorovodGroupedAllgather, name, process_set, *tensors))


# ==== broadcast ==================================================================================

def _set_root(root_rank, process_set, what):
    """The root's rank within the set, from Horovod's global rank."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        try:
            root_rank = int(root_rank)
        except (TypeError, ValueError):
            raise ValueError('%s: root_rank must be an int, not %r' % (what, root_rank)) from None
    if _core.set_id(process_set) == _lib.PROCESS_SET_GLOBAL:
        return root_rank
    ranks = _core.set_ranks(_core.set_id(process_set))
    if root_rank not in ranks:
        raise ValueError('%s: root rank %d is not in %s' % (what, root_rank, process_set))
    return ranks.index(root_rank)


def _broadcast_async(tensor, output, root_rank, name, process_set):
    dtype, device = _dtype_device(tensor, 'broadcast')
    root = _set_root(root_rank, process_set, 'broadcast')
    o = _options(process_set=process_set, root=root, device=device, what='broadcast')
    return _submit_one(lib.hvd_broadcast_async, 'broadcast', tensor, output, name, o, dtype)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts sending root_rank's `tensor` (a global rank) to every rank of
    the set; synchronize() returns the received copy."""
    output = _new_output(tensor, 'broadcast')
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast_async in place."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast with a gradient: the gradients' average, on the root only."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average,
                                 process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced *= 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank of the set (differentiable)."""
    _dtype_device(tensor, 'broadcast')
    return _run(HorovodBroadcast, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ==== alltoall ===================================================================================

def _splits(splits, set_size, what):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1:
            raise ValueError('alltoall expects a 1D splits tensor')
        if splits.dtype != torch.int32:
            raise ValueError('alltoall expects splits to contain 32-bit integer elements.')
        values = splits.tolist()
    else:
        try:
            values = [int(s) for s in splits]
        except (TypeError, ValueError):
            raise ValueError('%s: splits must be a 1D int32 tensor or a list of ints' % what) \
                from None
    if len(values) != set_size:
        raise ValueError('Number of entries in splits does not equal number of workers.')
    return _lib.int32_array(values)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[p] rows of `tensor` to each rank p of the set
    (None: equal parts); synchronize() returns (output, received_splits)."""
    dtype, device = _dtype_device(tensor, 'alltoall')
    set_size = lib.hvd_process_set_size(_core.set_id(process_set))
    if set_size < 0 and not lib.hvd_is_initialized():
        raise _not_initialized()
    c_splits = _splits(splits, set_size, 'alltoall')
    t = _lib.tensor_ref(_name('alltoall', name), dtype, tensor.shape, tensor.data_ptr(), None)
    o = _options(process_set=process_set, device=device, what='alltoall')
    ndims, torch_dtype = tensor.dim(), tensor.dtype

    def result(c):
        output = _adopt(c, 0, torch_dtype, ndims, device)
        received = torch.tensor(_core.received_splits(c), dtype=torch.int32)
        return output, received

    return _submit(lib.hvd_alltoall_async, (t, c_splits, o), (tensor, splits, c_splits), result)


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall with a gradient: the gradient sent back the way it came."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[p] rows of `tensor` to each rank p of the set and returns
    what this rank received, in rank order; with splits given, also the rows
    received from each rank (an int32 tensor). Differentiable."""
    _dtype_device(tensor, 'alltoall')
    output, received = _run(HorovodAlltoall, tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ==== reducescatter ==============================================================================

def _scatter_output(tensor, process_set, what):
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise ValueError('%s needs a tensor of at least one dimension' % what)
    rows = lib.hvd_reducescatter_rows(tensor.shape[0], _core.set_id(process_set))
    if rows < 0:
        if not lib.hvd_is_initialized():
            raise _not_initialized()
        raise ValueError('%s: this rank is not in %s' % (what, process_set))
    return tensor.new_empty((rows,) + tuple(tensor.shape[1:]))


def _scatter_op(op, what):
    """Adasum is refused as Horovod refuses it: HorovodInternalError (a
    RuntimeError), not ValueError."""
    if op == Adasum:
        raise HorovodInternalError('%s: op=Adasum is for allreduce only (use Sum, Average, Min, '
                                   'Max or Product)' % what)
    return op


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing `tensor` over the set and leaving this rank its share
    of the first dimension (the first dim0 % size ranks get one row more);
    synchronize() returns the share."""
    dtype, device = _dtype_device(tensor, 'reducescatter')
    output = _scatter_output(tensor, process_set, 'reducescatter')
    op = _scatter_op(op, 'reducescatter')
    o = _options(op, prescale_factor, postscale_factor, process_set, device=device,
                 what='reducescatter')
    return _submit_one(lib.hvd_reducescatter_async, 'reducescatter', tensor, output, name, o,
                       dtype)


def _scattered_grads(op, process_set, grads):
    """Every rank's share of the gradients gathered back, in Horovod's
    convention: times the set's size for Sum, as is for Average."""
    gathered = grouped_allgather([g.contiguous() for g in grads], process_set=process_set)
    if op == Sum:
        gathered = [g * process_set.size() for g in gathered]
    return gathered


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter with a gradient: every rank's share gathered back."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad, = _scattered_grads(ctx.op, ctx.process_set, [grad_output])
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and returns this rank's share of the
    first dimension (differentiable)."""
    _dtype_device(tensor, 'reducescatter')
    compressed, ctx = compression.compress(tensor)
    share = _run(HorovodReducescatter, compressed, name, op, process_set, prescale_factor,
                                       postscale_factor)
    return compression.decompress(share, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatters a list of tensors as one group; synchronize() returns
    the list of shares."""
    if not isinstance(tensors, (list, tuple)):
        raise ValueError('grouped_reducescatter takes a list of tensors')
    names = _group_names('grouped_reducescatter', name, len(tensors))
    outputs = [_scatter_output(t, process_set, 'grouped_reducescatter') for t in tensors]
    array, device = _tensors('grouped_reducescatter', tensors, names, outputs)
    op = _scatter_op(op, 'grouped_reducescatter')
    o = _options(op, prescale_factor, postscale_factor, process_set, device=device,
                 what='grouped_reducescatter')
    return _submit(lib.hvd_grouped_reducescatter_async, (array, len(tensors), o),
                  (tensors, outputs, array, o), lambda c: list(outputs))


class HorovodGroupedReducescatter(torch.autograd.Function):

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = _scattered_grads(ctx.op, ctx.process_set, grad_output)
        return (None, None, None, None, None) + tuple(grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors as one group; returns the list of
    shares (differentiable)."""
    _check_list(tensors, 'grouped_reducescatter')
    compressed = [compression.compress(t) for t in tensors]
    shares = _run(HorovodGroupedReducescatter, name, op, process_set, prescale_factor,
                                               postscale_factor, *[t for t, _ in compressed])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(shares, compressed)]


# ==== timeline ===================================================================================

def _check_initialized():
    """ValueError before hvd.init(), as Horovod's timeline calls raise."""
    if not lib.hvd_is_initialized():
        raise ValueError(_core.NOT_INITIALIZED)


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome trace on rank 0."""
    _check_initialized()
    _core.start_timeline(file_path, mark_cycles)


def stop_timeline():
    """Stops the trace start_timeline began."""
    _check_initialized()
    _core.stop_timeline()


# ==== join and barrier ===========================================================================

def join(device=-1):
    """Tells the other ranks this one has run out of data and blocks until
    every rank has; meanwhile their allreduces go on without it. Returns the
    rank that joined last. `device` is Horovod's and ignored here."""
    return _initialized_call(_core.join)


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has called barrier."""
    _initialized_call(_barrier, process_set)
