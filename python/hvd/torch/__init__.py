"""horovod.torch's API over hvd: `import hvd.torch as hvd`.

Collectives, process sets and the queries are in mpi_ops; the optimizer,
the broadcast helpers, compression, SyncBatchNorm and elastic training in
their own modules, re-exported here under Horovod's names.
"""

from hvd.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from hvd.torch.compression import Compression
from hvd.torch.mpi_ops import *  # noqa: F401,F403 (Horovod's names)
from hvd.torch.mpi_ops import __all__ as _ops_all
from hvd.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                 broadcast_parameters)
from hvd.torch.optimizer import DistributedOptimizer
from hvd.torch.sync_batch_norm import SyncBatchNorm
from hvd.torch import elastic  # noqa: E402 (hvd.torch.elastic, as horovod.torch.elastic)

__all__ = list(_ops_all) + [
    'Compression', 'HorovodInternalError', 'HostsUpdatedInterrupt', 'allgather_object',
    'broadcast_object', 'broadcast_optimizer_state', 'broadcast_parameters',
    'DistributedOptimizer', 'SyncBatchNorm', 'elastic',
]
