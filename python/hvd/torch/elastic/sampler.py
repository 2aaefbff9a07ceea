"""ElasticSampler: a DistributedSampler for elastic jobs, which remembers
the samples processed this epoch and shares out the rest again when the
ranks change.

DESIGN. An epoch's order is one permutation of the whole dataset (seeded
with seed + epoch, the same on every rank). The remaining indices are that
order minus the processed ones, so a reset keeps the order and only drops
what was done. They are padded (cyclically) to a multiple of the number of
ranks, so that every rank has as many samples, and so as many batches:
rank r takes every size-th index from position r. What this rank recorded
is merged with the other ranks' at each commit (TorchState's handler), so
after a reset every rank knows what the whole job has processed.
"""

import operator

import torch
import torch.utils.data

from hvd.torch.mpi_ops import rank, size


def _non_negative_int(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError('%s must be an int >= 0, not %r' % (what, value))
    return value


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset among the ranks, as DistributedSampler does, and
    keeps track of what was processed so that a reset goes on with the rest.

    Put it in the TorchState, call record_batch (or record_indices) after
    each batch, and set_epoch at the END of each epoch (it forgets what was
    processed). dataset: anything with a constant len(). shuffle: a new
    order every epoch (seeded with seed + epoch, so seed must be the same on
    every rank). hvd must be initialized: the sampler reads the rank and
    size, and reads them again on reset() (TorchState calls it after every
    reset)."""

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
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []  # this rank's indices in the current pass
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: a new order, nothing processed. Call it at
        the end of an epoch, so that a reset in the middle of one does not
        process its samples again."""
        self.epoch = _non_negative_int(epoch, 'epoch')
        self.processed_indices = set()
        self.reset()

    def get_indices(self, batch_idx, batch_size):
        """The indices of this rank's batch number batch_idx (from 0) in the
        current pass, batches being batch_size long."""
        _non_negative_int(batch_idx, 'batch_idx')
        if _non_negative_int(batch_size, 'batch_size') == 0:
            raise ValueError('batch_size must be at least 1')
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def record_batch(self, batch_idx, batch_size):
        """Marks this rank's batch batch_idx of the current pass as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        """Marks dataset indices as processed (ints, or a tensor of them)."""
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
        self.processed_indices.update(checked)

    def state_dict(self):
        return {'epoch': self.epoch, 'processed_indices': set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        try:
            epoch, processed = state_dict['epoch'], state_dict['processed_indices']
        except (KeyError, TypeError):
            raise ValueError('ElasticSampler.load_state_dict takes what state_dict() returns, '
                             'not %r' % (state_dict,)) from None
        self.epoch = _non_negative_int(epoch, 'epoch')
        self.processed_indices = set(processed)
        self.reset()

    def reset(self):
        """Reads the rank and size again and shares out what remains of the
        epoch. A pass started before keeps its indices; the next one gets
        the new share."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = [i for i in self._epoch_order()
                                  if i not in self.processed_indices]
        self.num_samples = -(-len(self.remaining_indices) // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def _epoch_order(self):
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=generator).tolist()

    def _share(self):
        """This rank's indices: the remaining ones padded to total_size by
        repeating from the start, then every num_replicas-th from rank."""
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        return padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        self.indices = self._share()
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
