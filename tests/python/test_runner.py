# Run WITHOUT hvdrun: /usr/bin/python3 -m pytest tests/python/test_runner.py
# (it starts its own jobs; HVD_BIN_DIR names the build's bin directory,
# <repo>/build/bin by default).
"""horovod.run in the compatibility tree (a function run on the ranks of
a job of hvdrun, their return values back in rank order, a rank's
exception raised in the caller as Horovod's RuntimeError, naming the rank)
and the `horovodrun` command that `hvdrun --horovod-compat` gives its
ranks. Each case runs a small caller script, as a user's script calls
horovod.run."""

import os
import shutil
import subprocess
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get('HVD_BIN_DIR', os.path.join(REPO, 'build', 'bin'))
HVDRUN = os.path.join(BIN_DIR, 'hvdrun')
PYTHON = '/usr/bin/python3'
TIMEOUT_S = 120


def _package_dir():
    """The build's hvd package directory, as hvdrun finds it (else the source's)."""
    built = os.path.normpath(os.path.join(BIN_DIR, '..', 'lib', 'hvd', 'python'))
    return built if os.path.isdir(os.path.join(built, 'hvd')) else os.path.join(REPO, 'python')


def _env(**extra):
    """This process's environment with the compat tree on PYTHONPATH, as a
    script that imports horovod has it; no job's variables."""
    package_dir = _package_dir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(package_dir, 'compat'),
                                                       package_dir]))
    for name in list(env):
        if name.startswith('HOROVOD_') or name in ('HVD_HVDRUN', 'HVD_TOKEN'):
            del env[name]
    env.update(extra)
    return env


def _explain(result):
    return 'exit %d\nstdout:\n%s\nstderr:\n%s' % (result.returncode, result.stdout, result.stderr)


def _succeeded(result, *lines):
    """The process exited 0 and printed each of lines (whole) on stdout."""
    assert result.returncode == 0, _explain(result)
    for line in lines:
        assert line + '\n' in result.stdout, 'no line %r\n%s' % (line, _explain(result))


def _run(argv, env, cwd=REPO):
    return subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=TIMEOUT_S)


def _script(tmp_path, code, env=None):
    """Runs code as the script caller.py in tmp_path (its directory first
    on its sys.path, as for any script), from the repository's root."""
    path = tmp_path / 'caller.py'
    path.write_text(textwrap.dedent(code))
    return _run([PYTHON, str(path)], env if env is not None else _env())


@pytest.fixture(scope='module', autouse=True)
def built():
    if not os.access(HVDRUN, os.X_OK):
        pytest.fail('no hvdrun at %s: build hvd or set HVD_BIN_DIR' % HVDRUN)


def test_values_come_back_in_rank_order(tmp_path):
    # The function is __main__'s (pickled by value); what it imports from
    # beside the script resolves on the ranks as in the caller.
    (tmp_path / 'beside.py').write_text('OFFSET = 100\n')
    result = _script(tmp_path, '''
        import os
        import horovod
        from beside import OFFSET

        def where(scale, plus=0):
            import beside
            return (int(os.environ['HOROVOD_RANK']) * scale + plus + beside.OFFSET,
                    int(os.environ['HOROVOD_SIZE']))

        print('values', horovod.run(where, args=(10,), kwargs={'plus': 1}, num_proc=3))
        print('lambda', horovod.run(lambda: [OFFSET] * 2))
        ''')
    _succeeded(result, 'values [(101, 3), (111, 3), (121, 3)]', 'lambda [[100, 100]]')


def test_ranks_run_collectives_through_horovod_torch(tmp_path):
    result = _script(tmp_path, '''
        import horovod

        def total():
            import torch
            import horovod.torch as hvd
            hvd.init()
            value = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
            hvd.shutdown()
            return value

        print('totals', horovod.run(total, num_proc=2))
        ''')
    _succeeded(result, 'totals [3.0, 3.0]')
    # the ranks' output comes through this process's, prefixed by hvdrun
    assert '[0]<stderr>:horovod.torch provided by hvd' in result.stderr, _explain(result)


def test_a_ranks_exception_is_runtime_error_naming_it(tmp_path):
    result = _script(tmp_path, '''
        import os
        import time
        import horovod

        def fails_on_1():
            if os.environ['HOROVOD_RANK'] == '1':
                raise KeyError('no such key')
            time.sleep(60)  # stopped with the job

        try:
            horovod.run(fails_on_1, num_proc=3)
        except RuntimeError as e:
            print('first:', str(e).splitlines()[0])
            print('cause:', repr(e.__cause__))
            print('traceback shown:', 'in fails_on_1' in str(e))
        ''')
    _succeeded(result, "first: horovod.run: rank 1 raised KeyError: 'no such key'",
               "cause: KeyError('no such key')", 'traceback shown: True')
    assert '[1]<stderr>:KeyError:' in result.stderr, _explain(result)


def test_a_rank_that_ends_without_returning(tmp_path):
    result = _script(tmp_path, '''
        import os
        import horovod

        def leaves(code):
            if os.environ['HOROVOD_RANK'] == '0':
                os._exit(code)
            return 'fine'

        for code in (3, 0):
            try:
                horovod.run(leaves, args=(code,), num_proc=2)
            except RuntimeError as e:
                print('RuntimeError:', e)
        ''')
    _succeeded(result, 'RuntimeError: horovod.run: rank 0 exited without a result (its function '
               'did not return)')
    assert ('RuntimeError: horovod.run: the job failed: hvdrun exited with code 3 (rank 0 on '
            'host localhost exited with code 3') in result.stdout, _explain(result)


