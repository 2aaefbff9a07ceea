"""ElasticSampler: a DistributedSampler for elastic jobs, which counts the
samples processed this epoch and shares out the rest again when the ranks
change. It is horovod.torch.elastic's sampler as Horovod has had it since
0.24, so that a checkpoint's state_dict means the same samples to both.

DESIGN. An epoch's order is the dataset's indices shuffled with Python's
random.Random(seed + epoch) (in order without shuffle): the same on every
rank, and Horovod's. What was processed is always a prefix of that order,
so the state is its length, processed_num: rank r takes every size-th
remaining index from position r, so once each of the size ranks has done
k batches of b samples, exactly the first k * b * size remaining indices
are done, which is what record_batch adds. Every rank counts alike, so
TorchState syncs the count from rank 0 and needs no gather. The remaining
indices are padded (cyclically) to a multiple of the number of ranks, so
every rank has as many samples, and so as many batches.
"""

import operator
import random

import torch
import torch.utils.data

from hvd.torch.mpi_ops import rank, size


def _non_negative_int(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError('%s must be an int >= 0, not %r' % (what, value))
    return value


def _batch_size(batch_size):
    if _non_negative_int(batch_size, 'batch_size') == 0:
        raise ValueError('batch_size must be at least 1')
    return batch_size


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset among the ranks, as DistributedSampler does, and
    counts what was processed so that a reset goes on with the rest.

    Put it in the TorchState, call record_batch after each batch, and
    set_epoch at the END of each epoch (it starts the count again).
    dataset: anything with a constant len(). shuffle: a new order every
    epoch (seeded with seed + epoch, so seed must be the same on every
    rank). hvd must be initialized: the sampler reads the rank and size,
    and reads them again on reset() (TorchState calls it after every
    reset). state_dict() is {'epoch', 'processed_num'}, as Horovod's."""

    def __init__(self, dataset, shuffle=True, seed=0):
        super().__init__(None)
        try:
            len(dataset)
        except TypeError:
            raise ValueError('ElasticSampler needs a dataset with a len(), not %r'
                             % (dataset,)) from None
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError('seed must be an int, not %r' % (seed,))
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0  # the epoch order's first processed_num indices are done
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []  # this rank's indices in the current pass
        self._recorded = 0  # how many of them were recorded
        self.reset()

    @property
    def processed_indices(self):
        """The dataset indices processed this epoch (Horovod 0.20 to 0.23
        kept this set; later ones keep an empty one)."""
        return set(self._epoch_order(self.epoch)[:self.processed_num])

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: a new order, nothing processed. Call it at
        the end of an epoch, so that a reset in the middle of one does not
        process its samples again."""
        self.epoch = _non_negative_int(epoch, 'epoch')
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts this rank's next batch, and so every rank's, as processed:
        processed_num grows by batch_size times the number of ranks.
        Batches are counted in the order they come; batch_idx is checked
        but not used, as in Horovod."""
        _non_negative_int(batch_idx, 'batch_idx')
        self._count(_batch_size(batch_size))

    def get_indices(self, batch_idx, batch_size):
        """The indices of this rank's batch number batch_idx (from 0) in the
        current pass, batches being batch_size long."""
        start = _non_negative_int(batch_idx, 'batch_idx') * _batch_size(batch_size)
        return self.indices[start:start + batch_size]

    def record_indices(self, indices):
        """Counts `indices` (ints, or a tensor of them), which must be this
        rank's next ones in the current pass, as processed: record_batch
        for a batch of that many (the form of Horovod 0.20 to 0.23, whose
        state was a set of indices). ValueError for others."""
        if isinstance(indices, torch.Tensor):
            indices = indices.reshape(-1).tolist()
        n = len(self.dataset)
        checked = []
        for index in indices:
            try:
                value = operator.index(index)
            except TypeError:
                value = -1
            if isinstance(index, bool) or not 0 <= value < n:
                raise ValueError('record_indices: %r is not an index of the dataset (0 to %d)'
                                 % (index, n - 1))
            checked.append(value)
        expected = self.indices[self._recorded:self._recorded + len(checked)]
        if sorted(checked) != sorted(expected):
            raise ValueError('record_indices: %s are not this rank\'s next indices in the pass '
                             '(%s): the sampler counts the samples processed in its order, as '
                             'Horovod\'s does since 0.24' % (checked, expected))
        self._count(len(checked))

    def _count(self, n):
        self._recorded += n
        self.processed_num += n * self.num_replicas

    def state_dict(self):
        return {'epoch': self.epoch, 'processed_num': self.processed_num}

    def load_state_dict(self, state_dict):
        """Takes what state_dict() returns, Horovod's or hvd's. An older
        one, {'epoch', 'processed_indices'}, counts the longest prefix of
        the epoch's order that it says is done: samples may be seen again,
        none is skipped."""
        try:
            epoch = _non_negative_int(state_dict['epoch'], 'epoch')
            if 'processed_num' in state_dict:
                processed = _non_negative_int(state_dict['processed_num'], 'processed_num')
            else:
                processed = self._done_prefix(epoch, set(state_dict['processed_indices']))
        except (KeyError, TypeError):
            raise ValueError('ElasticSampler.load_state_dict takes what state_dict() returns, '
                             'not %r' % (state_dict,)) from None
        self.epoch = epoch
        self.processed_num = processed
        self.reset()

    def _done_prefix(self, epoch, done):
        count = 0
        for index in self._epoch_order(epoch):
            if index not in done:
                break
            count += 1
        return count

    def reset(self):
        """Reads the rank and size again and shares out what remains of the
        epoch. A pass started before keeps its indices; the next one gets
        the new share."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = self._epoch_order(self.epoch)[self.processed_num:]
        self.num_samples = -(-len(self.remaining_indices) // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def _epoch_order(self, epoch):
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def _share(self):
        """This rank's indices: the remaining ones padded to total_size by
        repeating from the start, then every num_replicas-th from rank."""
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        return padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        self.indices = self._share()
        self._recorded = 0
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
