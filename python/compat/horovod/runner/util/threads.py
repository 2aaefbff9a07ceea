"""horovod.runner.util.threads: starting a function in a background thread."""

import threading

__all__ = ['in_thread']


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Starts target(*args) in a new thread and returns the started thread.
    daemon: the thread does not keep the process alive. silent: an exception
    raised by target is dropped instead of printed by threading's hook."""
    if not callable(target):
        raise ValueError('in_thread: target must be callable, not %r' % (target,))
    if not isinstance(args, tuple):
        raise ValueError('in_thread: args must be a tuple (one argument: (arg,)), not %r'
                         % (args,))
    thread = threading.Thread(target=_without_errors(target) if silent else target, args=args,
                              name=name, daemon=daemon)
    thread.start()
    return thread


def _without_errors(target):
    def run(*args):
        try:
            target(*args)
        except Exception:  # silent=True: the caller asked not to hear of it
            pass
    return run
