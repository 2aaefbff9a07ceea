"""Elastic training with PyTorch (horovod.torch.elastic's API): the run
decorator, TorchState and ElasticSampler. Start the job with
`hvdrun --min-np N ...` or `--host-discovery-script`.

    state = hvd.elastic.TorchState(model, optimizer, epoch=0)

    @hvd.elastic.run
    def train(state):
        ...            # train from state's values; state.commit() every few steps

    train(state)
"""

from hvd import elastic as _elastic
from hvd.elastic import ObjectState, State
from hvd.torch.elastic.sampler import ElasticSampler
from hvd.torch.elastic.state import TorchState

__all__ = ['TorchState', 'ElasticSampler', 'State', 'ObjectState', 'run']


def run(func):
    """Decorates func(state, ...) so that it survives workers that fail and
    hosts that come and go: the state is synced from rank 0 and func runs;
    when a collective fails (HorovodInternalError) the last commit is
    restored, and this worker joins the driver's next round with a new rank
    and size, runs the state's reset callbacks, syncs and calls func again;
    when hosts are added or removed (HostsUpdatedInterrupt, raised by
    state.commit()) the same happens without the restore. A worker the
    driver removes exits with status 0.

    func must make no collective before it is called (no broadcast of the
    parameters after hvd.init(): the state's sync does that), as a worker
    started in a later round begins with the sync the others are in."""
    return _elastic.run_fn(func, _reset)


def _reset():
    _elastic.reset()
