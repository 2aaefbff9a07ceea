"""What the package uses of include/hvd/hvd.h, written in hvd.h's own terms,
and the ctypes types that follow from it. Loads nothing: _lib.py loads the
library and declares these functions on it.

Kept right by two checks. ctest layout.python_abi (tests/layout/python_abi.py)
compiles every item here against hvd.h: each upper-case integer NAME is
hvd.h's HVD_NAME, each structure's fields have hvd.h's names, types,
offsets and sizes, and each function's prototype is hvd.h's. At load,
_lib.py compares the library's dtype and op names (hvd_dtype_name,
hvd_reduce_op_name) with DTYPE_NAMES and OP_NAMES.
"""

from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t,
                    c_void_p)

ABI_VERSION = 1

# enum hvd_status
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

# enum hvd_dtype, in value order, as hvd_dtype_name names them
DTYPE_NAMES = ('uint8', 'int8', 'uint16', 'int16', 'int32', 'int64', 'float16', 'bfloat16',
               'float32', 'float64', 'bool')
UINT8, INT8, UINT16, INT16, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL = \
    range(len(DTYPE_NAMES))
DTYPE_COUNT = len(DTYPE_NAMES)

# enum hvd_reduce_op, in value order, as hvd_reduce_op_name names them
OP_NAMES = ('sum', 'average', 'min', 'max', 'product', 'adasum')
SUM, AVERAGE, MIN, MAX, PRODUCT, ADASUM = range(len(OP_NAMES))

PROCESS_SET_GLOBAL = 0
DEVICE_CPU = -1
MAX_DIMS = 32
HOSTS_ADDED = 1
HOSTS_REMOVED = 2

# ==== C types as ctypes ===========================================================================

# hvd.h's scalar and opaque types. Enums are int-sized (the check asserts it).
_SCALARS = {
    'int': c_int, 'int32_t': c_int32, 'int64_t': c_int64, 'size_t': c_size_t, 'double': c_double,
    'hvd_status': c_int, 'hvd_dtype': c_int, 'hvd_reduce_op': c_int,
    'hvd_handle': c_void_p, 'hvd_callback': c_void_p,
}
_STRUCTS = {}  # hvd.h's name of each Structure below: the class


def ctype(text):
    """The ctypes type of a C type written as in hvd.h ('const hvd_tensor *');
    None for void. A function pointer is a c_void_p (the package passes none)."""
    if '(' in text:
        return c_void_p
    words = text.replace('*', ' * ').split()
    stars = words.count('*')
    base = ' '.join(w for w in words if w not in ('*', 'const'))
    if base == 'void':
        t = None if stars == 0 else c_void_p
        stars = max(stars - 1, 0)
    elif base == 'char' and stars > 0:
        t = c_char_p
        stars -= 1
    elif base in _SCALARS:
        t = _SCALARS[base]
    elif base in _STRUCTS:
        t = _STRUCTS[base]
    else:
        raise ValueError('hvd._abi: no ctypes type for C type %r' % text)
    for _ in range(stars):
        t = POINTER(t)
    return t


def _struct(cls):
    """Gives a Structure declared by c_name and c_fields its _fields_."""
    cls._fields_ = [(name, ctype(c)) for name, c in cls.c_fields]
    _STRUCTS[cls.c_name] = cls
    return cls


@_struct
class Tensor(Structure):
    c_name = 'hvd_tensor'
    c_fields = (('name', 'const char *'), ('dtype', 'hvd_dtype'), ('ndims', 'int'),
                ('shape', 'const int64_t *'), ('input', 'const void *'), ('output', 'void *'))


@_struct
class Options(Structure):
    """hvd_options; the defaults of HVD_OPTIONS_INIT."""
    c_name = 'hvd_options'
    c_fields = (('op', 'hvd_reduce_op'), ('prescale', 'double'), ('postscale', 'double'),
                ('process_set', 'int'), ('root', 'int'), ('device', 'int'),
                ('callback', 'hvd_callback'), ('callback_arg', 'void *'),
                ('ready_event', 'void *'))

    def __init__(self, op=SUM, prescale=1.0, postscale=1.0, process_set=PROCESS_SET_GLOBAL,
                 root=0, device=DEVICE_CPU):
        super().__init__(op, prescale, postscale, process_set, root, device, None, None, None)


@_struct
class ElasticHooks(Structure):
    """Declared for the checks only: this package drives elastic jobs from
    Python and passes no hooks."""
    c_name = 'hvd_elastic_hooks'
    c_fields = (('commit', 'hvd_status (*)(void *)'), ('restore', 'hvd_status (*)(void *)'),
                ('sync', 'hvd_status (*)(void *)'))


STRUCTURES = (Tensor, Options, ElasticHooks)

# ==== functions ===================================================================================

