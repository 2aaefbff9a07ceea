"""horovod.torch.elastic, provided by hvd: hvd.torch.elastic's API (the run
decorator, TorchState, ElasticSampler, State, ObjectState), the very same
objects; horovod.torch.elastic.state and .sampler are hvd.torch.elastic's
modules themselves."""

import importlib
import sys

from hvd.torch.elastic import *  # noqa: F401,F403 (Horovod's names)
from hvd.torch.elastic import __all__  # noqa: F401 (star imports get the same names)

for _short in ('state', 'sampler'):
    sys.modules['%s.%s' % (__name__, _short)] = importlib.import_module(
        'hvd.torch.elastic.' + _short)
