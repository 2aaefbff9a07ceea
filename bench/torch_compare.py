"""Training throughput of hvd.torch.DistributedOptimizer against PyTorch's
DistributedDataParallel (gloo backend), and the cost of one small allreduce
from Python against the same from C. A benchmark: it asserts nothing about
timing (see docs/PERFORMANCE.md for how results are reported).

One script, two roles:

- the driver (the default) runs every configuration as subprocesses,
  interleaved (hvd, ddp, hvd, ddp, ... with the order flipped every
  repetition), and prints markdown tables of medians and hvd/ddp ratios,
  plus the exact commands it ran;
- the workers (--worker hvd|ddp|latency), which the driver starts under
  `hvdrun -np N` (hvd, latency) or `torchrun --nproc_per_node N` (ddp).

Both training workers train the same model (same seed, so the same initial
weights) on the same synthetic data (each rank its own, seeded by rank) with
the same SGD, for the same number of steps; warm-up steps are excluded, and
torch.set_num_threads(max(1, cores // np)) in both.

Models: `cnn`, compute-heavy (six 3x3 convolutions on 32x32 images, 0.8 M
parameters, batch 64: a step of 100+ ms on one core), and `mlp`,
communication-heavy (seven dense layers, 25.2 M parameters = 101 MB of
gradients per step, batch 2).

    /usr/bin/python3 bench/torch_compare.py                    # everything, 5 repetitions
    /usr/bin/python3 bench/torch_compare.py --nps 2 --models mlp --reps 3 --no-latency
    /usr/bin/python3 bench/torch_compare.py --hvd-env HOROVOD_CYCLE_TIME=0.2 ...
    build/bin/hvdrun -np 2 /usr/bin/python3 bench/torch_compare.py --worker hvd --model mlp \\
        --profile /tmp/hvd.prof                                  # cProfile of rank 0

Raw outputs of every run go to --out (default build/torch-compare/<UTC time>/).
Exit status: 0 when every run succeeded, 1 when one failed or timed out, 2 for
bad arguments.
"""

import argparse
import datetime
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_TAG = 'TORCH_COMPARE_RESULT '
SEED = 1234
LR = 0.01
MOMENTUM = 0.9
DISTINCT_BATCHES = 4  # per rank, cycled, so that data making stays out of the clock

# name -> (batch size per rank, input shape of one sample, classes)
MODELS = {
    'cnn': (64, (3, 32, 32), 10),
    'mlp': (2, (2048,), 10),
}
MLP_WIDTH, MLP_HIDDEN_LAYERS = 2048, 6


# ==== the models and the data (both workers) ======================================================

def build_model(name):
    import torch.nn as nn
    if name == 'cnn':
        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
        return nn.Sequential(
            *block(3, 32), *block(32, 32), nn.MaxPool2d(2),
            *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
            *block(64, 128), *block(128, 128), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10))
    if name == 'mlp':
        # Layers of 16 MB, not fewer wider ones: glibc maps every block over
        # 32 MB afresh, and faulting in a new 64 MB gradient each step costs
        # more on this VM than the allreduce the model is meant to stress.
        layers = []
        for _ in range(MLP_HIDDEN_LAYERS):
            layers += [nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(MLP_WIDTH, 10))
    raise ValueError('unknown model %r' % name)


def make_batches(name, rank, seed):
    """This rank's few synthetic (input, label) batches."""
    import torch
    batch, shape, classes = MODELS[name]
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    return [(torch.randn((batch,) + shape, generator=gen),
             torch.randint(0, classes, (batch,), generator=gen))
            for _ in range(DISTINCT_BATCHES)]


