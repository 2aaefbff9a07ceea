"""horovod.runner: Horovod's launcher API on hvd. horovod.run(func, ...)
runs func on num_proc ranks of this host and returns the ranks' return
values, in rank order.

DESIGN. The function, its arguments and this process's first sys.path
entry are pickled (cloudpickle, as Horovod does) into a private temporary
directory; `hvdrun --horovod-compat -H localhost:N` starts
`python3 _task.py DIR` on every rank, which loads and calls the function
and leaves result.<rank> or error.<rank> there (_task.py). The job's
output passes through this process's sys.stdout and sys.stderr, prefixed
by hvdrun as horovodrun prefixes it. A rank that raised makes run() raise
RuntimeError, Horovod's class for a failed job, naming the rank, with the
rank's exception as its cause. Every rank reads and writes the directory,
so the hosts must all be this one: remote hosts, and elastic jobs, are
refused with ValueError (start those with hvdrun).
"""

import codecs
import ipaddress
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import warnings

__all__ = ['run']

_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), '_task.py')

# Horovod's arguments hvd cannot honour here (elastic jobs need hvdrun's
# --host-discovery-script or -H over several hosts).
_ELASTIC = ('min_num_proc', 'max_num_proc', 'slots', 'reset_limit', 'cooldown_range')


def _hvdrun():
    """HVD_HVDRUN, else the hvdrun beside the library this process loaded,
    else PATH's."""
    given = os.environ.get('HVD_HVDRUN')
    if given:
        return given
    from horovod import _library_path
    libdir = os.path.dirname(_library_path())
    tried = [os.path.normpath(os.path.join(libdir, up, 'bin', 'hvdrun'))
             for up in ('..', os.path.join('..', '..'))]
    for path in tried:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which('hvdrun')
    if found is None:
        raise RuntimeError('horovod.run: no hvdrun at %s or on PATH; set HVD_HVDRUN to hvd\'s '
                           'hvdrun' % ' or '.join(tried))
    return found


