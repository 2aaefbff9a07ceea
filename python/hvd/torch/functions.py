"""Broadcasting a model's and an optimizer's state, and any picklable
object, from one rank to the others; gathering objects from every rank.

Every call is collective: each rank of the process set makes the same
calls in the same order. Operation names are derived from the call and
the state's keys, so they agree across ranks without extra messages.
"""

import io

import cloudpickle
import torch

from hvd.torch.mpi_ops import (allgather, broadcast_, broadcast_async_, global_process_set, rank,
                               synchronize)


def _named_tensors(params, what):
    """(name, tensor) pairs from a state_dict, named_parameters() or a list of pairs."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, '__iter__'):
        items = list(params)
        if any(not isinstance(x, tuple) or len(x) != 2 for x in items):
            raise ValueError('%s takes a state_dict, named_parameters() or a list of (name, '
                             'tensor) pairs' % what)
    else:
        raise ValueError('%s takes a state_dict, named_parameters() or a list of (name, '
                         'tensor) pairs, not %s' % (what, type(params).__name__))
    for name, p in items:
        if p is not None and not isinstance(p, torch.Tensor):
            raise ValueError('%s: %r is a %s, not a tensor' % (what, name, type(p).__name__))
    return items


def broadcast_parameters(params, root_rank, prefix=None, process_set=global_process_set):
    """Overwrites every tensor of `params` (a model's state_dict(), its
    named_parameters(), or (name, tensor) pairs) with root_rank's, in place.
    All tensors are sent at once, then waited for."""
    items = _named_tensors(params, 'broadcast_parameters')
    handles = []
    for name, p in items:
        if p is None:
            continue
        if isinstance(p, torch.nn.Parameter) or p.requires_grad:
            p = p.data  # the parameter itself: autograd must not see the write
        label = 'broadcast.%s%s' % (prefix + '.' if prefix else '', name)
        handles.append(broadcast_async_(p, root_rank, name=label, process_set=process_set))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, prefix=None,
                              process_set=global_process_set):
    """Makes every rank's optimizer state (per-parameter tensors such as
    momentum buffers, and the hyperparameters of each parameter group) equal
    to root_rank's. An optimizer that has not stepped yet has no state: it
    takes one step with zero gradients first (which leaves the parameters of
    SGD and Adam as they are), so that every rank has the same state to
    overwrite."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError('broadcast_optimizer_state: torch.optim.LBFGS keeps its state in a '
                         'form that cannot be broadcast; broadcast the model instead')
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError('broadcast_optimizer_state takes a torch.optim.Optimizer, not %r'
                         % (optimizer,))
    label = 'optimizer' if prefix is None else prefix
    if len(optimizer.state_dict()['state']) == 0:
        _zero_step(optimizer)
    state_dict = optimizer.state_dict()
    # Hyperparameters and non-tensor state (step counts, flags) go as one object.
    scalars = {}
    tensors = []
    for gi, group in enumerate(state_dict['param_groups']):
        for key, value in sorted(group.items()):
            if key != 'params':
                scalars['group.%d.%s' % (gi, key)] = value
    for pid, pstate in sorted(state_dict['state'].items()):
        for key, value in sorted(pstate.items()):
            if isinstance(value, torch.Tensor):
                tensors.append(('state.%s.%s' % (pid, key), value))
            else:
                scalars['state.%s.%s' % (pid, key)] = value
    scalars = broadcast_object(scalars, root_rank, name='%s.scalars' % label,
                               process_set=process_set)
    broadcast_parameters(tensors, root_rank, prefix=label, process_set=process_set)
    _load_scalars(optimizer, state_dict, scalars)


def _zero_step(optimizer):
    saved = []
    for group in optimizer.param_groups:
        for p in group['params']:
            saved.append((p, p.grad))
            p.grad = torch.zeros_like(p) if p.requires_grad else None
    optimizer.step()
    for p, grad in saved:
        p.grad = grad


def _load_scalars(optimizer, state_dict, scalars):
    for gi, group in enumerate(optimizer.param_groups):
        for key in list(group.keys()):
            if key != 'params' and 'group.%d.%s' % (gi, key) in scalars:
                group[key] = scalars['group.%d.%s' % (gi, key)]
    # Tensors were overwritten in place (state_dict() shares them with the
    # optimizer's state); non-tensor state values are set back by position.
    params = [p for group in optimizer.param_groups for p in group['params']]
    packed_ids = [pid for group in state_dict['param_groups'] for pid in group['params']]
    for pid, p in zip(packed_ids, params):
        pstate = optimizer.state.get(p)
        if not pstate:
            continue
        for key in list(pstate.keys()):
            label = 'state.%s.%s' % (pid, key)
            if label in scalars and not isinstance(pstate[key], torch.Tensor):
                pstate[key] = scalars[label]


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` on every rank (pickled with cloudpickle)."""
    label = name if name is not None else type(obj).__name__
    if rank() == root_rank:
        payload = io.BytesIO()
        cloudpickle.dump(obj, payload)
        data = torch.frombuffer(bytearray(payload.getvalue()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    broadcast_(size, root_rank, name='%s.sz' % label, process_set=process_set)
    if rank() != root_rank:
        data = torch.zeros(int(size.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, name='%s.t' % label, process_set=process_set)
    if rank() == root_rank:
        return obj
    return cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj`, in rank order."""
    label = name if name is not None else type(obj).__name__
    payload = io.BytesIO()
    cloudpickle.dump(obj, payload)
    data = torch.frombuffer(bytearray(payload.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name='%s.sz' % label,
                      process_set=process_set)
    gathered = allgather(data, name='%s.t' % label, process_set=process_set).numpy().tobytes()
    objects, offset = [], 0
    for n in sizes.tolist():
        objects.append(cloudpickle.loads(gathered[offset:offset + n]))
        offset += n
    return objects


__all__ = ['broadcast_parameters', 'broadcast_optimizer_state', 'broadcast_object',
           'allgather_object']