def threads_per_rank(np_):
    return max(1, (os.cpu_count() or 1) // np_)


# ==== training workers ============================================================================

class PhaseClock(object):
    """Per-step seconds of forward (and loss), backward, and optimizer step."""

    def __init__(self):
        self.phases = {'forward': [], 'backward': [], 'step': [], 'total': []}

    def record(self, t0, t1, t2, t3):
        self.phases['forward'].append(t1 - t0)
        self.phases['backward'].append(t2 - t1)
        self.phases['step'].append(t3 - t2)
        self.phases['total'].append(t3 - t0)

    def medians_ms(self):
        return {k: 1e3 * statistics.median(v) for k, v in self.phases.items() if v}


def thread_cpu_seconds():
    """CPU seconds (user + system) of this process's threads by thread name,
    the main thread as 'main', from /proc (Linux); {} elsewhere."""
    tick = os.sysconf('SC_CLK_TCK')
    pid = os.getpid()
    cpu = {}
    try:
        tids = os.listdir('/proc/self/task')
    except OSError:
        return cpu
    for tid in tids:
        try:
            with open('/proc/self/task/%s/stat' % tid) as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = 'main' if int(tid) == pid else stat[stat.index('(') + 1:stat.rindex(')')]
        fields = stat[stat.rindex(')') + 2:].split()
        cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return cpu


def cpu_ms_per_step(before, after, steps):
    """Per-step CPU milliseconds of the main thread and of all others."""
    main = after.get('main', 0.0) - before.get('main', 0.0)
    total = sum(after.values()) - sum(before.values())
    return {'main': 1e3 * main / steps, 'others': 1e3 * (total - main) / steps}


def run_steps(model, optimizer, batches, n, clock=None):
    import torch.nn.functional as F
    for i in range(n):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if clock is not None:
            clock.record(t0, t1, t2, t3)
    return loss.item()


def checksum(model):
    """A sum over every parameter: hvd and ddp, doing the same work, agree
    on it up to the order of floating-point sums."""
    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


def train_and_report(args, model, optimizer, rank, size, barrier, max_over_ranks):
    """Warm-up, then the timed steps between two barriers; rank 0 prints the
    result line the driver reads."""
    batches = make_batches(args.model, rank, args.seed)
    run_steps(model, optimizer, batches, args.warmup)
    clock = PhaseClock()
    barrier()
    cpu_before = thread_cpu_seconds()
    start = time.perf_counter()
    loss = run_steps(model, optimizer, batches, args.steps, clock)
    elapsed = time.perf_counter() - start
    cpu = cpu_ms_per_step(cpu_before, thread_cpu_seconds(), args.steps)
    elapsed = max_over_ranks(elapsed)
    batch = MODELS[args.model][0]
    if rank == 0:
        result = {'np': size, 'model': args.model, 'steps': args.steps, 'batch': batch,
                  'threads': threads_per_rank(size), 'seconds': elapsed,
                  'samples_per_s': size * batch * args.steps / elapsed,
                  'phase_ms': clock.medians_ms(), 'cpu_ms': cpu, 'loss': loss,
                  'checksum': checksum(model), 'params': sum(p.numel() for p in model.parameters())}
        print(RESULT_TAG + json.dumps(result), flush=True)


def maybe_profiled(args, rank, fn):
    """fn(), under cProfile on rank 0 when --profile is given."""
    if not args.profile or rank != 0:
        return fn()
    import cProfile
    profiler = cProfile.Profile()
    try:
        return profiler.runcall(fn)
    finally:
        profiler.dump_stats(args.profile)


def leave_within(seconds):
    """A rank still leaving after `seconds` prints its threads' stacks and
    exits 1 (a ddp rank hung once in gloo's teardown at np=4, after its
    result was out)."""
    import faulthandler
    faulthandler.dump_traceback_later(seconds, exit=True)


def worker_hvd(args):
    import torch
    import hvd.torch as hvd
    hvd.init()
    torch.set_num_threads(threads_per_rank(hvd.size()))
    torch.manual_seed(args.seed)
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def max_over_ranks(value):
        return hvd.allreduce(torch.tensor(value), op=hvd.Max, name='bench.elapsed').item()

    maybe_profiled(args, hvd.rank(), lambda: train_and_report(
        args, model, optimizer, hvd.rank(), hvd.size(), hvd.barrier, max_over_ranks))
    leave_within(args.comm_timeout)
    hvd.shutdown()


def worker_ddp(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=args.comm_timeout))
    torch.set_num_threads(threads_per_rank(dist.get_world_size()))
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(build_model(args.model))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def max_over_ranks(value):
        t = torch.tensor(value)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    maybe_profiled(args, dist.get_rank(), lambda: train_and_report(
        args, model, optimizer, dist.get_rank(), dist.get_world_size(), dist.barrier,
        max_over_ranks))
    leave_within(args.comm_timeout)
    dist.barrier()
    dist.destroy_process_group()


