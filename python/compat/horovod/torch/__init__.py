"""horovod.torch, provided by hvd: everything hvd.torch exports, the very
same objects, under Horovod's module names. horovod.torch.mpi_ops,
.compression, .functions, .optimizer and .sync_batch_norm are hvd.torch's
modules themselves; horovod.torch.elastic re-exports hvd.torch.elastic.
"""

import importlib
import sys

from hvd.torch import *  # noqa: F401,F403 (Horovod's names)
from hvd.torch import __all__  # noqa: F401 (star imports get the same names)

_SAME_MODULES = ('mpi_ops', 'compression', 'functions', 'optimizer', 'sync_batch_norm')


def _alias_modules():
    """Makes `from horovod.torch.mpi_ops import x` give hvd.torch.mpi_ops's x."""
    this = sys.modules[__name__]
    for short in _SAME_MODULES:
        module = importlib.import_module('hvd.torch.' + short)
        sys.modules['%s.%s' % (__name__, short)] = module
        setattr(this, short, module)


_alias_modules()

# The star import bound `elastic` to hvd.torch.elastic; import_module (not
# `from . import`, which would find that attribute and stop) loads this
# tree's horovod.torch.elastic and rebinds the name to it.
elastic = importlib.import_module(__name__ + '.elastic')
