"""libhvd.so through ctypes: the one file that knows hvd.h's binary interface.

It finds the library, checks that its ABI is the one declared here
(hvd_abi_version and the structures' sizes), and declares every function
the package calls, so that ctypes converts and checks the arguments.
ctypes.CDLL releases the GIL around each call: a thread that waits in
hvd_handle_wait or hvd_join does not stop the others.
"""

import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t,
                    c_void_p)

ABI_VERSION = 1
LIBRARY_NAME = 'libhvd.so.0'

# hvd_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_NO_MEMORY = 2
ERR_TIMEOUT = 3
ERR_NOT_FOUND = 4
ERR_IO = 5
ERR_NETWORK = 6
ERR_PROTOCOL = 7
ERR_UNAUTHORIZED = 8
ERR_TOO_LARGE = 9
ERR_CONFLICT = 10
ERR_UNSUPPORTED = 11
ERR_PRECONDITION = 12
ERR_ABORTED = 13
ERR_INTERNAL = 14
ERR_MISMATCH = 15
ERR_HOSTS_UPDATED = 16
ERR_REMOVED = 17
ERR_EXISTS = 18

# hvd_dtype
UINT8, INT8, UINT16, INT16, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL = range(11)

# hvd_reduce_op
SUM, AVERAGE, MIN, MAX, PRODUCT, ADASUM = range(6)

PROCESS_SET_GLOBAL = 0
DEVICE_CPU = -1
MAX_DIMS = 32
HOSTS_ADDED = 1
HOSTS_REMOVED = 2


class Tensor(Structure):
    """hvd_tensor"""
    _fields_ = [('name', c_char_p), ('dtype', c_int), ('ndims', c_int),
                ('shape', POINTER(c_int64)), ('input', c_void_p), ('output', c_void_p)]


class Options(Structure):
    """hvd_options; the defaults of HVD_OPTIONS_INIT."""
    _fields_ = [('op', c_int), ('prescale', c_double), ('postscale', c_double),
                ('process_set', c_int), ('root', c_int), ('device', c_int),
                ('callback', c_void_p), ('callback_arg', c_void_p), ('ready_event', c_void_p)]

    def __init__(self, op=SUM, prescale=1.0, postscale=1.0, process_set=PROCESS_SET_GLOBAL,
                 root=0, device=DEVICE_CPU):
        super().__init__(op, prescale, postscale, process_set, root, device, None, None, None)


class ElasticHooks(Structure):
    """hvd_elastic_hooks (declared for the size check; this package drives
    elastic jobs from Python and passes no hooks)."""
    _fields_ = [('commit', c_void_p), ('restore', c_void_p), ('sync', c_void_p)]


_handle = c_void_p
_status = c_int

