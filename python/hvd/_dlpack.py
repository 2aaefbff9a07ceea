"""Memory hvd allocated (an allgather's or alltoall's output, in host or GPU
memory) handed to a framework without a copy, as a DLPack capsule. hvd.torch
views a GPU output through one and copies it into a tensor torch allocates
(a tensor over foreign memory cannot grow: see mpi_ops._adopt).

libhvd builds the DLManagedTensor (hvd_output_dlpack): one dimension of
bytes (uint8) over the output, which the framework views as the dtype and
shape it wants. Its deleter, which the framework calls when its tensor's
memory is freed, is libhvd's C: it gives the memory back without running
Python, so it is safe on any thread, while an exception is pending, and
at interpreter exit.
"""

import ctypes

from hvd import _lib
from hvd._lib import lib

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_set_pointer = ctypes.pythonapi.PyCapsule_SetPointer
_set_pointer.restype = ctypes.c_int
_set_pointer.argtypes = [ctypes.py_object, ctypes.c_void_p]
# A capsule keeps a pointer to its name, not a copy: the name lives here.
_NAME = ctypes.create_string_buffer(b'dltensor')


def bytes_capsule(address, nbytes, device):
    """A DLPack capsule over `nbytes` bytes at `address`, an output taken
    from a handle on `device` (hvd's index: -1 for host memory, else the
    GPU). The capsule takes the output over: it is freed once the
    consumer's tensor is, or at once if this raises. A capsule never
    consumed leaks it, so consume it at once."""
    try:
        # The capsule first (it points at its own name until it is filled):
        # once hvd_output_dlpack succeeds, nothing here can fail.
        capsule = _new_capsule(ctypes.addressof(_NAME), ctypes.addressof(_NAME), None)
        status, managed = _lib.output_dlpack(address, nbytes, device)
    except BaseException:
        _free(address, device)
        raise
    if status != _lib.OK:
        _free(address, device)
        raise MemoryError('hvd: %s' % lib.hvd_last_error_message().decode())
    _set_pointer(capsule, managed)
    return capsule


def _free(address, device):
    (lib.hvd_output_free if device == _lib.DEVICE_CPU else lib.hvd_output_free_gpu)(address)


class _Live(object):
    """len(_live): the capsules' structures whose deleter has not run yet,
    in this process (hvd_output_dlpack_live)."""

    def __len__(self):
        return lib.hvd_output_dlpack_live()


_live = _Live()
