"""libhvd.so through ctypes: the one module that calls hvd with ctypes
arguments.

It finds the library, checks that it is the one _abi.py declares (its ABI
version, the structures' sizes, the dtype and op names), and declares
every function of _abi.PROTOTYPES on it, so that ctypes converts and
checks the arguments. _abi.py's declarations are re-exported here
(_lib.OK, _lib.Tensor, ...). Below the loading, the calls whose arguments
are ctypes objects (out-parameters, arrays, structures) are built here and
return plain Python values with the status. ctypes.CDLL releases the GIL
around each call: a thread that waits in hvd_handle_wait or hvd_join does
not stop the others.
"""

import ctypes
import os
import threading
from ctypes import byref, c_int, c_int32, c_int64, c_size_t, c_void_p

from hvd import _abi
from hvd._abi import *  # noqa: F401,F403 (the declarations, as _lib.NAME)

LIBRARY_NAME = 'libhvd.so.0'


def _candidates():
    """Where the library may be, in order, with why each is tried."""
    env = os.environ.get('HVD_LIBRARY')
    if env:
        return [(env, 'HVD_LIBRARY')]
    # normpath, not realpath: in the build tree the package is a symlink
    # under the library's directory, and that link's place is what counts.
    here = os.path.normpath(os.path.dirname(os.path.abspath(__file__)))
    return [
        (os.path.join(here, '..', '..', '..', LIBRARY_NAME), 'next to the installed package'),
        (os.path.join(here, '..', '..', 'build', 'lib', LIBRARY_NAME), 'the source tree\'s build'),
        (LIBRARY_NAME, 'the dynamic linker\'s search path'),
    ]


def _load():
    tried = []
    for path, why in _candidates():
        path = os.path.normpath(path) if os.sep in path else path
        if os.sep in path and not os.path.exists(path):
            tried.append('%s (%s): no such file' % (path, why))
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append('%s (%s): %s' % (path, why, e))
    raise ImportError('hvd: cannot load %s; tried:\n  %s\nBuild hvd (./scripts/build.sh) or set '
                      'HVD_LIBRARY to the library\'s path.' % (LIBRARY_NAME, '\n  '.join(tried)))


def check_abi(lib):
    """The library's ABI version and structure sizes are _abi.py's."""
    if not hasattr(lib, 'hvd_abi_version'):
        raise ImportError('hvd: %s is older than this package (it has no hvd_abi_version); '
                          'rebuild hvd or point HVD_LIBRARY at a matching build' % lib._name)
    lib.hvd_abi_version.restype = c_int
    lib.hvd_abi_sizeof.restype = c_size_t
    lib.hvd_abi_sizeof.argtypes = [ctypes.c_char_p]
    if lib.hvd_abi_version() != _abi.ABI_VERSION:
        raise ImportError('hvd: %s has ABI version %d, this package knows version %d; use a '
                          'matching build' % (lib._name, lib.hvd_abi_version(), _abi.ABI_VERSION))
    for struct in _abi.STRUCTURES:
        size = lib.hvd_abi_sizeof(struct.c_name.encode())
        if size != ctypes.sizeof(struct):
            raise ImportError('hvd: %s has a %s of %d bytes, this package declares %d; use a '
                              'matching build' % (lib._name, struct.c_name, size,
                                                  ctypes.sizeof(struct)))


def _declare(lib):
    for name, (restype, argtypes) in _abi.functions().items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError('hvd: %s lacks %s; rebuild hvd or use a matching build'
                              % (lib._name, name)) from None
        fn.restype = restype
        fn.argtypes = argtypes


def check_names(lib):
    """Each dtype and reduce op value names in the library what _abi.py says."""
    for fn, names in ((lib.hvd_dtype_name, _abi.DTYPE_NAMES),
                      (lib.hvd_reduce_op_name, _abi.OP_NAMES)):
        for value, name in enumerate(names):
            got = fn(value).decode()
            if got != name:
                raise ImportError('hvd: in %s, %s(%d) is %r, this package declares %r; use a '
                                  'matching build' % (lib._name, fn.__name__, value, got, name))


lib = _load()
check_abi(lib)
_declare(lib)
check_names(lib)


# ==== calls with ctypes arguments =================================================================

def check_name(name, what='name'):
    """A caller's op name as the C string hvd copies; ValueError for a name
    C would cut short (a NUL inside), as hvd's C API refuses it."""
    if '\0' in name:
        raise ValueError('%s must not contain a NUL character: %r' % (what, name))
    return name.encode()


def tensor_struct(name, dtype, shape, inptr, outptr):
    """An hvd_tensor; the shape array travels in the structure's _objects."""
    t = _abi.Tensor()
    t.name = name
    t.dtype = dtype
    t.ndims = len(shape)
    if shape:
        t.shape = (c_int64 * len(shape))(*shape)
    t.input = inptr
    t.output = outptr
    return t


def tensor_array(tensors):
    """An array of hvd_tensor, one per (name, dtype, shape, input, output)."""
    array = (_abi.Tensor * len(tensors))()
    for i, fields in enumerate(tensors):
        array[i] = tensor_struct(*fields)
    return array