def _is_this_host(name):
    """localhost, this host's name, or a name of one of its addresses."""
    if name in ('localhost', socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False
    for address in addresses:
        if ipaddress.ip_address(address.split('%')[0]).is_loopback:
            return True
        family = socket.AF_INET6 if ':' in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.bind((address, 0))  # only an address of this host binds
                return True
            except OSError:
                pass
    return False


def _host_names(hosts, hostfile):
    """The host names of -H's text or the host file's lines."""
    if hosts is not None:
        return [entry.strip().rsplit(':', 1)[0] for entry in hosts.split(',') if entry.strip()]
    with open(hostfile) as f:
        lines = [line.split('#', 1)[0].split() for line in f]
    return [words[0] for words in lines if words]


def _check(num_proc, hosts, hostfile, start_timeout, given):
    """Horovod's arguments as hvd takes them; ValueError for the rest."""
    elastic = [name for name in _ELASTIC if given[name] is not None]
    if elastic:
        raise ValueError('horovod.run under hvd starts no elastic jobs (%s given); start them '
                         'with hvdrun --min-np ... --host-discovery-script ...'
                         % ', '.join(elastic))
    if given['use_mpi']:
        raise ValueError('horovod.run: use_mpi=True, but hvd has no MPI; leave use_mpi out '
                         '(hvd is always Horovod\'s Gloo path)')
    if not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1:
        raise ValueError('horovod.run: num_proc=%r is not a number of processes (an int >= 1)'
                         % (num_proc,))
    if start_timeout is not None and (not isinstance(start_timeout, int) or start_timeout < 1):
        raise ValueError('horovod.run: start_timeout=%r is not a number of seconds (an int >= 1)'
                         % (start_timeout,))
    if hosts is not None and hostfile is not None:
        raise ValueError('horovod.run: give hosts or hostfile, not both')
    if hosts is None and hostfile is None:
        return
    remote = [name for name in _host_names(hosts, hostfile) if not _is_this_host(name)]
    if remote:
        raise ValueError('horovod.run under hvd runs on this host only, and %s %s not; start '
                         'jobs over several hosts with hvdrun -H'
                         % (', '.join(remote), 'is' if len(remote) == 1 else 'are'))


def _hvdrun_argv(num_proc, hosts, hostfile, options, executable, directory):
    """hvdrun's command line for the job."""
    argv = [_hvdrun(), '--horovod-compat', '-np', str(num_proc)]
    if hostfile is not None:
        argv += ['--hostfile', hostfile]
    else:  # never a Slurm allocation's hosts: the ranks share the directory
        argv += ['-H', hosts if hosts is not None else 'localhost:%d' % num_proc]
    flags = (('start_timeout', '--start-timeout'), ('ssh_port', '-p'),
             ('ssh_identity_file', '-i'), ('output_filename', '--output-filename'),
             ('network_interface', '--network-interfaces'))
    for name, flag in flags:
        value = options[name]
        if value is not None:
            if name == 'network_interface' and not isinstance(value, str):
                value = ','.join(value)
            argv += [flag, str(value)]
    switches = (('disable_cache', '--disable-cache'), ('verbose', '--verbose'),
                ('use_gloo', '--gloo'))
    argv += [flag for name, flag in switches if options[name]]
    return argv + ['--', executable or sys.executable, _TASK, directory]


def _forward(pipe, out, own_lines):
    """Copies the job's output stream to out (this process's stream) as it
    comes; keeps hvdrun's own lines ('hvdrun: ...') for messages. It reads
    to the end whatever happens to out, so that hvdrun never blocks."""
    decoder = codecs.getincrementaldecoder('utf-8')(errors='replace')
    partial = ''
    while True:
        chunk = os.read(pipe.fileno(), 65536)
        text = decoder.decode(chunk, final=not chunk)
        if out is not None and text:
            try:
                out.write(text)
                out.flush()
            except (OSError, ValueError):  # closed, or text it cannot encode
                out = None
        partial += text
        *lines, partial = partial.split('\n')
        own_lines.extend(line for line in lines if line.startswith('hvdrun: '))
        if not chunk:
            return


def _start(argv, env):
    """Runs hvdrun to its end, its output forwarded; returns its exit code
    and its own lines. An interrupt here stops the job first."""
    own_lines = []
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    threads = [threading.Thread(target=_forward, args=(pipe, out, own_lines), daemon=True)
               for pipe, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
    for thread in threads:
        thread.start()
    try:
        code = proc.wait()
    except BaseException:
        proc.terminate()  # hvdrun stops its ranks, then exits
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        for thread in threads:
            thread.join()
        proc.stdout.close()
        proc.stderr.close()
    return code, own_lines


def _rank_error(directory, names):
    """RuntimeError for the first rank that raised, with its exception as
    the cause where it unpickles."""
    import cloudpickle

    def written(name):
        return os.stat(os.path.join(directory, name)).st_mtime_ns, int(name.split('.')[1])

    first = min(names, key=written)
    rank = written(first)[1]
    with open(os.path.join(directory, first), 'rb') as f:
        record = pickle.load(f)
    cause = None
    if record['exception'] is not None:
        try:
            cause = cloudpickle.loads(record['exception'])
        except Exception:  # its class is not importable here
            cause = None
    error = RuntimeError('horovod.run: rank %d raised %s: %s\n\nRank %d\'s traceback:\n%s'
                         % (rank, record['type'], record['message'], rank,
                            record['traceback'].rstrip('\n')))
    error.__cause__ = cause
    error.__suppress_context__ = True
    return error


def _results(directory, num_proc, code, own_lines):
    """The ranks' return values, or the job's failure as an exception."""
    import cloudpickle

    names = os.listdir(directory)
    errors = [name for name in names if name.startswith('error.') and not name.endswith('.part')]
    if errors:
        return _rank_error(directory, errors)
    why = own_lines[-1][len('hvdrun: '):] if own_lines else 'see its output above'
    if code != 0:
        return RuntimeError('horovod.run: the job failed: hvdrun exited with code %d (%s)'
                            % (code, why))
    results = []
    for rank in range(num_proc):
        path = os.path.join(directory, 'result.%d' % rank)
        if not os.path.exists(path):
            return RuntimeError('horovod.run: rank %d exited without a result (its function did '
                                'not return)' % rank)
        with open(path, 'rb') as f:
            results.append(cloudpickle.load(f))
    return results


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None,
        output_filename=None, verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, executable=None, np=None, min_np=None, max_np=None, env=None):
    """Runs func(*args, **kwargs) on num_proc ranks of this host, through
    hvd's hvdrun, and returns the list of their return values by rank.

    Horovod's arguments, as Horovod's run takes them: np (deprecated for
    num_proc), hosts or hostfile (this host's names only: localhost:2),
    start_timeout, ssh_port, ssh_identity_file, disable_cache,
    output_filename, verbose, use_gloo (hvd's only path), network_interface
    (a comma list), executable (the ranks' Python; default sys.executable).
    mpi_args is ignored, as Horovod ignores it without MPI. env (hvd's
    addition) is the job's environment instead of this process's.
    ValueError: use_mpi=True, the elastic arguments (min_num_proc,
    max_num_proc, slots, reset_limit, cooldown_range), another host, or a
    bad value. RuntimeError: a rank raised (named, its exception the
    cause), or the job failed otherwise (hvdrun's reason).
    """
    del mpi_args  # Horovod uses it only with MPI, which hvd has not
    if np is not None:
        if num_proc == 1:
            num_proc = np
        warnings.warn('np is deprecated, use num_proc instead', DeprecationWarning)
    if min_np is not None:
        if min_num_proc is None:
            min_num_proc = min_np
        warnings.warn('min_np is deprecated, use min_num_proc instead', DeprecationWarning)
    if max_np is not None:
        if max_num_proc is None:
            max_num_proc = max_np
        warnings.warn('max_np is deprecated, use max_num_proc instead', DeprecationWarning)
    given = dict(min_num_proc=min_num_proc, max_num_proc=max_num_proc, slots=slots,
                 reset_limit=reset_limit, cooldown_range=cooldown_range, use_mpi=use_mpi)
    _check(num_proc, hosts, hostfile, start_timeout, given)
    try:
        import cloudpickle
    except ImportError as e:
        raise ImportError('horovod.run needs cloudpickle to send the function to the ranks '
                          '(Debian: python3-cloudpickle): %s' % e) from e
    options = dict(start_timeout=start_timeout, ssh_port=ssh_port,
                   ssh_identity_file=ssh_identity_file, output_filename=output_filename,
                   network_interface=network_interface, disable_cache=disable_cache,
                   verbose=verbose, use_gloo=use_gloo)
    caller_dir = os.path.abspath(sys.path[0] if sys.path and sys.path[0] else os.getcwd())
    blob = cloudpickle.dumps((func, tuple(args), dict(kwargs or {})))
    with tempfile.TemporaryDirectory(prefix='horovod-run-') as directory:
        with open(os.path.join(directory, 'func'), 'wb') as f:
            pickle.dump((caller_dir, blob), f)
        argv = _hvdrun_argv(num_proc, hosts, hostfile, options, executable, directory)
        code, own_lines = _start(argv, dict(os.environ) if env is None else dict(env))
        outcome = _results(directory, num_proc, code, own_lines)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
