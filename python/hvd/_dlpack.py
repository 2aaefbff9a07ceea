"""Memory hvd allocated (an allgather's or alltoall's output, in host or GPU
memory) handed to a framework without a copy, as a DLPack capsule.

The capsule holds a DLManagedTensor of bytes (uint8, one dimension) over
the output; the framework views it as the dtype and shape it wants. Its
deleter, which the framework calls when its tensor's memory is freed, gives
the memory back: hvd_output_free, or hvd_output_free_gpu for device
memory. The structures follow dlpack.h (DLPack 0.x, the legacy capsule
every framework still reads).
"""

import ctypes
import threading
from ctypes import POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

from hvd._lib import lib

KDL_CPU = 1
KDL_CUDA = 2
KDL_UINT = 1


class _Device(Structure):
    _fields_ = [('device_type', c_int32), ('device_id', c_int32)]


class _DataType(Structure):
    _fields_ = [('code', c_uint8), ('bits', c_uint8), ('lanes', c_uint16)]


class _Tensor(Structure):
    _fields_ = [('data', c_void_p), ('device', _Device), ('ndim', c_int32), ('dtype', _DataType),
                ('shape', POINTER(c_int64)), ('strides', POINTER(c_int64)),
                ('byte_offset', c_uint64)]


class _Managed(Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, POINTER(_Managed))
_Managed._fields_ = [('dl_tensor', _Tensor), ('manager_ctx', c_void_p), ('deleter', _DELETER)]

# The structures stay alive until their deleter runs, keyed by address.
_live = {}
_live_lock = threading.Lock()


def _delete(managed):
    address = ctypes.addressof(managed.contents)
    with _live_lock:
        entry = _live.pop(address, None)
    if entry is not None:
        managed, _shape = entry
        if managed.dl_tensor.device.device_type == KDL_CPU:
            lib.hvd_output_free(managed.dl_tensor.data)
        else:
            lib.hvd_output_free_gpu(managed.dl_tensor.data)


_deleter = _DELETER(_delete)

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [c_void_p, c_void_p, c_void_p]
# A capsule keeps a pointer to its name, not a copy: the name lives here.
_NAME = ctypes.create_string_buffer(b'dltensor')


def bytes_capsule(address, nbytes, device):
    """A DLPack capsule over `nbytes` bytes at `address`, which hvd
    allocated on `device` (hvd's index: -1 for host memory, else the GPU).
    The memory is freed once the consumer's tensor is; a capsule never
    consumed leaks it, so consume it at once."""
    managed = _Managed()
    shape = (c_int64 * 1)(nbytes)
    managed.dl_tensor.data = address
    managed.dl_tensor.device = _Device(KDL_CPU, 0) if device < 0 else _Device(KDL_CUDA, device)
    managed.dl_tensor.ndim = 1
    managed.dl_tensor.dtype = _DataType(KDL_UINT, 8, 1)
    managed.dl_tensor.shape = shape
    managed.dl_tensor.strides = None
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _deleter
    with _live_lock:
        _live[ctypes.addressof(managed)] = (managed, shape)
    return _new_capsule(ctypes.addressof(managed), ctypes.addressof(_NAME), None)