# ==== latency worker ==============================================================================

def per_op_us(op, iters, warmup):
    """Microseconds of each of iters calls of op(), after warmup calls."""
    for _ in range(warmup):
        op()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        op()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


def latency_cases(size_bytes):
    """name -> a function doing one float32 sum allreduce of size_bytes."""
    import ctypes
    import torch
    import hvd.torch as hvd
    from hvd import _lib
    n = size_bytes // 4
    tensor = torch.ones(n)
    name = 'bench.lat.%d' % size_bytes
    # The C call with nothing around it: the same struct every time, no torch.
    shape = (ctypes.c_int64 * 1)(n)
    out = torch.empty(n)
    c_tensor = _lib.Tensor(('allreduce.' + name).encode(), _lib.FLOAT32, 1, shape,
                           tensor.data_ptr(), out.data_ptr())
    c_options = _lib.Options(op=_lib.SUM)
    c_args = (ctypes.byref(c_tensor), ctypes.byref(c_options))

    def raw_ctypes(keep=(tensor, out, shape)):  # hvd writes into out: keep it alive
        if _lib.lib.hvd_allreduce(*c_args) != _lib.OK:
            raise RuntimeError('hvd_allreduce: ' + _lib.lib.hvd_last_error_message().decode())
    return {
        'torch_named': lambda: hvd.allreduce(tensor, name=name, op=hvd.Sum),
        'torch_unnamed': lambda: hvd.allreduce(tensor, op=hvd.Sum),
        'ctypes_blocking': raw_ctypes,
    }


def worker_latency(args):
    import torch
    import hvd.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    results = {}
    for size_bytes in args.sizes:
        cases = latency_cases(size_bytes)
        order = sorted(cases)
        for name in order[args.rotate % len(order):] + order[:args.rotate % len(order)]:
            hvd.barrier()
            times = per_op_us(cases[name], args.iters, args.warmup_ops)
            results['%s/%d' % (name, size_bytes)] = statistics.median(times)
    if hvd.rank() == 0:
        print(RESULT_TAG + json.dumps({'np': hvd.size(), 'median_us': results}), flush=True)
    leave_within(args.comm_timeout)
    hvd.shutdown()


# ==== torchrun ====================================================================================

def torchrun(argv):
    """torchrun with argv, with the fix Debian's torch 1.13 needs under
    Python 3.11 (tests/python/torchrun.py)."""
    sys.path.insert(0, os.path.join(REPO, 'tests', 'python'))
    import torchrun as fixed_torchrun
    fixed_torchrun.main(argv)


# ==== the driver ==================================================================================

def cpu_busy_fraction(seconds=1.0):
    """How busy the machine's CPUs were over the next `seconds` (0 to 1),
    from /proc/stat; None where that is not readable."""
    def sample():
        with open('/proc/stat') as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


class Runner(object):
    """Runs commands with a deadline, keeps their outputs in out_dir, and
    remembers each distinct command line for the report. Before each run it
    waits (at most idle_wait seconds) for the machine to be quiet: other
    work on a 2-core machine swamps the differences being measured."""

    def __init__(self, out_dir, timeout, idle_wait, idle_busy):
        self.out_dir = out_dir
        self.timeout = timeout
        self.idle_wait = idle_wait
        self.idle_busy = idle_busy
        self.commands = []
        self.failures = []
        self.count = 0
        self.busy = []  # the machine's busy fraction just before each run

    def note_load(self):
        deadline = time.monotonic() + self.idle_wait
        busy = cpu_busy_fraction()
        while busy is not None and busy > self.idle_busy and time.monotonic() < deadline:
            busy = cpu_busy_fraction()
        if busy is not None:
            self.busy.append(busy)

    def run(self, label, argv, env):
        self.count += 1
        base = os.path.join(self.out_dir, '%03d-%s' % (self.count, label))
        shown = ' '.join(['%s=%s' % (k, shlex.quote(v)) for k, v in sorted(env.items())] +
                         [shlex.quote(a) for a in argv])
        if shown not in self.commands:
            self.commands.append(shown)
        full_env = dict(os.environ, **env)
        self.note_load()
        print('torch_compare: %s: %s' % (label, shown), file=sys.stderr, flush=True)
        with open(base + '.out', 'w') as out, open(base + '.err', 'w') as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, env=full_env, cwd=REPO,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = 'timeout after %d s' % self.timeout
        result = self._result(base + '.out')
        if rc != 0 or result is None:
            self.failures.append('%s: exit %s%s, see %s.err' % (
                label, rc, ' (its result is used: it was printed before)' if result else '',
                base))
        return result

    @staticmethod
    def _result(path):
        with open(path) as f:
            for line in f:
                if RESULT_TAG in line:
                    return json.loads(line.split(RESULT_TAG, 1)[1])
        return None