def test_arguments_hvd_does_not_take_raise_value_error(tmp_path):
    # No job starts for any of these.
    result = _script(tmp_path, '''
        import warnings
        import horovod

        cases = [dict(min_num_proc=1), dict(max_np=4, slots=2), dict(use_mpi=True),
                 dict(hosts='hvd-not-this-host.invalid:2'), dict(num_proc=0),
                 dict(hosts='localhost:1', hostfile='hosts.txt'), dict(start_timeout=0)]
        for case in cases:
            try:
                horovod.run(print, **case)
                print('ran', case)
            except ValueError as e:
                print('ValueError:', e)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter('always')
            print('np', horovod.run(len, args=('ab',), np=2))
        print('warned', [(w.category.__name__, str(w.message)) for w in seen])
        ''')
    _succeeded(result, 'np [2, 2]', "warned [('DeprecationWarning', 'np is deprecated, use "
               "num_proc instead')]")
    out = result.stdout
    assert 'ran' not in out.replace('warned', ''), _explain(result)
    for says in ['starts no elastic jobs (min_num_proc given)',
                 'starts no elastic jobs (max_num_proc, slots given)',
                 'use_mpi=True, but hvd has no MPI',
                 'runs on this host only, and hvd-not-this-host.invalid is not',
                 'num_proc=0 is not a number of processes',
                 'give hosts or hostfile, not both',
                 'start_timeout=0 is not a number of seconds']:
        assert 'ValueError: horovod.run' in out and says in out, says + '\n' + _explain(result)


def test_hvdrun_options_and_environment(tmp_path):
    # This host by name, the environment given, hvdrun's flags; the
    # HVD_HVDRUN named is the one started.
    (tmp_path / 'hosts.txt').write_text('# this host\nlocalhost slots=2\n')
    wrapper = tmp_path / 'my-hvdrun'
    wrapper.write_text('#!/bin/sh\necho "wrapper ran: $*" >&2\nexec %s "$@"\n' % HVDRUN)
    wrapper.chmod(0o755)
    code = '''
        import os
        import sys
        import horovod

        def seen():
            return (os.environ.get('RUNNER_TEST'), os.environ['HOROVOD_LOCAL_SIZE'],
                    os.environ.get('HOROVOD_GLOO_IFACE'), os.environ['HVD_HOROVOD_COMPAT'],
                    sys.executable)

        env = dict(os.environ, RUNNER_TEST='given')
        print('hosts', horovod.run(seen, hosts='localhost:2', num_proc=2, env=env,
                                   network_interface=['lo'], start_timeout=30, use_gloo=True,
                                   verbose=True, disable_cache=True))
        print('hostfile', horovod.run(seen, hostfile=%r, num_proc=1,
                                      executable=%r))
        ''' % (str(tmp_path / 'hosts.txt'), PYTHON)
    result = _script(tmp_path, code, _env(HVD_HVDRUN=str(wrapper)))
    _succeeded(result, "hosts [('given', '2', 'lo', '1', '%s'), ('given', '2', 'lo', '1', '%s')]"
               % (PYTHON, PYTHON), "hostfile [(None, '1', None, '1', '%s')]" % PYTHON)
    assert result.stderr.count('wrapper ran: --horovod-compat -np ') == 2, _explain(result)
    assert ('-H localhost:2 --start-timeout 30 --network-interfaces lo --disable-cache '
            '--verbose --gloo -- ') in result.stderr, _explain(result)
    assert 'hvdrun: the ranks\' PATH starts with' in result.stderr, _explain(result)  # --verbose


def test_hvdrun_found_beside_the_library(tmp_path):
    # No HVD_HVDRUN, and a PATH without hvdrun: the build's, beside libhvd.
    env = _env(PATH='/usr/bin:/bin')
    result = _script(tmp_path, '''
        import horovod
        import os
        from horovod.runner import _hvdrun
        print('hvdrun', os.path.realpath(_hvdrun()))
        print('ran', horovod.run(abs, args=(-4,)))
        ''', env)
    _succeeded(result, 'hvdrun %s' % os.path.realpath(HVDRUN), 'ran [4]')


def test_a_rank_starts_horovodrun_and_horovod_run():
    # A Horovod script that starts horovodrun itself, and one that calls
    # horovod.run, inside a job of hvdrun --horovod-compat: both get this
    # hvdrun (HVD_HVDRUN), with the compat tree for the ranks they start.
    inner = ('import horovod.torch as hvd; hvd.init(); '
             'print("inner", hvd.rank(), hvd.size(), flush=True); hvd.shutdown()')
    script = ('command -v horovodrun && horovodrun --version && '
              'horovodrun -np 2 %s -c %s && '
              '%s -c "import horovod; print(\'run\', horovod.run(sum, args=([1, 2],), '
              'num_proc=2))"' % (PYTHON, _quote(inner), PYTHON))
    result = _run([HVDRUN, '-np', '1', '--horovod-compat', 'sh', '-c', script], _env())
    bin_dir = os.path.join(os.path.realpath(_package_dir()), 'compat', 'bin')
    version = _run([HVDRUN, '--version'], _env()).stdout.strip()
    _succeeded(result, '[0]<stdout>:%s/horovodrun' % bin_dir, '[0]<stdout>:%s' % version,
               '[0]<stdout>:[0]<stdout>:inner 0 2', '[0]<stdout>:[1]<stdout>:inner 1 2',
               '[0]<stdout>:run [3, 3]')


def test_no_horovodrun_without_the_flag():
    if shutil.which('horovodrun') is not None:
        pytest.skip('a horovodrun is installed on this PATH: %s' % shutil.which('horovodrun'))
    result = _run([HVDRUN, '-np', '1', 'sh', '-c',
                   'command -v horovodrun || echo "none ${HVD_HVDRUN-unset}"'], _env())
    _succeeded(result, '[0]<stdout>:none unset')


def _quote(text):
    return "'" + text.replace("'", "'\\''") + "'"
