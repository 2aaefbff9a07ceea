"""horovod.common.util: the helpers that Horovod users and the libraries
built on Horovod import from here (to ask which frameworks and transports
are built, whether a GPU is usable, or to split a list), answered for hvd,
which provides the torch framework only."""

import contextlib
import os

from hvd import _core

__all__ = ['extension_available', 'check_extension', 'gpu_available', 'mpi_built',
           'gloo_built', 'nccl_built', 'ddl_built', 'ccl_built', 'env', 'split_list',
           'num_rank_is_power_2', 'is_iterable']

_PROVIDED = 'torch'


def _base_name(ext_name):
    """'torch' from 'torch' or 'horovod.torch'."""
    if not isinstance(ext_name, str):
        raise ValueError('an extension is named by a str, not %r' % (ext_name,))
    return ext_name[len('horovod.'):] if ext_name.startswith('horovod.') else ext_name


def extension_available(ext_base_name, verbose=False):
    """True for torch, the one framework hvd provides; False otherwise."""
    available = _base_name(ext_base_name) == _PROVIDED
    if verbose:
        print('Extension %s was %sbuilt (hvd provides horovod.torch only).'
              % (ext_base_name, '' if available else 'NOT '))
    return available


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Raises ImportError unless ext_name is the torch framework."""
    if not extension_available(ext_name):
        raise ImportError('%s is not provided by hvd, whose horovod provides horovod.torch only'
                          % ext_name)


def gpu_available(ext_base_name, verbose=False):
    """Whether the framework can run collectives on a GPU here: torch, with
    an hvd built with CUDA and a GPU that torch sees."""
    if not extension_available(ext_base_name) or not _core.cuda_built():
        return False
    import torch
    return torch.cuda.is_available()


def mpi_built(verbose=False):
    return _core.mpi_built()


def gloo_built(verbose=False):
    return _core.gloo_built()


def nccl_built(verbose=False):
    return _core.nccl_built()


def ddl_built(verbose=False):
    return _core.ddl_built()


def ccl_built(verbose=False):
    return _core.ccl_built()


@contextlib.contextmanager
def env(**kwargs):
    """Sets environment variables (None values are left alone) for the
    duration of the block, then puts back what was there."""
    changes = {k: v for k, v in kwargs.items() if v is not None}
    before = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def split_list(items, n):
    """n consecutive slices of items whose lengths differ by at most one,
    the longer ones first."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError('split_list: n must be an int >= 1, not %r' % (n,))
    q, r = divmod(len(items), n)
    bounds = [i * q + min(i, r) for i in range(n + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(n)]


def num_rank_is_power_2(num_rank):
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True
