"""hvd: Horovod-style distributed training over hvd's C library (libhvd.so),
with no MPI. `import hvd.torch as hvd` gives horovod.torch's API."""

from hvd._core import version as _version
from hvd.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__version__ = _version()

__all__ = ['HorovodInternalError', 'HostsUpdatedInterrupt', '__version__']
