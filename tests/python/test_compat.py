# Run WITHOUT hvdrun: /usr/bin/python3 -m pytest tests/python/test_compat.py
# (it starts its own jobs; HVD_BIN_DIR names the build's bin directory,
# <repo>/build/bin by default).
"""The `horovod` compatibility tree: a Horovod script runs unchanged under
`hvdrun --horovod-compat`, and only there; horovod.torch is hvd.torch
itself; the frameworks hvd does not provide fail to import, naming hvd."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get('HVD_BIN_DIR', os.path.join(REPO, 'build', 'bin'))
HVDRUN = os.path.join(BIN_DIR, 'hvdrun')
PYTHON = '/usr/bin/python3'
SCRIPT = os.path.join(REPO, 'tests', 'python', 'horovod_style_script.py')
TIMEOUT_S = 120

BANNER = re.compile(r'^\[0\]<stderr>:horovod\.torch provided by hvd (\S+) \((/\S+)\)$')


def _run(argv, env=None):
    return subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=TIMEOUT_S)


def _package_dir():
    """The build's hvd package directory, as hvdrun finds it (else the source's)."""
    built = os.path.normpath(os.path.join(BIN_DIR, '..', 'lib', 'hvd', 'python'))
    return built if os.path.isdir(os.path.join(built, 'hvd')) else os.path.join(REPO, 'python')


def _python_with_compat(code):
    """`python3 -c code` with the path hvdrun --horovod-compat gives a rank."""
    package_dir = _package_dir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(package_dir, 'compat'),
                                                       package_dir]))
    env.pop('HOROVOD_RANK', None)
    return _run([PYTHON, '-c', code], env=env)


def _explain(result):
    return 'exit %d\nstdout:\n%s\nstderr:\n%s' % (result.returncode, result.stdout, result.stderr)


@pytest.fixture(scope='module')
def compat_job():
    if not os.access(HVDRUN, os.X_OK):
        pytest.fail('no hvdrun at %s: build hvd or set HVD_BIN_DIR' % HVDRUN)
    return _run([HVDRUN, '-np', '2', '--horovod-compat', PYTHON, SCRIPT])


def test_horovod_script_runs_unchanged(compat_job):
    assert compat_job.returncode == 0, _explain(compat_job)
    finals = [line for line in compat_job.stdout.splitlines() if 'final:' in line]
    assert len(finals) == 1 and finals[0].startswith('[0]<stdout>:final: horovod 0.28.1+hvd.'), \
        _explain(compat_job)


def test_provided_by_hvd_line_once_on_rank_0(compat_job):
    lines = [line for line in compat_job.stderr.splitlines() if 'provided by hvd' in line]
    assert len(lines) == 1, _explain(compat_job)
    match = BANNER.match(lines[0])
    assert match, 'unexpected line %r' % lines[0]
    version, library = match.groups()
    assert os.path.basename(library).startswith('libhvd.so') and os.path.exists(library)
    assert ('+hvd.%s,' % version) in compat_job.stdout  # the same hvd as horovod.__version__'s


def test_horovod_is_not_importable_without_the_flag():
    if importlib.util.find_spec('horovod') is not None:
        pytest.skip('a real horovod is installed for %s' % sys.executable)
    result = _run([HVDRUN, '-np', '1', PYTHON, '-c', 'import horovod'])
    assert result.returncode != 0
    assert "No module named 'horovod'" in result.stdout + result.stderr, _explain(result)


@pytest.mark.parametrize('module', ['horovod.tensorflow', 'horovod.tensorflow.keras',
                                    'horovod.keras', 'horovod.mxnet', 'horovod.spark',
                                    'horovod.ray'])
def test_other_frameworks_raise_import_error_naming_hvd(module):
    result = _python_with_compat(
        'try:\n'
        '    import %s\n'
        'except ImportError as e:\n'
        '    print("ImportError:", e)\n' % module)
    assert result.returncode == 0, _explain(result)
    assert 'ImportError:' in result.stdout, _explain(result)
    assert "hvd" in result.stdout and 'only horovod.torch' in result.stdout, _explain(result)


def test_horovod_torch_is_hvd_torch():
    result = _python_with_compat(
        'import hvd.torch, hvd.exceptions\n'
        'import horovod.torch\n'
        'import horovod.torch.elastic\n'
        'from horovod.common.exceptions import HorovodInternalError\n'
        'assert horovod.torch.allreduce is hvd.torch.allreduce\n'
        'assert horovod.torch.DistributedOptimizer is hvd.torch.DistributedOptimizer\n'
        'assert horovod.torch.SyncBatchNorm is hvd.torch.SyncBatchNorm\n'
        'assert all(getattr(horovod.torch, n) is getattr(hvd.torch, n)\n'
        '           for n in hvd.torch.__all__ if n != "elastic")\n'
        'assert horovod.torch.elastic.run is hvd.torch.elastic.run\n'
        'assert horovod.torch.elastic.TorchState is hvd.torch.elastic.TorchState\n'
        'assert HorovodInternalError is hvd.exceptions.HorovodInternalError\n'
        'from horovod.torch.mpi_ops import allreduce_async_\n'
        'assert allreduce_async_ is hvd.torch.allreduce_async_\n'
        'print("same objects")\n')
    assert result.returncode == 0 and 'same objects' in result.stdout, _explain(result)
    # a process on its own is rank 0: the line, once
    assert result.stderr.count('provided by hvd') == 1, _explain(result)


def test_in_thread_runs_the_target():
    result = _python_with_compat(
        'from horovod.runner.util.threads import in_thread\n'
        'seen = []\n'
        't = in_thread(seen.append, args=(7,))\n'
        't.join()\n'
        'assert t.daemon and seen == [7]\n'
        'in_thread(lambda: 1 / 0, silent=True).join()\n'
        'try:\n'
        '    in_thread(print, args=7)\n'
        'except ValueError:\n'
        '    print("in_thread ok")\n')
    assert result.returncode == 0 and 'in_thread ok' in result.stdout, _explain(result)
    assert 'ZeroDivisionError' not in result.stderr, _explain(result)


def test_common_util_answers_for_hvd():
    result = _python_with_compat(
        'import os\n'
        'import hvd.torch\n'
        'from horovod.common.util import (check_extension, env, extension_available,\n'
        '                                 gloo_built, gpu_available, mpi_built, nccl_built,\n'
        '                                 split_list)\n'
        'assert extension_available("torch") and not extension_available("tensorflow")\n'
        'check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", "x.py", "torch", "mpi_lib")\n'
        'try:\n'
        '    check_extension("horovod.mxnet", "HOROVOD_WITH_MXNET", "x.py", "mxnet", "x")\n'
        '    raise SystemExit("mxnet passed")\n'
        'except ImportError:\n'
        '    pass\n'
        'assert gloo_built() and not mpi_built()\n'
        'assert nccl_built() == hvd.torch.nccl_built()\n'
        'assert gpu_available("tensorflow") is False\n'
        'assert split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]\n'
        'with env(HVD_COMPAT_T="1", HVD_COMPAT_NONE=None):\n'
        '    assert os.environ["HVD_COMPAT_T"] == "1" and "HVD_COMPAT_NONE" not in os.environ\n'
        'assert "HVD_COMPAT_T" not in os.environ\n'
        'print("util ok")\n')
    assert result.returncode == 0 and 'util ok' in result.stdout, _explain(result)
