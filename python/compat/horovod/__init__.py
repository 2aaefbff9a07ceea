"""hvd's stand-in for the `horovod` package, so that Horovod's PyTorch
scripts run unchanged on hvd: `import horovod.torch as hvd` gets hvd.torch.

Only horovod.torch (with horovod.torch.elastic) is provided; importing
horovod.tensorflow, horovod.keras, horovod.mxnet, horovod.spark or
horovod.ray raises ImportError. Jobs start with `hvdrun --horovod-compat`,
which puts this tree first on the ranks' PYTHONPATH (and its bin directory,
with a `horovodrun` that is that hvdrun, first on their PATH), or with
horovod.run, which runs a function on ranks of this host through hvdrun.
"""

import os
import sys

import hvd
from hvd import _lib
from horovod.runner import run

# Horovod's release whose API hvd follows, then hvd's own version.
HOROVOD_API_VERSION = '0.28.1'

__version__ = '%s+hvd.%s' % (HOROVOD_API_VERSION, hvd.__version__)

__all__ = ['run', '__version__']


def _library_from_maps():
    """The file of the mapped libhvd, read from /proc/self/maps (Linux)."""
    try:
        with open('/proc/self/maps') as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith('libhvd.so'):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def _library_path():
    """Where the libhvd this process loaded lives."""
    name = _lib.lib._name
    if os.sep in name:
        return os.path.abspath(name)
    return _library_from_maps() or name


def _announce():
    """One line on rank 0's stderr (or a lone process's), so that a job's log
    says that hvd, not Horovod, ran it."""
    if os.environ.get('HOROVOD_RANK', '0') != '0':
        return
    print('horovod.torch provided by hvd %s (%s)' % (hvd.__version__, _library_path()),
          file=sys.stderr, flush=True)


_announce()
