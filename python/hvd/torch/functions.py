"""Broadcasting a model's and an optimizer's state, and any picklable
object, from one rank to the others; gathering objects from every rank.

Every call is collective: each rank of the process set makes the same
calls in the same order. Operation names come from the call and the
state's keys, never from what differs between ranks (the type of an object
that only the root has, say), so they agree without extra messages; a call
waits for all of its operations before it returns, so the same names may
be used again by the next call.

DESIGN of broadcast_optimizer_state. Ranks' optimizer states may differ in
shape, not only in value: a worker that joins an elastic job has none, and
a parameter that never had a gradient has no state on one rank but some on
another. So the root first broadcasts, as one object, the layout of its
state (per parameter: each tensor's shape, dtype and device kind, and the
values that are not tensors) and its parameter groups' options; every rank
then makes its state match that layout, reusing its own tensors where they
fit, and all ranks broadcast exactly the root's tensors, in place. Ranks
therefore always issue the same operations, even when one of them holds an
optimizer that does not match the root's (it raises ValueError afterwards).
"""

import io

import cloudpickle
import torch

from hvd.torch.mpi_ops import (allgather, broadcast_, broadcast_async_, global_process_set, rank,
                               synchronize)
from hvd.torch.optimizer import _DistributedOptimizer

__all__ = ['broadcast_parameters', 'broadcast_optimizer_state', 'broadcast_object',
           'allgather_object']

_PARAMS_FORMS = 'a state_dict, named_parameters(), parameters() or a list of (name, tensor) pairs'


# ==== parameters =================================================================================

def broadcast_parameters(params, root_rank, prefix=None, process_set=global_process_set):
    """Overwrites every tensor of `params` with root_rank's, in place.

    params: a model's state_dict(), named_parameters(), parameters(), or a
    list of (name, tensor) pairs; None values are skipped. Each tensor is
    broadcast under its name (its position for unnamed ones), prefixed with
    `prefix.` when given; all are sent at once, then waited for. root_rank
    is a global rank. ValueError for anything else than those forms."""
    items = _named_tensors(params)
    label = '%s.' % prefix if prefix else ''
    pending = []
    try:
        for name, tensor in items:
            pending.append(_broadcast_in_place(tensor, root_rank, label + name, process_set))
    finally:
        # Also after a failed submission: what was submitted must complete
        # before its tensors and names may be used again.
        for handle, finish in pending:
            synchronize(handle)
            finish()


def _named_tensors(params):
    """[(unique name, tensor)] from any form broadcast_parameters takes,
    every entry checked before anything is sent."""
    if isinstance(params, torch.Tensor) or isinstance(params, (str, bytes)):
        raise ValueError('broadcast_parameters takes %s, not a %s'
                         % (_PARAMS_FORMS, type(params).__name__))
    if isinstance(params, dict):
        entries = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        try:
            entries = list(params)
        except TypeError:
            raise ValueError('broadcast_parameters takes %s, not %s'
                             % (_PARAMS_FORMS, type(params).__name__)) from None
    items, seen = [], {}
    for position, entry in enumerate(entries):
        name, tensor = _entry(entry, position)
        if tensor is None:
            continue
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:  # the same name twice (two models' pairs, say): keep both apart
            name = '%s#%d' % (name, seen[name])
        items.append((name, tensor))
    return items


def _entry(entry, position):
    if isinstance(entry, torch.Tensor):
        return str(position), entry
    if isinstance(entry, tuple) and len(entry) == 2:
        name, tensor = entry
        if tensor is None or isinstance(tensor, torch.Tensor):
            return (str(position) if name is None else str(name)), tensor
        raise ValueError('broadcast_parameters: %r is a %s, not a tensor'
                         % (name, type(tensor).__name__))
    raise ValueError('broadcast_parameters takes %s; entry %d is a %s'
                     % (_PARAMS_FORMS, position, type(entry).__name__))


