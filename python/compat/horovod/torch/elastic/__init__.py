"""horovod.torch.elastic, provided by hvd: hvd.torch.elastic's API (the run
decorator, TorchState, ElasticSampler) and the State and ObjectState
classes it builds on, the very same objects."""

from hvd.elastic import ObjectState, State
from hvd.torch.elastic import *  # noqa: F401,F403 (Horovod's names)
from hvd.torch.elastic import __all__ as _elastic_all
from hvd.torch.elastic import ElasticSampler, TorchState, run

__all__ = list(_elastic_all) + [n for n in ('State', 'ObjectState') if n not in _elastic_all]