def training_argv(args, framework, np_, model):
    script = os.path.abspath(__file__)
    common = ['--worker', framework, '--model', model, '--steps', str(args.steps),
              '--warmup', str(args.warmup), '--seed', str(args.seed)]
    if framework == 'hvd':
        return [args.hvdrun, '-np', str(np_), args.python, script] + common
    return [args.python, script, '--torchrun', '--standalone', '--nnodes', '1',
            '--nproc_per_node', str(np_), script] + common


def training_env(args, framework, np_):
    threads = str(threads_per_rank(np_))
    env = {'OMP_NUM_THREADS': threads, 'MKL_NUM_THREADS': threads}
    if framework == 'hvd':
        env.update(args.hvd_env)
    return env


def run_training(args, runner, rep):
    """rep -> (np, model) -> framework -> result, hvd first on even repetitions."""
    results = {}
    for np_ in args.nps:
        for model in args.models:
            order = ('hvd', 'ddp') if rep % 2 == 0 else ('ddp', 'hvd')
            for framework in order:
                r = runner.run('%s-np%d-%s' % (framework, np_, model),
                               training_argv(args, framework, np_, model),
                               training_env(args, framework, np_))
                results.setdefault((np_, model), {})[framework] = r
    return results


def run_latency(args, runner, rep):
    """np -> {case/size: median us} from Python, and from hvd-bench (ops
    layer) and hvd-bench-grads (public API), in an order rotated per rep."""
    out = {}
    sizes = ','.join(str(s) for s in args.sizes)
    for np_ in args.nps:
        runs = [
            ('py', [args.hvdrun, '-np', str(np_), args.python, os.path.abspath(__file__),
                    '--worker', 'latency', '--sizes', sizes, '--iters', str(args.latency_iters),
                    '--warmup-ops', str(args.latency_warmup), '--rotate', str(rep)]),
            ('bench', [os.path.join(args.build, 'bin', 'hvd-bench'), 'allreduce', '--np',
                       str(np_), '--sizes', sizes, '-n', str(args.latency_iters), '-w',
                       str(args.latency_warmup), '-I', '1']),
            ('grads', [os.path.join(args.build, 'bin', 'hvd-bench-grads'), 'latency', '--np',
                       str(np_), '-n', str(args.latency_iters), '-w', str(args.latency_warmup)]),
        ]
        shift = rep % len(runs)
        medians = {}
        for label, argv in runs[shift:] + runs[:shift]:
            if label == 'py':
                r = runner.run('latency-py-np%d' % np_, argv, dict(args.hvd_env))
                if r:
                    medians.update(r['median_us'])
            else:
                medians.update(run_c_latency(runner, label, np_, argv, args))
        out[np_] = medians
    return out


def run_c_latency(runner, label, np_, argv, args):
    """Runs a C benchmark and reads its medians into {case/size: us}."""
    runner.count += 1
    base = os.path.join(runner.out_dir, '%03d-latency-%s-np%d' % (runner.count, label, np_))
    shown = ' '.join(shlex.quote(a) for a in argv)
    if shown not in runner.commands:
        runner.commands.append(shown)
    print('torch_compare: latency-%s-np%d: %s' % (label, np_, shown), file=sys.stderr,
          flush=True)
    env = dict(os.environ, **args.hvd_env)
    runner.note_load()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=runner.timeout,
                              env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        runner.failures.append('%s: timeout after %d s' % (base, runner.timeout))
        return {}
    with open(base + '.out', 'w') as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        runner.failures.append('%s: exit %d' % (base, proc.returncode))
        return {}
    return parse_hvd_bench(proc.stdout) if label == 'bench' else parse_grads(proc.stdout)