def _broadcast_in_place(tensor, root_rank, name, process_set):
    """Submits the broadcast of `tensor` into itself: (handle, a function to
    call once it completed). A tensor hvd cannot write directly (not
    contiguous) goes through a contiguous copy."""
    target = tensor.detach()
    if target.is_contiguous():
        return broadcast_async_(target, root_rank, name=name, process_set=process_set), \
            lambda: None
    staging = target.contiguous()
    handle = broadcast_async_(staging, root_rank, name=name, process_set=process_set)
    return handle, lambda: target.copy_(staging)


# ==== optimizer state ============================================================================

def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set,
                              *, prefix=None):
    """Makes every rank's optimizer state equal to root_rank's: the state of
    each parameter (momentum buffers, step counts, ...) and the options of
    each parameter group (lr, betas, ...).

    An optimizer that has not stepped yet has no state: it first takes one
    step with zero gradients, without any communication (a
    DistributedOptimizer reduces nothing), so that every rank has state to
    overwrite. The parameters are put back as they were, and so are the
    gradients that existed; a parameter that had none keeps the zero one,
    as with Horovod. model (optional, Horovod's argument): the module the
    optimizer trains; the zero gradients of its sparse embeddings' weights
    are sparse, as their real ones will be. torch.optim.LBFGS is refused
    (ValueError), as its state does not map to parameters. prefix names the
    operations (default "optimizer")."""
    if model is not None and not isinstance(model, torch.nn.Module):
        raise ValueError('broadcast_optimizer_state: model must be a torch.nn.Module or None, '
                         'not %r' % (model,))
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError('broadcast_optimizer_state: the state of torch.optim.LBFGS cannot be '
                         'broadcast; broadcast the model, or the whole optimizer with '
                         'broadcast_object(optimizer.state_dict())')
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError('broadcast_optimizer_state takes a torch.optim.Optimizer, not %r'
                         % (optimizer,))
    label = prefix if prefix else 'optimizer'
    params = [p for group in optimizer.param_groups for p in group['params']]
    if not any(optimizer.state.values()):
        _zero_step(optimizer, _sparse_parameters(model))
    layout = broadcast_object(_layout(optimizer, params), root_rank,
                              name='%s.layout' % label, process_set=process_set)
    problems = _apply_options(optimizer, layout['options'], layout['counts'])
    tensors, more = _conform_state(optimizer, params, layout['state'])
    broadcast_parameters(tensors, root_rank, prefix='%s.state' % label, process_set=process_set)
    problems += more
    if problems:
        raise ValueError('broadcast_optimizer_state: this optimizer does not match rank %d\'s: %s'
                         % (root_rank, '; '.join(problems)))


def _sparse_parameters(model):
    """The ids of the parameters whose gradients are sparse: those of the
    model's embeddings made with sparse=True."""
    if model is None:
        return set()
    return {id(p) for m in model.modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
            for p in m.parameters()}


def _zero_step(optimizer, sparse):
    """One local step with zero gradients, which only creates the
    optimizer's state: the parameters are put back, and the gradients that
    existed; the others stay zero (sparse for the ids in `sparse`)."""
    saved = []
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group['params']:
                if p.requires_grad:
                    saved.append((p, p.detach().clone(), p.grad))
                    p.grad = torch.zeros_like(p)
                    # sparse where the real one will be, and for SparseAdam,
                    # which takes nothing else
                    if id(p) in sparse or isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        if type(optimizer).__module__ == _DistributedOptimizer.__module__:
            # the wrapped class's step: the zero gradients are not reduced
            super(type(optimizer), optimizer).step()
        else:
            optimizer.step()
        for p, data, grad in saved:
            p.copy_(data)
            if grad is not None:
                p.grad = grad
            else:
                p.grad.zero_()  # what the step may have written there


