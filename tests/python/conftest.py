"""What hvd's Python test files share: every process joins its job once,
before collection (tests/python/run.sh starts one pytest per rank under
hvdrun; a process without hvdrun's environment is a job of one rank), and
the `rank`, `size` and `shared_dir` fixtures.

The rule every test here follows: every rank collects and runs the same
tests in the same order, and makes the same collective calls in each. A
test that skips, or stops early, on some ranks only leaves the others
waiting in a collective. So skip only on what every rank sees alike (the
size, the build), and issue a test's collectives before asserting on
their results. Collection is checked here: ranks that collected different
tests stop at once instead of hanging.
"""

import hashlib
import os
import shutil
import tempfile

import pytest
import torch

import hvd.torch as hvd


def pytest_configure(config):
    # Before collection, so that test modules may use hvd.size() at import.
    hvd.init()


# What the file's tests did on this rank, for pytest_sessionfinish.
_outcomes = {'passed': 0, 'skipped': 0}


def pytest_runtest_logreport(report):
    if report.skipped:
        _outcomes['skipped'] += 1
    elif report.when == 'call' and report.passed:
        _outcomes['passed'] += 1


def pytest_sessionfinish(session, exitstatus):
    """A file whose every test was skipped (no GPU, say) ran nothing: it
    exits 77, which ctest reports as skipped, as the C suites do, instead
    of passing."""
    if exitstatus == 0 and _outcomes['passed'] == 0 and _outcomes['skipped'] > 0:
        session.exitstatus = 77


def pytest_unconfigure(config):
    # Pending operations of the other ranks fail at once rather than waiting.
    hvd.shutdown()


def pytest_collection_modifyitems(session, config, items):
    if hvd.size() == 1:
        return
    digest = hashlib.sha256('\n'.join(item.nodeid for item in items).encode()).digest()
    mine = torch.tensor(list(digest), dtype=torch.uint8)
    every = hvd.allgather(mine.reshape(1, -1), name='conftest.collected')
    differ = [r for r in range(hvd.size()) if not torch.equal(every[r], mine)]
    if differ:
        raise pytest.UsageError('rank %d collected other tests than rank(s) %s: every rank must '
                                'collect the same tests in the same order'
                                % (hvd.rank(), differ))


@pytest.fixture(autouse=True)
def _hvd_initialized():
    """hvd is initialized in every test, also after one that shut it down
    and failed before initializing it again (init is a no-op otherwise)."""
    hvd.init()


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()


def _broadcast_str(text, name):
    """rank 0's text on every rank."""
    data = torch.zeros(4096, dtype=torch.uint8)
    if hvd.rank() == 0:
        raw = text.encode()
        assert len(raw) <= data.numel(), text
        data[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    data = hvd.broadcast(data, 0, name=name)
    return bytes(data.tolist()).rstrip(b'\0').decode()


@pytest.fixture(scope='session')
def shared_dir(request):
    """A directory every rank of the job sees (they run on this host),
    made by rank 0 and removed once every rank is done with it."""
    path = _broadcast_str(tempfile.mkdtemp(prefix='hvd-pytest-') if hvd.rank() == 0 else '',
                          'conftest.shared_dir')
    assert os.path.isdir(path), path
    yield path
    # After a failure (-x) the other ranks may be elsewhere: no collective.
    # An allreduce, not a barrier, which is also safe after join rounds.
    if request.session.testsfailed == 0:
        hvd.allreduce(torch.zeros(1), name='conftest.shared_dir_done')
    if hvd.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