class _PerThread(threading.local):
    """Each thread's reused ctypes objects: hvd copies an hvd_tensor and
    hvd_options at submission, so one structure per (name, dtype, shape)
    serves every later call on the thread, with only its two addresses
    rewritten; and one handle cell takes every submission's handle."""

    def __init__(self):
        self.tensors = {}
        self.handle = c_void_p()
        self.handle_ref = byref(self.handle)


_per_thread = _PerThread()
_TENSOR_CACHE_MAX = 4096  # structures per thread; past it the cache starts again


def tensor_ref(name, dtype, shape, inptr, outptr):
    """A pointer to this thread's hvd_tensor for (name, dtype, shape) with
    these addresses, valid until the thread's next tensor_ref of the same
    key: pass it to one submission at once."""
    key = (name, dtype, shape)
    cache = _per_thread.tensors
    entry = cache.get(key)
    if entry is None:
        if len(cache) >= _TENSOR_CACHE_MAX:
            cache.clear()
        t = tensor_struct(name, dtype, shape, inptr, outptr)
        entry = cache[key] = (t, byref(t))
    else:
        t = entry[0]
        t.input = inptr
        t.output = outptr
    return entry[1]


def options_ref(options):
    """A pointer to an Options structure, for a submission."""
    return byref(options)


def submit(fn, args):
    """fn(*args, &handle) for an hvd_*_async function: (status, handle), the
    handle an int (None on failure)."""
    status = fn(*args, _per_thread.handle_ref)
    return status, _per_thread.handle.value


# What _per_thread.handle holds while hvd_allreduce_wait_for runs: no
# handle has this address, so finding it there after the call means that
# the call refused the submission and left *pending alone.
_NOT_SUBMITTED = 1


def allreduce_wait_for(tensor, options, timeout_ms):
    """hvd_allreduce_wait_for with pointers from tensor_ref and options_ref:
    (status, pending). pending is None when the operation completed (status
    is its outcome), the handle (an int) of an operation still running
    (status ERR_TIMEOUT), or False when the submission was refused."""
    cell = _per_thread.handle
    cell.value = _NOT_SUBMITTED
    status = lib.hvd_allreduce_wait_for(tensor, options, timeout_ms, _per_thread.handle_ref)
    if status == _abi.OK:
        return status, None
    pending = cell.value
    return status, (False if pending == _NOT_SUBMITTED else pending)


def int32_array(values):
    """A C int32_t array of values (one element at least)."""
    return (c_int32 * max(len(values), 1))(*values)


class Int64Cell(object):
    """One int64 in memory hvd may read and write: its address and value."""

    def __init__(self, value):
        self._cell = c_int64(value)
        self.address = ctypes.addressof(self._cell)

    @property
    def value(self):
        return self._cell.value


def take_output(handle, index):
    """hvd_handle_take_output: (status, address, bytes, shape's MAX_DIMS entries)."""
    data = c_void_p()
    nbytes = c_size_t()
    shape = (c_int64 * _abi.MAX_DIMS)()
    status = lib.hvd_handle_take_output(handle, index, byref(data), byref(nbytes), shape)
    return status, data.value, nbytes.value, shape


def output_at(handle, index):
    """hvd_handle_output_at: (status, address, bytes, shape's MAX_DIMS
    entries); the memory stays the handle's."""
    data = c_void_p()
    nbytes = c_size_t()
    shape = (c_int64 * _abi.MAX_DIMS)()
    status = lib.hvd_handle_output_at(handle, index, byref(data), byref(nbytes), shape)
    return status, data.value, nbytes.value, shape


def copy_bytes(dst, src, nbytes):
    """memmove of nbytes from address src to address dst; the GIL is
    released meanwhile, as for every foreign call."""
    ctypes.memmove(dst, src, nbytes)


def output_dlpack(address, nbytes, device):
    """hvd_output_dlpack: (status, the DLManagedTensor's address)."""
    managed = c_void_p()
    status = lib.hvd_output_dlpack(address, nbytes, device, byref(managed))
    return status, managed.value


def received_splits(handle):
    """hvd_handle_received_splits: (status, [rows received from each rank])."""
    splits = ctypes.POINTER(c_int32)()
    n = c_size_t()
    status = lib.hvd_handle_received_splits(handle, byref(splits), byref(n))
    return status, [splits[i] for i in range(n.value)] if status == _abi.OK else []


def _int_list(fn, *args):
    """(status, list) of a call that fills up to cap ints and says how many
    there are: asked for the count first, then for that many."""
    n = c_size_t()
    status = fn(*args, None, 0, byref(n))
    if status != _abi.OK:
        return status, []
    values = (c_int * max(n.value, 1))()
    status = fn(*args, values, n.value, byref(n))
    return status, list(values[:n.value]) if status == _abi.OK else []


def process_set_ranks(set_id):
    return _int_list(lib.hvd_process_set_ranks, set_id)


def process_set_ids():
    return _int_list(lib.hvd_process_set_ids)


def process_set_add(ranks):
    """hvd_process_set_add: (status, the new set's id)."""
    array = (c_int * max(len(ranks), 1))(*ranks)
    new_id = c_int(-1)
    status = lib.hvd_process_set_add(array, len(ranks), byref(new_id))
    return status, new_id.value


def join():
    """hvd_join: (status, the rank that joined last)."""
    last = c_int(-1)
    status = lib.hvd_join(byref(last))
    return status, last.value