def _layout(optimizer, params):
    """What the root sends: each group's options, and per parameter position
    each state entry, a tensor's (shape, dtype, on the CPU) or a value."""
    options = [{k: v for k, v in group.items() if k != 'params'}
               for group in optimizer.param_groups]
    counts = [len(group['params']) for group in optimizer.param_groups]
    state = {}
    for position, p in enumerate(params):
        entries = optimizer.state.get(p)
        if not entries:
            continue
        state[position] = {key: (_TensorSpec(value) if isinstance(value, torch.Tensor) else value)
                           for key, value in entries.items()}
    return {'options': options, 'counts': counts, 'state': state}


class _TensorSpec(object):
    """A state tensor as the layout carries it: everything but its values."""

    def __init__(self, tensor):
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        self.on_cpu = tensor.device.type == 'cpu'

    def fits(self, tensor):
        return isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == self.shape and \
            tensor.dtype == self.dtype and (tensor.device.type == 'cpu') == self.on_cpu

    def make(self, p):
        return torch.empty(self.shape, dtype=self.dtype,
                           device='cpu' if self.on_cpu else p.device)


def _apply_options(optimizer, options, counts):
    """Takes the root's group options; what does not match (the groups, or
    their parameters' numbers) is returned, and then nothing is taken."""
    mine = [len(group['params']) for group in optimizer.param_groups]
    if mine != counts:
        return ['parameter groups of %s parameters here, of %s on the root' % (mine, counts)]
    for group, root_options in zip(optimizer.param_groups, options):
        group.update(root_options)
    return []


def _conform_state(optimizer, params, layout):
    """Makes this optimizer's state have the root's entries (values set,
    tensors allocated where the rank's own do not fit); returns the
    [(name, tensor)] to broadcast, in the root's order, and what did not
    match."""
    problems, tensors = [], []
    if max(layout, default=-1) >= len(params):
        problems.append('%d parameters here, the root has state for parameter %d'
                        % (len(params), max(layout)))
    for position, entries in sorted(layout.items()):
        p = params[position] if position < len(params) else None
        state = optimizer.state[p] if p is not None else {}
        for key in [k for k in state if k not in entries]:
            del state[key]
        for key, value in sorted(entries.items(), key=lambda kv: str(kv[0])):
            if isinstance(value, _TensorSpec):
                if not value.fits(state.get(key)):
                    state[key] = value.make(p if p is not None else torch.empty(0))
                tensors.append(('%d.%s' % (position, key), state[key]))
            else:
                state[key] = value
    for position, p in enumerate(params):
        if position not in layout:
            optimizer.state.pop(p, None)
    return tensors, problems


# ==== objects ====================================================================================

def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` on every rank of the process set (root_rank
    is a global rank). The object travels pickled with cloudpickle: its size,
    then its bytes. Other ranks' `obj` is not used. name: the operations'
    name, "broadcast_object" by default (the same on every rank, whatever
    each passes as obj)."""
    label = _label(name, 'broadcast_object')
    is_root = rank() == root_rank
    data = _pickled(obj) if is_root else None
    size = torch.tensor([data.numel() if is_root else 0], dtype=torch.int64)
    broadcast_(size, root_rank, name='%s.sz' % label, process_set=process_set)
    if not is_root:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, name='%s.t' % label, process_set=process_set)
    return obj if is_root else _unpickled(data)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj`, in the process set's rank
    order (pickled with cloudpickle: sizes, then bytes). name: the
    operations' name, "allgather_object" by default."""
    label = _label(name, 'allgather_object')
    data = _pickled(obj)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name='%s.sz' % label,
                      process_set=process_set)
    gathered = allgather(data, name='%s.t' % label, process_set=process_set)
    objects, offset = [], 0
    for n in sizes.tolist():
        objects.append(_unpickled(gathered[offset:offset + n]))
        offset += n
    return objects


def _label(name, default):
    if name is None:
        return default
    if not isinstance(name, str):
        raise ValueError('name must be a str, not %r' % (name,))
    return name


def _pickled(obj):
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _unpickled(data):
    return cloudpickle.loads(data.numpy().tobytes())
