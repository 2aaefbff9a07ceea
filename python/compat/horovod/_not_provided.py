"""The error for the parts of Horovod that hvd does not provide."""

import hvd


def refuse(module_name):
    """Raises the ImportError that importing module_name gives."""
    raise ImportError(
        '%s is not available: this `horovod` is hvd %s\'s compatibility layer, which provides '
        'only horovod.torch. Use a real Horovod installation for other frameworks (and do not '
        'start the job with `hvdrun --horovod-compat`).' % (module_name, hvd.__version__),
        name=module_name)
