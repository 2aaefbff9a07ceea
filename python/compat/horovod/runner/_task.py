"""One rank of horovod.run, started by hvdrun as `python3 _task.py DIR`:
loads the function the caller left in DIR, calls it, and leaves in DIR
what it returned (result.<rank>) or raised (error.<rank>) for the caller.

It runs as a script, not as horovod.runner._task, so that a rank imports
`horovod` (and loads libhvd) only when the function does. Only the
standard library and cloudpickle are imported here.
"""

import os
import pickle
import sys
import traceback

import cloudpickle


def _write(directory, name, data):
    """Whole or not at all: the caller may look while the job stops."""
    path = os.path.join(directory, name)
    with open(path + '.part', 'wb') as f:
        f.write(data)
    os.replace(path + '.part', path)


def _error_record(exc):
    """What the caller needs to re-raise exc: the exception itself when it
    pickles, its type, text and traceback always."""
    try:
        pickled = cloudpickle.dumps(exc)
    except Exception:  # an exception holding something unpicklable
        pickled = None
    kind = type(exc)
    return pickle.dumps({
        'type': kind.__name__ if kind.__module__ == 'builtins'
        else '%s.%s' % (kind.__module__, kind.__qualname__),
        'message': str(exc),
        'traceback': ''.join(traceback.format_exception(kind, exc, exc.__traceback__)),
        'exception': pickled,
    })


def main(directory):
    rank = int(os.environ.get('HOROVOD_RANK', '0'))
    with open(os.path.join(directory, 'func'), 'rb') as f:
        caller_dir, blob = pickle.load(f)
    # sys.path[0] is this file's directory; the caller's first entry (its
    # script's directory) takes its place, so that what the function
    # imports resolves as it did there.
    sys.path[0] = caller_dir
    try:
        func, args, kwargs = cloudpickle.loads(blob)
        result = cloudpickle.dumps(func(*args, **kwargs))
    except BaseException as exc:  # SystemExit too: the caller gets no result from it
        _write(directory, 'error.%d' % rank, _error_record(exc))
        raise
    _write(directory, 'result.%d' % rank, result)


if __name__ == '__main__':
    main(sys.argv[1])