def parse_hvd_bench(text):
    """hvd-bench -I 1: a '# per-op us on rank 0: ... median M ...' line before
    each size's data line."""
    medians, pending = {}, None
    for line in text.splitlines():
        if line.startswith('# per-op us on rank 0:'):
            words = line.split()
            pending = float(words[words.index('median') + 1])
        elif pending is not None and line.strip() and not line.startswith('#'):
            medians['c_ops/%d' % int(line.split()[0])] = pending
            pending = None
    return medians


def parse_grads(text):
    """hvd-bench-grads latency: the 'latency' data line's median (4 bytes)."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == 'latency':
            return {'c_api/4': float(words[3])}
    return {}


# ==== the report ==================================================================================

def median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def percent(fraction):
    return '–' if fraction is None else '%d%%' % round(100 * fraction)


def fmt(value, digits=1):
    return '–' if value is None else '%.*f' % (digits, value)


def by_framework(reps, np_, model):
    """(hvd results, ddp results, per-repetition pairs) of one configuration."""
    runs = [rep[(np_, model)] for rep in reps]
    return ([r['hvd'] for r in runs if r['hvd']], [r['ddp'] for r in runs if r['ddp']],
            [(r['hvd'], r['ddp']) for r in runs if r['hvd'] and r['ddp']])


def training_table(args, reps):
    lines = ['| model | params | batch/rank | np | threads/rank | hvd samples/s | '
             'ddp samples/s | **hvd/ddp** | per-repetition hvd/ddp |',
             '|---|--:|--:|--:|--:|--:|--:|--:|---|']
    for np_ in args.nps:
        for model in args.models:
            hvd, ddp, pairs = by_framework(reps, np_, model)
            h = median_of([r['samples_per_s'] for r in hvd])
            d = median_of([r['samples_per_s'] for r in ddp])
            per_rep = ', '.join('%.2f' % (a['samples_per_s'] / b['samples_per_s'])
                                for a, b in pairs)
            sample = (hvd or ddp or [None])[0]
            lines.append('| %s | %s | %d | %d | %d | %s | %s | **%s** | %s |' % (
                model, '{:,}'.format(sample['params']) if sample else '–', MODELS[model][0],
                np_, threads_per_rank(np_), fmt(h), fmt(d),
                fmt(h / d if h and d else None, 3), per_rep))
    return '\n'.join(lines)


def breakdown_table(args, reps):
    """Where a step's time goes on rank 0, medians over repetitions of each
    run's median step."""
    lines = ['| model | np | framework | step ms | forward | backward | optimizer step | '
             'main thread CPU ms/step | other threads CPU ms/step |',
             '|---|--:|---|--:|--:|--:|--:|--:|--:|']
    for np_ in args.nps:
        for model in args.models:
            for name, results in zip(('hvd', 'ddp'), by_framework(reps, np_, model)[:2]):
                if not results:
                    continue

                def med(key, field='phase_ms'):
                    return median_of([r[field].get(key) for r in results])
                lines.append('| %s | %d | %s | %s | %s | %s | %s | %s | %s |' % (
                    model, np_, name, fmt(med('total')), fmt(med('forward')),
                    fmt(med('backward')), fmt(med('step')), fmt(med('main', 'cpu_ms')),
                    fmt(med('others', 'cpu_ms'))))
    return '\n'.join(lines)


def agreement_lines(args, reps):
    """hvd and ddp should end at nearly the same weights: a check that both
    did the same work."""
    lines = []
    for np_ in args.nps:
        for model in args.models:
            pairs = [(r[(np_, model)]['hvd'], r[(np_, model)]['ddp']) for r in reps]
            diffs = [abs(h['checksum'] - d['checksum']) / abs(d['checksum'])
                     for h, d in pairs if h and d]
            if diffs:
                lines.append('- np=%d %s: final |weights| sum differs by at most %.1e '
                             '(relative) between hvd and ddp' % (np_, model, max(diffs)))
    return '\n'.join(lines)


