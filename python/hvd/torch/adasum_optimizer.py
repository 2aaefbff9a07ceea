"""DistributedOptimizer(op=Adasum): the wrapped optimizer steps on each rank,
and the ranks' updates are combined with Adasum.

DESIGN. Adasum combines what each rank's optimizer would change, not the
raw gradients: for a parameter p, the step starts from p's value (saved
in a buffer, `start`), runs the wrapped optimizer on p alone, takes the
change (delta = p - start), reduces the deltas over the ranks with
op=Adasum, and sets p = start + adasum(deltas). The local step runs in the
gradient's hook, as soon as backward has computed it, so the reductions
overlap the rest of backward; step() submits what no hook did, waits, and
applies the results. backward_passes_per_step = k steps every k-th pass.
"""

import contextlib

import torch

from hvd.torch.mpi_ops import Adasum, allreduce_async_, global_process_set, size, synchronize
from hvd.torch.optimizer import _DistributedOptimizer


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """The methods DistributedOptimizer(op=Adasum) adds to a copy of the
    wrapped optimizer's class."""

    # The gradients' hooks are DistributedOptimizer's, without groups: a
    # parameter's hook calls _allreduce_grad_async (below) on its k-th pass.
    _names_of = _DistributedOptimizer._names_of
    _register_hooks = _DistributedOptimizer._register_hooks
    _make_hook = _DistributedOptimizer._make_hook
    set_backward_passes_per_step = _DistributedOptimizer.set_backward_passes_per_step
    _groups = None

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._parameter_names = self._names_of(named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self.process_set = process_set
        self._allreduce_delay = {p: backward_passes_per_step for p in self._parameter_names}
        self._handles = {}  # parameter -> (handle, compression ctx); handle None: not yet
        self._requires_update = set()
        self._grad_accs = []
        if process_set.included() and size() > 1:
            self._register_hooks()
        self._starts = {p: torch.zeros_like(p, requires_grad=False) for p in self._requires_update}

    def _step_on(self, p):
        """The wrapped optimizer's step for p alone (its state is per parameter)."""
        kept = [group['params'] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group['params'] = [p] if any(p is q for q in group['params']) else []
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, kept):
                group['params'] = params

    def _allreduce_grad_async(self, p):
        """Steps p locally and submits its delta's Adasum; p holds the delta
        until step() applies the result."""
        start = self._starts[p]
        with torch.no_grad():
            start.copy_(p)
            self._step_on(p)
            p.sub_(start)
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum,
                                  process_set=self.process_set)
        return handle, ctx

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if not self._requires_update:  # not in the process set: a local step
            super(self.__class__, self).step()
            return loss
        try:
            for p in self._requires_update:
                if self._handles.get(p, (None, None))[0] is None:
                    self._handles[p] = self._allreduce_grad_async(p)
            for p, (handle, ctx) in self._handles.items():
                delta = self._compression.decompress(synchronize(handle), ctx)
                with torch.no_grad():
                    start = self._starts[p]
                    start.add_(delta)
                    p.copy_(start)
        finally:
            self._handles.clear()
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
        return loss

    def synchronize(self):
        """Nothing to do: step() waits for the reductions itself."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError('skip_synchronize() is not supported with op=Adasum: step() both '
                             'steps and combines the updates')
        yield  # pragma: no cover

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError('optimizer.zero_grad() between loss.backward() and '
                                 'optimizer.step(): the updates are still being combined')
        return super(self.__class__, self).zero_grad(*args, **kwargs)
