"""TorchState: the elastic state of a PyTorch training process.

DESIGN. Each value given to TorchState gets a handler by its type: a
torch.nn.Module keeps a deep copy of its state_dict and syncs with
broadcast_parameters; an optimizer keeps a copy of its state_dict and
syncs with broadcast_optimizer_state; an LR scheduler and an
ElasticSampler sync their state_dict with broadcast_object; anything else
is a plain value with ObjectState's semantics. Handlers sync in the order
the values were given, so every rank makes the same collectives in the
same order. Saving starts with the handlers whose save is collective (a
registered handler of one's own may be), so that a failure there leaves
the previous commit whole. A DistributedOptimizer's
reductions in flight when a round failed are dropped on restore and reset:
they went with the round. The registry of handlers can be replaced
(set_handler_registry) for types of one's own.
"""

import copy

import torch

from hvd.elastic import ObjectState
from hvd.torch import functions
from hvd.torch.elastic.sampler import ElasticSampler
from hvd.torch.mpi_ops import rank

__all__ = ['TorchState', 'StateHandler', 'ModelStateHandler', 'OptimizerStateHandler',
           'LRSchedulerStateHandler', 'SamplerStateHandler', 'get_handler_registry',
           'set_handler_registry']


def _broadcast_object(obj):
    # Looked up at each call, so that hvd.torch.functions can be patched.
    return functions.broadcast_object(obj, root_rank=0, name='hvd.elastic.object_state')


class StateHandler(object):
    """How one kind of value is saved, restored, synced and reset."""

    # Whether save() makes collectives. TorchState saves these values first,
    # so that a failure in one leaves the whole last commit as it was.
    collective_save = False

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError('%s.save' % type(self).__name__)

    def restore(self):
        raise NotImplementedError('%s.restore' % type(self).__name__)

    def sync(self):
        raise NotImplementedError('%s.sync' % type(self).__name__)

    def reset(self):
        """After a reset, before the sync; most values need nothing."""

    def set_value(self, value):
        """A new value assigned to the state's attribute: saved at once."""
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A value with state_dict()/load_state_dict(): the copy is a deep one,
    as a state_dict shares its tensors with the value."""

    def __init__(self, value):
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self):
        functions.broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def restore(self):
        super().restore()
        _forget_reductions(self.value)

    def reset(self):
        _forget_reductions(self.value)

    def sync(self):
        functions.broadcast_optimizer_state(self.value, root_rank=0)


def _forget_reductions(optimizer):
    """A DistributedOptimizer whose step failed (in a gradient hook, or in
    synchronize) may still count the old round's reductions: they are gone
    with the round, so it forgets them."""
    reset = getattr(optimizer, '_reset_reductions', None)
    if reset is not None:
        reset()


class LRSchedulerStateHandler(_StateDictHandler):
    def sync(self):
        self.value.load_state_dict(functions.broadcast_object(
            self.value.state_dict(), root_rank=0, name='hvd.elastic.lr_scheduler'))


class SamplerStateHandler(_StateDictHandler):
    """An ElasticSampler: its state is a count that every rank keeps alike,
    synced from rank 0."""

    def reset(self):
        self.value.reset()  # the rank and size changed

    def sync(self):
        self.value.load_state_dict(functions.broadcast_object(
            self.value.state_dict(), root_rank=0, name='hvd.elastic.sampler'))


def _lr_scheduler_base():
    schedulers = torch.optim.lr_scheduler
    return getattr(schedulers, 'LRScheduler', None) or schedulers._LRScheduler


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (_lr_scheduler_base(), LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) pairs TorchState tries in order."""
    return _handler_registry


def set_handler_registry(registry):
    """Replaces the registry with (type, handler class) pairs."""
    global _handler_registry
    try:
        pairs = [(t, h) for t, h in registry]
    except (TypeError, ValueError):
        raise ValueError('set_handler_registry takes (type, handler class) pairs, not %r'
                         % (registry,)) from None
    for t, h in pairs:
        if not isinstance(t, type) or not (isinstance(h, type) and issubclass(h, StateHandler)):
            raise ValueError('set_handler_registry: (%r, %r) is not a (type, StateHandler '
                             'subclass) pair' % (t, h))
    _handler_registry = pairs


def _handler_for(value):
    for kind, handler_class in _handler_registry:
        if isinstance(value, kind):
            return handler_class(value)
    return None


class TorchState(ObjectState):
    """The elastic state of a PyTorch training process: a model, an
    optimizer and any other values as keyword arguments (more models or
    optimizers, LR schedulers, an ElasticSampler, counters such as epoch
    and batch), each kept as an attribute. Values of a type in the handler
    registry are saved and synced by their handler; the others as plain
    values (ObjectState). Assigning a new model, optimizer, ... to an
    attribute saves it at once."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        self._check_names(kwargs)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=_broadcast_object, get_rank=rank, **plain)

    def save(self):
        handlers = list(self._handlers.values())
        for handler in [h for h in handlers if h.collective_save] + \
                [h for h in handlers if not h.collective_save]:
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self):
        for handler in self._handlers.values():
            handler.reset()
        super().reset()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get('_handlers')
        # The first assignment (in __init__) is the handler's own value.
        if handlers is not None and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