def latency_table(args, reps):
    lines = ['| np | size | Python `hvd.allreduce(t, name=...)` µs | Python, no name µs | '
             'ctypes `hvd_allreduce` µs | C public API (hvd-bench-grads) µs | '
             'C ops layer (hvd-bench) µs | **Python named / C API** | Python named / C ops |',
             '|--:|--:|--:|--:|--:|--:|--:|--:|--:|']
    for np_ in args.nps:
        for size in args.sizes:
            def med(case):
                return median_of([rep.get(np_, {}).get('%s/%d' % (case, size)) for rep in reps])
            named, c_api, c_ops = med('torch_named'), med('c_api'), med('c_ops')
            lines.append('| %d | %d B | %s | %s | %s | %s | %s | **%s** | %s |' % (
                np_, size, fmt(named), fmt(med('torch_unnamed')), fmt(med('ctypes_blocking')),
                fmt(c_api), fmt(c_ops),
                fmt(named / c_api if named and c_api else None, 2),
                fmt(named / c_ops if named and c_ops else None, 2)))
    return '\n'.join(lines)


def driver(args):
    stamp = datetime.datetime.utcnow().strftime('%Y%m%dT%H%M%SZ')
    out_dir = args.out or os.path.join(REPO, 'build', 'torch-compare', stamp)
    os.makedirs(out_dir, exist_ok=True)
    runner = Runner(out_dir, args.timeout, args.idle_wait, args.idle_busy)
    train_reps, lat_reps = [], []
    for rep in range(args.reps):
        if args.models:
            train_reps.append(run_training(args, runner, rep))
        if not args.no_latency:
            lat_reps.append(run_latency(args, runner, rep))

    report = ['# torch_compare, %s, %d repetitions, %s' % (
        stamp, args.reps, ', '.join('%s=%s' % kv for kv in sorted(args.hvd_env.items()))
        or 'hvd defaults'), '',
        '%d CPUs, busy %s before a run (median; max %s; %d of %d runs started above %d%% '
        'after waiting up to %d s for other work to end)' % (
            os.cpu_count() or 0, percent(median_of(runner.busy)),
            percent(max(runner.busy) if runner.busy else None),
            sum(b > args.idle_busy for b in runner.busy), len(runner.busy),
            round(100 * args.idle_busy), args.idle_wait), '']
    if train_reps:
        report += ['Training throughput, %d timed steps after %d warm-up steps, medians over '
                   'repetitions (samples/s of the whole job, timed on its slowest rank):'
                   % (args.steps, args.warmup), '', training_table(args, train_reps), '',
                   'Where the time goes (rank 0; CPU from /proc, per timed step):', '',
                   breakdown_table(args, train_reps), '', agreement_lines(args, train_reps),
                   '']
    if lat_reps:
        report += ['One float32 sum allreduce, back to back, median µs per operation on '
                   'rank 0 (hvd-bench-grads: on the slowest rank; 4 B only), medians over '
                   'repetitions:', '', latency_table(args, lat_reps), '']
    report += ['Commands:', '', '```sh'] + runner.commands + ['```', '',
                                                             'Raw outputs: %s' % out_dir]
    if runner.failures:
        report += ['', 'FAILED runs:'] + ['- ' + f for f in runner.failures]
    text = '\n'.join(report)
    print(text)
    with open(os.path.join(out_dir, 'summary.md'), 'w') as f:
        f.write(text + '\n')
    return 1 if runner.failures else 0


# ==== arguments ===================================================================================

def _number(text, convert, noun):
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not %s' % (text, noun)) from None


def positive_int(text):
    value = _number(text, int, 'an integer')
    if value < 1:
        raise argparse.ArgumentTypeError('must be at least 1, not %d' % value)
    return value


def nonnegative_int(text):
    value = _number(text, int, 'an integer')
    if value < 0:
        raise argparse.ArgumentTypeError('must be 0 or more, not %d' % value)
    return value


def fraction(text):
    value = _number(text, float, 'a number')
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError('must be between 0 and 1, not %s' % text)
    return value


def int_list(text):
    try:
        values = [int(v) for v in text.split(',') if v]
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not a comma list of integers' % text) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError('%r: give positive integers, e.g. 2,4' % text)
    return values


def byte_sizes(text):
    values = int_list(text)
    if any(v % 4 for v in values):
        raise argparse.ArgumentTypeError('%r: sizes are of float32 tensors, multiples of 4'
                                         % text)
    return values