# Every function the package calls, with hvd.h's prototype.
PROTOTYPES = (
    'int hvd_abi_version(void)',
    'size_t hvd_abi_sizeof(const char *type_name)',
    'const char *hvd_version(void)',
    'const char *hvd_strerror(hvd_status status)',
    'const char *hvd_last_error_message(void)',
    'const char *hvd_dtype_name(hvd_dtype dtype)',
    'const char *hvd_reduce_op_name(hvd_reduce_op op)',
    'hvd_status hvd_init(void)',
    'hvd_status hvd_shutdown(void)',
    'int hvd_is_initialized(void)',
    'int hvd_rank(void)',
    'int hvd_size(void)',
    'int hvd_local_rank(void)',
    'int hvd_local_size(void)',
    'int hvd_cross_rank(void)',
    'int hvd_cross_size(void)',
    'int hvd_is_homogeneous(void)',
    'hvd_status hvd_allreduce_async(const hvd_tensor *tensor, const hvd_options *options, '
    'hvd_handle *handle)',
    'hvd_status hvd_grouped_allreduce_async(const hvd_tensor *tensors, size_t n, '
    'const hvd_options *options, hvd_handle *handle)',
    'hvd_status hvd_allgather_async(const hvd_tensor *tensor, const hvd_options *options, '
    'hvd_handle *handle)',
    'hvd_status hvd_grouped_allgather_async(const hvd_tensor *tensors, size_t n, '
    'const hvd_options *options, hvd_handle *handle)',
    'hvd_status hvd_broadcast_async(const hvd_tensor *tensor, const hvd_options *options, '
    'hvd_handle *handle)',
    'hvd_status hvd_alltoall_async(const hvd_tensor *tensor, const int32_t *splits, '
    'const hvd_options *options, hvd_handle *handle)',
    'hvd_status hvd_reducescatter_async(const hvd_tensor *tensor, const hvd_options *options, '
    'hvd_handle *handle)',
    'hvd_status hvd_grouped_reducescatter_async(const hvd_tensor *tensors, size_t n, '
    'const hvd_options *options, hvd_handle *handle)',
    'int64_t hvd_reducescatter_rows(int64_t dim0, int process_set)',
    'hvd_status hvd_allreduce_wait_for(const hvd_tensor *tensor, const hvd_options *options, '
    'int64_t timeout_ms, hvd_handle *pending)',
    'hvd_status hvd_join(int *last_joined_rank)',
    'hvd_status hvd_barrier(int process_set)',
    'int hvd_handle_poll(hvd_handle handle)',
    'hvd_status hvd_handle_wait(hvd_handle handle)',
    'hvd_status hvd_handle_wait_for(hvd_handle handle, int64_t timeout_ms)',
    'hvd_status hvd_handle_output_at(hvd_handle handle, size_t index, void **data, '
    'size_t *bytes, int64_t *shape)',
    'hvd_status hvd_handle_take_output(hvd_handle handle, size_t index, void **data, '
    'size_t *bytes, int64_t *shape)',
    'hvd_status hvd_handle_received_splits(hvd_handle handle, const int32_t **splits, size_t *n)',
    'void hvd_handle_release(hvd_handle handle)',
    'void hvd_output_free(void *data)',
    'void hvd_output_free_gpu(void *data)',
    'hvd_status hvd_output_dlpack(void *data, size_t bytes, int device, void **managed)',
    'size_t hvd_output_dlpack_live(void)',
    'int hvd_cuda_built(void)',
    'int hvd_nccl_built(void)',
    'hvd_status hvd_process_set_add(const int *ranks, size_t n, int *id)',
    'hvd_status hvd_process_set_remove(int id)',
    'int hvd_process_set_rank(int id)',
    'int hvd_process_set_size(int id)',
    'hvd_status hvd_process_set_ranks(int id, int *ranks, size_t cap, size_t *n)',
    'hvd_status hvd_process_set_ids(int *ids, size_t cap, size_t *n)',
    'hvd_status hvd_timeline_start(const char *path, int mark_cycles)',
    'hvd_status hvd_timeline_stop(void)',
    'hvd_status hvd_elastic_reset(void)',
    'int hvd_elastic_resets(void)',
    'int hvd_elastic_hosts_updated(void)',
    'hvd_status hvd_elastic_done(void)',
)


def parse_prototype(text):
    """(name, return type, [parameter types]) of 'RET NAME(TYPE NAME, ...)'."""
    head, _, params = text.partition('(')
    name = head.replace('*', ' ').split()[-1]
    ret = head[:head.rindex(name)].strip()
    params = params[:params.rindex(')')].strip()
    types = []
    if params != 'void':
        for param in params.split(','):
            # The parameter's name is the last word, when a type stands before it.
            typ = param.strip()
            stem = typ.rstrip('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_')
            if stem.strip() and stem.strip() != 'const':
                typ = stem.strip()
            types.append(typ)
    return name, ret, types


def functions():
    """name: (restype, argtypes) of every function in PROTOTYPES."""
    table = {}
    for text in PROTOTYPES:
        name, ret, params = parse_prototype(text)
        table[name] = (ctype(ret), [ctype(p) for p in params])
    return table


def constants():
    """NAME: value of every upper-case integer here (hvd.h's HVD_NAME)."""
    return {name: value for name, value in globals().items()
            if name.isupper() and isinstance(value, int)}


# What _lib re-exports (_lib.OK, _lib.Tensor, ...).
__all__ = sorted(constants()) + ['Tensor', 'Options', 'ElasticHooks']
