"""horovod.common.elastic, provided by hvd: the framework-neutral elastic
state and loop (State, ObjectState, run_fn), hvd.elastic's own objects."""

from hvd.elastic import *  # noqa: F401,F403 (Horovod's names)
from hvd.elastic import ObjectState, State, run_fn  # noqa: F401

__all__ = ['State', 'ObjectState', 'run_fn']
