# Run WITHOUT hvdrun: /usr/bin/python3 -m pytest tests/python/test_launchers.py
# (it starts its own jobs; HVD_BIN_DIR names the build's bin directory).
"""hvd.init() under the launchers clusters already run, with no hvdrun: the
variables torchrun sets (also with torch's own process group in the same
script), those of a Kubernetes Indexed Job, and clear errors for bad ones.
Slurm's real cluster is tests/slurm/."""

import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get('HVD_BIN_DIR', os.path.join(REPO, 'build', 'bin'))
PYTHON = '/usr/bin/python3'
TORCHRUN = os.path.join(REPO, 'tests', 'python', 'torchrun.py')
TIMEOUT_S = 150

# Runs on every rank: both process groups, one allreduce each.
TORCH_AND_HVD = '''
import torch, torch.distributed as dist
import hvd.torch as hvd
dist.init_process_group('gloo')
hvd.init()
assert (hvd.rank(), hvd.size()) == (dist.get_rank(), dist.get_world_size())
assert (hvd.local_rank(), hvd.local_size()) == (int(__import__('os').environ['LOCAL_RANK']),
                                                 dist.get_world_size())
t = torch.tensor([float(hvd.rank() + 1)])
a = hvd.allreduce(t, op=hvd.Sum)
b = t.clone()
dist.all_reduce(b)
n = hvd.size()
assert a.item() == b.item() == n * (n + 1) / 2, (a, b)
print('rank %d: hvd and torch agree' % hvd.rank(), flush=True)
dist.destroy_process_group()
'''

# An Indexed Job's pod: its rank is its index.
POD = '''
import os, torch
import hvd.torch as hvd
hvd.init()
assert hvd.rank() == int(os.environ['JOB_COMPLETION_INDEX']), hvd.rank()
assert hvd.size() == int(os.environ['HOROVOD_SIZE'])
out = hvd.allgather(torch.tensor([hvd.rank()]))
assert out.tolist() == list(range(hvd.size())), out
print('pod %d of %d' % (hvd.rank(), hvd.size()), flush=True)
'''


def _package_dir():
    built = os.path.normpath(os.path.join(BIN_DIR, '..', 'lib', 'hvd', 'python'))
    return built if os.path.isdir(os.path.join(built, 'hvd')) else os.path.join(REPO, 'python')


def _env(**extra):
    """The environment of a job started here: hvd's package, none of the
    variables of an outer launcher (a test run under Slurm or torchrun)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('SLURM_', 'HOROVOD_', 'HVD_')) and
           k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR',
                     'MASTER_PORT', 'GROUP_RANK', 'GROUP_WORLD_SIZE', 'JOB_COMPLETION_INDEX',
                     'TORCHELASTIC_RUN_ID', 'TORCHELASTIC_RESTART_COUNT')}
    env['PYTHONPATH'] = _package_dir()
    env['HOROVOD_GLOO_TIMEOUT_SECONDS'] = '30'
    env.update(extra)
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _torchrun(args, **extra):
    return subprocess.run([PYTHON, TORCHRUN] + args, cwd=REPO, env=_env(**extra),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=TIMEOUT_S)


def test_torchrun_trains_digits():
    """The README's example under torchrun, unchanged: it fails by itself
    below 95% test accuracy or when the ranks' parameters differ."""
    r = _torchrun(['--standalone', '--nproc_per_node', '2',
                   os.path.join(REPO, 'examples', 'pytorch', 'train_digits.py')])
    assert r.returncode == 0, r.stdout
    assert 'parameters identical on 2 ranks' in r.stdout, r.stdout
    assert 'launcher: torchrun (' in r.stdout, r.stdout  # rank 0's line


def test_torchrun_with_torch_process_group(tmp_path):
    script = tmp_path / 'both.py'
    script.write_text(TORCH_AND_HVD)
    r = _torchrun(['--standalone', '--nproc_per_node', '3', str(script)])
    assert r.returncode == 0, r.stdout
    for rank in range(3):
        assert 'rank %d: hvd and torch agree' % rank in r.stdout, r.stdout


def _pods(size, code, **extra):
    port = _free_port()
    procs = [subprocess.Popen([PYTHON, '-c', code], cwd=REPO,
                              env=_env(JOB_COMPLETION_INDEX=str(i), HOROVOD_SIZE=str(size),
                                       HOROVOD_GLOO_RENDEZVOUS_ADDR='127.0.0.1',
                                       HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), **extra),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)
             for i in range(size)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return [p.returncode for p in procs], outs


def test_indexed_job_pods():
    """Pods of an Indexed Job, as processes: index 0 hosts the store, the
    token comes from the manifest's Secret (HVD_TOKEN)."""
    codes, outs = _pods(3, POD, HVD_TOKEN='k8s-secret-token')
    assert codes == [0, 0, 0], outs
    for i in range(3):
        assert 'pod %d of 3' % i in outs[i], outs[i]
    assert 'launcher: k8s (JOB_COMPLETION_INDEX=0 is set' in outs[0], outs[0]


def test_indexed_job_without_size_names_it():
    r = subprocess.run([PYTHON, '-c', 'import hvd.torch as hvd\nhvd.init()\n'], cwd=REPO,
                       env=_env(JOB_COMPLETION_INDEX='2'), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=TIMEOUT_S)
    assert r.returncode != 0
    assert 'HOROVOD_SIZE is not set: the manifest sets it' in r.stdout, r.stdout


@pytest.mark.parametrize('var,value,says', [
    ('RANK', 'x', "RANK='x' is not an integer"),
    ('WORLD_SIZE', '0', "WORLD_SIZE='0' is not an integer in 1 to"),
    ('HVD_LAUNCHER', 'mpi', "HVD_LAUNCHER='mpi' is not one of"),
])
def test_bad_launcher_variables_are_named(var, value, says):
    env = _env(RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
               MASTER_PORT=str(_free_port()))
    env[var] = value
    r = subprocess.run([PYTHON, '-c', 'import hvd.torch as hvd\nhvd.init()\n'], cwd=REPO, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=TIMEOUT_S)
    assert r.returncode != 0
    assert says in r.stdout, r.stdout