# name: (restype, argtypes)
_FUNCTIONS = {
    'hvd_abi_version': (c_int, []),
    'hvd_abi_sizeof': (c_size_t, [c_char_p]),
    'hvd_version': (c_char_p, []),
    'hvd_strerror': (c_char_p, [_status]),
    'hvd_last_error_message': (c_char_p, []),
    'hvd_init': (_status, []),
    'hvd_shutdown': (_status, []),
    'hvd_is_initialized': (c_int, []),
    'hvd_rank': (c_int, []),
    'hvd_size': (c_int, []),
    'hvd_local_rank': (c_int, []),
    'hvd_local_size': (c_int, []),
    'hvd_cross_rank': (c_int, []),
    'hvd_cross_size': (c_int, []),
    'hvd_is_homogeneous': (c_int, []),
    'hvd_allreduce_async': (_status, [POINTER(Tensor), POINTER(Options), POINTER(_handle)]),
    'hvd_grouped_allreduce_async':
        (_status, [POINTER(Tensor), c_size_t, POINTER(Options), POINTER(_handle)]),
    'hvd_allgather_async': (_status, [POINTER(Tensor), POINTER(Options), POINTER(_handle)]),
    'hvd_grouped_allgather_async':
        (_status, [POINTER(Tensor), c_size_t, POINTER(Options), POINTER(_handle)]),
    'hvd_broadcast_async': (_status, [POINTER(Tensor), POINTER(Options), POINTER(_handle)]),
    'hvd_alltoall_async':
        (_status, [POINTER(Tensor), POINTER(c_int32), POINTER(Options), POINTER(_handle)]),
    'hvd_reducescatter_async': (_status, [POINTER(Tensor), POINTER(Options), POINTER(_handle)]),
    'hvd_grouped_reducescatter_async':
        (_status, [POINTER(Tensor), c_size_t, POINTER(Options), POINTER(_handle)]),
    'hvd_reducescatter_rows': (c_int64, [c_int64, c_int]),
    'hvd_join': (_status, [POINTER(c_int)]),
    'hvd_barrier': (_status, [c_int]),
    'hvd_handle_poll': (c_int, [_handle]),
    'hvd_handle_wait': (_status, [_handle]),
    'hvd_handle_take_output':
        (_status, [_handle, c_size_t, POINTER(c_void_p), POINTER(c_size_t), POINTER(c_int64)]),
    'hvd_handle_received_splits':
        (_status, [_handle, POINTER(POINTER(c_int32)), POINTER(c_size_t)]),
    'hvd_handle_release': (None, [_handle]),
    'hvd_output_free': (None, [c_void_p]),
    'hvd_output_free_gpu': (None, [c_void_p]),
    'hvd_cuda_built': (c_int, []),
    'hvd_nccl_built': (c_int, []),
    'hvd_process_set_add': (_status, [POINTER(c_int), c_size_t, POINTER(c_int)]),
    'hvd_process_set_remove': (_status, [c_int]),
    'hvd_process_set_rank': (c_int, [c_int]),
    'hvd_process_set_size': (c_int, [c_int]),
    'hvd_process_set_ranks': (_status, [c_int, POINTER(c_int), c_size_t, POINTER(c_size_t)]),
    'hvd_process_set_ids': (_status, [POINTER(c_int), c_size_t, POINTER(c_size_t)]),
    'hvd_timeline_start': (_status, [c_char_p, c_int]),
    'hvd_timeline_stop': (_status, []),
    'hvd_elastic_reset': (_status, []),
    'hvd_elastic_resets': (c_int, []),
    'hvd_elastic_hosts_updated': (c_int, []),
    'hvd_elastic_done': (_status, []),
}


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


def _check_abi(lib):
    if not hasattr(lib, 'hvd_abi_version'):
        raise ImportError('hvd: %s is older than this package (it has no hvd_abi_version); '
                          'rebuild hvd or point HVD_LIBRARY at a matching build' % lib._name)
    lib.hvd_abi_version.restype = c_int
    lib.hvd_abi_sizeof.restype = c_size_t
    lib.hvd_abi_sizeof.argtypes = [c_char_p]
    if lib.hvd_abi_version() != ABI_VERSION:
        raise ImportError('hvd: %s has ABI version %d, this package knows version %d; use a '
                          'matching build' % (lib._name, lib.hvd_abi_version(), ABI_VERSION))
    for name, struct in (('hvd_tensor', Tensor), ('hvd_options', Options),
                         ('hvd_elastic_hooks', ElasticHooks)):
        size = lib.hvd_abi_sizeof(name.encode())
        if size != ctypes.sizeof(struct):
            raise ImportError('hvd: %s has a %s of %d bytes, this package declares %d; use a '
                              'matching build' % (lib._name, name, size, ctypes.sizeof(struct)))


def _declare(lib):
    for name, (restype, argtypes) in _FUNCTIONS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError('hvd: %s lacks %s; rebuild hvd or use a matching build'
                              % (lib._name, name)) from None
        fn.restype = restype
        fn.argtypes = argtypes


lib = _load()
_check_abi(lib)
_declare(lib)
