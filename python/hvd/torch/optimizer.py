"""DistributedOptimizer: the wrapped optimizer averages gradients over the
ranks before it steps.

DESIGN. Each parameter's gradient accumulator gets a hook, so a gradient is
submitted (allreduce_async_, in place) the moment backward has computed
it, while backward goes on computing the earlier layers' gradients; hvd's
coordinator fuses what arrives together. step() (through synchronize())
submits what no hook did (a parameter unused this step), waits for every
handle and puts the results in place, then steps. With
backward_passes_per_step = k, a parameter is submitted on every k-th
backward pass; the passes in between accumulate locally. With groups,
the gradients of a group are submitted as one grouped allreduce once the
whole group is ready, in an order rank 0 decides for every rank.
"""

import contextlib
import os
import warnings

import torch

from hvd.torch.compression import Compression
from hvd.torch.mpi_ops import (Adasum, Average, allreduce_async_, global_process_set,
                               grouped_allreduce_async_, size, sparse_allreduce_async,
                               synchronize)


def _check_passes(passes):
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError('backward_passes_per_step must be an int >= 1, not %r' % (passes,))
    return passes


def _split_evenly(items, n):
    """n consecutive slices of items whose lengths differ by at most one."""
    q, r = divmod(len(items), n)
    slices, start = [], 0
    for i in range(n):
        end = start + q + (1 if i < r else 0)
        if end > start:
            slices.append(items[start:end])
        start = end
    return slices


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods DistributedOptimizer adds to a copy of the wrapped
    optimizer's class (see DistributedOptimizer)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._parameter_names = self._names_of(named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}  # a parameter, or a group's tuple -> (handle, compression ctx)
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = self._check_groups(groups)
        self._p_to_group = {}
        self._group_counts = {}
        if process_set.included() and (size() > 1 or os.environ.get('HOROVOD_ELASTIC') == '1'):
            self._register_hooks()

    # ---- set-up ---------------------------------------------------------------------------

    def _names_of(self, named_parameters):
        """parameter -> name; names are the operations' names, the same on every rank."""
        params = [p for group in self.param_groups for p in group['params']]
        if named_parameters is None:
            return {p: 'allreduce.noname.%d' % i for i, p in enumerate(params)}
        named = list(named_parameters)
        if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
            raise ValueError('named_parameters must be (name, parameter) pairs, as '
                             'model.named_parameters() gives')
        seen, dups = set(), set()
        for name, _ in named:
            (dups if name in seen else seen).add(name)
        if dups:
            raise ValueError('named_parameters has duplicate names: %s' % ', '.join(sorted(dups)))
        named_ids = {id(p) for _, p in named}
        unnamed = [p for p in params if id(p) not in named_ids]
        if unnamed:
            raise ValueError('named_parameters does not name %d of the optimizer\'s parameters '
                             '(pass model.named_parameters() of the model the optimizer '
                             'trains)' % len(unnamed))
        return {p: name for name, p in sorted(named, key=lambda x: x[0])}

    @staticmethod
    def _check_groups(groups):
        if groups is None:
            return None
        if isinstance(groups, bool) or not (isinstance(groups, list) or
                                            (isinstance(groups, int) and groups > 0)):
            raise ValueError('groups must be a positive int or a list of lists of parameters')
        if isinstance(groups, list):
            seen = set()
            for group in groups:
                for p in group:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError('groups must be lists of torch.Tensor parameters')
                    if id(p) in seen:
                        raise ValueError('a parameter may be in one group only')
                    seen.add(id(p))
        return groups

    def _register_hooks(self):
        trained = [p for group in self.param_groups for p in group['params'] if p.requires_grad]
        if self._groups is not None:
            self._form_groups(trained)
        for p in trained:
            self._requires_update.add(p)
            # The node that accumulates p's gradient: its hook runs once the
            # gradient is complete for this backward pass.
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(p))
            self._grad_accs.append(accumulator)

    def _form_groups(self, trained):
        from hvd.torch.functions import broadcast_object
        # Every rank must group and order the same way: rank 0's order.
        order = broadcast_object([self._parameter_names[p] for p in trained], root_rank=0,
                                 name='hvd.optimizer.parameter_order',
                                 process_set=self.process_set)
        position = {name: i for i, name in enumerate(order)}
        trained = sorted(trained, key=lambda p: position[self._parameter_names[p]])
        if isinstance(self._groups, list):
            members = {id(p) for p in trained}
            groups = [[p for p in g if id(p) in members] for g in self._groups]
            grouped = {id(p) for g in groups for p in g}
            groups += [[p] for p in trained if id(p) not in grouped]
        else:
            groups = _split_evenly(trained, self._groups)
        for group in groups:
            if not group:
                continue
            group = tuple(group)
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0

    def set_backward_passes_per_step(self, passes):
        """From now on, reduce the gradients of every `passes` backward
        passes (accumulated locally in between); the count starts again."""
        self.backward_passes_per_step = _check_passes(passes)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    # ---- submitting -----------------------------------------------------------------------

    def _scales(self):
        if self.op == Average:
            # The average's division, split around the sum.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _gradient(self, p):
        if p.grad is None:  # not used in this step's graph
            p.grad = torch.zeros_like(p)
        return p.grad

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(p)
        tensor = self._gradient(p)
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(tensor, name=name, op=self.op,
                                              process_set=self.process_set), None
            tensor = tensor.to_dense()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scales()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        tensors, ctxs = [], []
        for p in group:
            tensor = self._gradient(p)
            if tensor.is_sparse:
                tensor = tensor.to_dense()
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            compressed, ctx = self._compression.compress(tensor)
            tensors.append(compressed)
            ctxs.append(ctx)
        prescale, postscale = self._scales()
        handle = grouped_allreduce_async_(tensors, name=self._parameter_names.get(group[0]),
                                          op=self.op, prescale_factor=prescale,
                                          postscale_factor=postscale,
                                          process_set=self.process_set)
        return handle, ctxs

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None and \
                    self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    'a gradient was computed more often than backward_passes_per_step (%d) '
                    'before step(); raise backward_passes_per_step to accumulate more passes '
                    'locally' % self.backward_passes_per_step)
            self._allreduce_delay[p] -= 1
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    self._group_ready(p)
                    return
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def _group_ready(self, p):
        group = self._p_to_group[p]
        self._group_counts[group] += 1
        if self._group_counts[group] < len(group):
            self._handles.setdefault(p, (None, None))
            return
        self._submit_group(group)

    def _submit_group(self, group):
        self._handles[group] = self._grouped_allreduce_grad_async(group)
        for member in group:
            self._handles.pop(member, None)
        self._group_counts[group] = 0

    # ---- completing -----------------------------------------------------------------------

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting the ones no hook
        submitted) and puts the results in the parameters' .grad."""
        if not self.process_set.included():
            self._synchronized = True
            return
        try:
            self._submit_missing()
            for key, (handle, ctx) in self._handles.items():
                if isinstance(key, tuple):
                    outputs = synchronize(handle)
                    for p, output, pctx in zip(key, outputs, ctx):
                        self._set_grad(p, self._compression.decompress(output, pctx))
                else:
                    output = handle() if callable(handle) else synchronize(handle)
                    self._set_grad(key, output if callable(handle)
                                   else self._compression.decompress(output, ctx))
        finally:
            # Also after a failure (a peer died): the handles are finished
            # either way, and the next step starts afresh.
            self._reset_reductions()
        self._synchronized = True

    def _reset_reductions(self):
        """Forgets the reductions of this step: their handles, the passes
        counted towards backward_passes_per_step, the groups' counts. For a
        step that failed (an elastic job restores and resets after it)."""
        self._handles.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for group in self._group_counts:
            self._group_counts[group] = 0

    def _submit_missing(self):
        submitted = set()
        for key, (handle, _) in self._handles.items():
            if handle is not None:
                submitted.update(key if isinstance(key, tuple) else (key,))
        if self._groups is not None:
            for group in self._group_counts:
                if not submitted.issuperset(group) and \
                        any(p in self._requires_update for p in group):
                    self._submit_group(group)
            return
        for p in self._requires_update:
            if p not in submitted:
                self._handles[p] = self._allreduce_grad_async(p)

    @staticmethod
    def _set_grad(p, reduced):
        if p.grad.is_sparse:
            if not reduced.is_sparse:
                reduced = reduced.to_sparse()
            p.grad.zero_().add_(reduced)  # a sparse tensor has no set_
        elif reduced is not p.grad:
            p.grad.set_(reduced)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize: for a caller that
        called synchronize() itself (to clip gradients, say)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's words, which scripts filter on.
                warnings.warn('optimizer.step() called without optimizer.skip_synchronize() '
                              'context after optimizer.synchronize(). This can cause training '
                              'slowdown. You may want to consider using '
                              'optimizer.skip_synchronize() context if you use '
                              'optimizer.synchronize() in your code.')
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError('optimizer.zero_grad() between loss.backward() and '
                                 'optimizer.step() (or synchronize()): the gradients are still '
                                 'being reduced in place')
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a torch optimizer so that step() uses gradients averaged (op)
    over the ranks of process_set.

    named_parameters: model.named_parameters(), which names each gradient's
    allreduce (else generated names: every rank must then build the
    optimizer identically). compression: Compression.fp16 sends float16.
    backward_passes_per_step: local backward passes accumulated per reduction.
    gradient_predivide_factor: Average divides by it before the sum and by
    size/it after. groups: a number of groups, or lists of parameters, each
    reduced as one grouped allreduce (num_groups is the older spelling).
    sparse_as_dense: reduce sparse gradients as dense tensors.
    op=Adasum (with more than one rank): each rank steps, and the updates
    are combined with Adasum (hvd/torch/adasum_optimizer.py).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError('DistributedOptimizer wraps a torch.optim.Optimizer, not %r'
                         % (optimizer,))
    _check_passes(backward_passes_per_step)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError('gradient_predivide_factor is for op=Average only')
    if num_groups != 0:
        warnings.warn('Parameter `num_groups` has been replaced by `groups` and will be '
                      'removed in v0.23.0.', DeprecationWarning)
        if groups is None:
            groups = num_groups
    if op == Adasum and size() > 1:
        if groups is not None:
            raise ValueError('groups are not supported with op=Adasum (each parameter steps '
                             'and is combined on its own)')
        from hvd.torch.adasum_optimizer import _DistributedAdasumOptimizer  # it imports this
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step, process_set)
    # A subclass of the optimizer's own class, so that isinstance and its
    # step() keep working; it shares the optimizer's parameter groups.
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