def model_list(text):
    names = [m for m in text.split(',') if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise argparse.ArgumentTypeError('unknown model(s) %s; choose from %s'
                                         % (', '.join(unknown), ', '.join(sorted(MODELS))))
    return names


def env_assignment(text):
    name, sep, value = text.partition('=')
    if not sep or not name:
        raise argparse.ArgumentTypeError('%r is not VAR=VALUE' % text)
    return name, value


def executable(text):
    if not (os.path.isfile(text) and os.access(text, os.X_OK)):
        raise argparse.ArgumentTypeError('%s is not an executable file' % text)
    return text


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='hvd.torch DistributedOptimizer against torch DDP '
                                '(gloo): training throughput and small-allreduce latency.',
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--worker', choices=['hvd', 'ddp', 'latency'],
                   help='run as one rank of a job (the driver passes this)')
    p.add_argument('--nps', type=int_list, default=[2, 4], help='rank counts')
    p.add_argument('--models', type=model_list, default=['cnn', 'mlp'],
                   help='comma list of models (cnn, mlp); empty: latency only')
    p.add_argument('--reps', type=positive_int, default=5, help='interleaved repetitions')
    p.add_argument('--steps', type=positive_int, default=20, help='timed training steps')
    p.add_argument('--warmup', type=positive_int, default=5, help='untimed steps first')
    p.add_argument('--seed', type=int, default=SEED, help='seed of weights and data')
    p.add_argument('--no-latency', action='store_true', help='skip the allreduce latency part')
    p.add_argument('--sizes', type=byte_sizes, default=[4, 4096],
                   help='latency: allreduce sizes in bytes')
    p.add_argument('--latency-iters', type=positive_int, default=2000,
                   help='latency: timed allreduces per case')
    p.add_argument('--latency-warmup', type=positive_int, default=200,
                   help='latency: untimed allreduces per case first')
    p.add_argument('--hvd-env', type=env_assignment, action='append', default=[],
                   metavar='VAR=VALUE', help='set VAR for hvd runs only (repeatable), e.g. '
                   'HOROVOD_FUSION_THRESHOLD=0')
    p.add_argument('--build', default=os.path.join(REPO, 'build'),
                   help='hvd build directory (bin/hvdrun, bin/hvd-bench, bin/hvd-bench-grads)')
    p.add_argument('--python', type=executable, default='/usr/bin/python3',
                   help='interpreter with torch for the ranks')
    p.add_argument('--timeout', type=positive_int, default=300,
                   help='seconds before one run is killed')
    p.add_argument('--out', help='directory for raw outputs')
    p.add_argument('--idle-wait', type=nonnegative_int, default=120,
                   help='seconds to wait before each run for the CPUs to be quiet (0: none)')
    p.add_argument('--idle-busy', type=fraction, default=0.25,
                   help='quiet means at most this busy fraction over one second')
    # worker-only
    p.add_argument('--model', choices=sorted(MODELS), default='cnn', help=argparse.SUPPRESS)
    p.add_argument('--profile', metavar='FILE', help='worker: cProfile rank 0 into FILE')
    p.add_argument('--comm-timeout', type=positive_int, default=120, help=argparse.SUPPRESS)
    p.add_argument('--iters', type=positive_int, default=2000, help=argparse.SUPPRESS)
    p.add_argument('--warmup-ops', type=positive_int, default=200, help=argparse.SUPPRESS)
    p.add_argument('--rotate', type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.hvd_env = dict(args.hvd_env)
    args.hvdrun = os.path.join(args.build, 'bin', 'hvdrun')
    if args.worker is None:
        for tool in ('hvdrun', 'hvd-bench', 'hvd-bench-grads'):
            path = os.path.join(args.build, 'bin', tool)
            if not os.access(path, os.X_OK):
                p.error('%s is missing: build hvd first (./scripts/build.sh) or pass --build'
                        % path)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['--torchrun']:  # the ddp runs: torchrun's own arguments follow
        return torchrun(argv[1:])
    args = parse_args(argv)
    if args.worker == 'hvd':
        return worker_hvd(args)
    if args.worker == 'ddp':
        return worker_ddp(args)
    if args.worker == 'latency':
        return worker_latency(args)
    return driver(args)


if __name__ == '__main__':
    sys.exit(main())
