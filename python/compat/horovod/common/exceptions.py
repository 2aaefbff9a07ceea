"""horovod.common.exceptions: hvd's exception classes, under the module
name Horovod's users import them from (the same classes, so that an except
clause written either way catches what hvd raises)."""

from hvd.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ['HorovodInternalError', 'HostsUpdatedInterrupt']
