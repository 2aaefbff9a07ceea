"""Small allreduces from Python: hvd.torch against torch.distributed (gloo),
and the C API's 4-byte allreduce for reference. A benchmark: it asserts
nothing about timing (docs/PERFORMANCE.md, "Small operations from Python").

One script, two roles:

- the driver (the default) runs, for each repetition and each np, three
  jobs in an order rotated every repetition: the hvd worker under
  `hvdrun -np N`, the gloo worker under torchrun (tests/python/torchrun.py's
  fix for Debian's torch 1.13), and the C benchmarks (hvd-bench-grads
  latency: hvd_allreduce_async + hvd_handle_wait + release of 4 bytes, the
  public API; hvd-bench -I 1: the same through the ops layer), and with
  --before, the hvd worker of another checkout too. It prints the medians
  over repetitions of each run's per-op median, the ratios, and the
  commands it ran;
- the workers (--worker hvd|gloo), which time float32 sum allreduces of
  each size, one op at a time, after a barrier and warm-up ops.

    /usr/bin/python3 bench/python_small_ops.py                 # np 2 and 4, 5 repetitions
    /usr/bin/python3 bench/python_small_ops.py --nps 2 --reps 3 --iters 1000
    /usr/bin/python3 bench/python_small_ops.py --nps 2 --settle 90  # a shared machine
    build/bin/hvdrun -np 2 /usr/bin/python3 bench/python_small_ops.py --worker hvd \\
        --profile /tmp/small.prof                               # cProfile of rank 0
    HVD_LIBRARY=$PWD/build/lib/libhvd.so.0 /usr/bin/python3 bench/python_small_ops.py \\
        --hvd-package /tmp/old/python                           # an older hvd package
    /usr/bin/python3 bench/python_small_ops.py --nps 2 --before /tmp/old/python,/tmp/old/build

Exit status: 0 when every run gave its result, 1 otherwise, 2 for bad
arguments.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_TAG = 'SMALL_OPS_RESULT '
SIZES = (4, 4096, 65536, 1 << 20)


# ==== workers =====================================================================================

def per_op_median_us(op, iters, warmup, barrier):
    for _ in range(warmup):
        op()
    barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        op()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def iters_for(size, iters):
    """Fewer ops of the larger sizes: the same order of time per size."""
    return max(50, iters // max(1, size // 16384))


def worker_hvd(args):
    import torch
    import hvd.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    results = {}
    for size in args.sizes:
        t = torch.ones(size // 4)
        cases = {
            'hvd_allreduce': lambda: hvd.allreduce(t, op=hvd.Sum),
            'hvd_allreduce_': lambda: hvd.allreduce_(t, op=hvd.Sum),
            'hvd_named_': lambda: hvd.allreduce_(t, name='small', op=hvd.Sum),
        }
        for name in sorted(cases):
            results['%s/%d' % (name, size)] = per_op_median_us(
                cases[name], iters_for(size, args.iters), args.warmup, hvd.barrier)
    if args.profile and hvd.rank() == 0:
        profile(args, lambda: hvd.allreduce(torch.ones(1), op=hvd.Sum))
    elif args.profile:
        for _ in range(args.iters):
            hvd.allreduce(torch.ones(1), op=hvd.Sum)
    if hvd.rank() == 0:
        print(RESULT_TAG + json.dumps({'np': hvd.size(), 'median_us': results}), flush=True)
    hvd.shutdown()


def profile(args, op):
    import cProfile
    import pstats
    p = cProfile.Profile()
    p.enable()
    for _ in range(args.iters):
        op()
    p.disable()
    p.dump_stats(args.profile)
    pstats.Stats(p, stream=sys.stderr).sort_stats('tottime').print_stats(15)


def worker_gloo(args):
    import torch
    import torch.distributed as dist
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    results = {}
    for size in args.sizes:
        t = torch.ones(size // 4)
        results['gloo_all_reduce/%d' % size] = per_op_median_us(
            lambda: dist.all_reduce(t), iters_for(size, args.iters), args.warmup, dist.barrier)
    if dist.get_rank() == 0:
        print(RESULT_TAG + json.dumps({'np': dist.get_world_size(), 'median_us': results}),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ==== the driver ==================================================================================

def cpu_times():
    """(idle, total) jiffies of every CPU so far (/proc/stat), or None."""
    try:
        with open('/proc/stat') as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields)


def settle(min_idle, limit_s=300):
    """Waits until the CPUs were at least min_idle % idle over 2 s (at most
    limit_s): on a small shared machine another job's load is what
    moves a small op's time most. Returns the idle share last seen."""
    deadline = time.monotonic() + limit_s
    while True:
        a = cpu_times()
        time.sleep(2)
        b = cpu_times()
        if a is None or b is None or b[1] == a[1]:
            return None
        idle = 100.0 * (b[0] - a[0]) / (b[1] - a[1])
        if idle >= min_idle or time.monotonic() >= deadline:
            return idle


def run(argv, timeout, min_idle=0, env=None):
    """The worker's result line, or None; the command for the report."""
    if min_idle > 0:
        idle = settle(min_idle)
        if idle is not None and idle < min_idle:
            print('python_small_ops: the CPUs stayed busy (%.0f %% idle) before: %s'
                  % (idle, ' '.join(argv)), file=sys.stderr)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env=env)
    except subprocess.TimeoutExpired:
        print('python_small_ops: timed out: %s' % ' '.join(argv), file=sys.stderr)
        return None
    return proc.returncode, proc.stdout, proc.stderr


def result_of(out):
    for line in out.splitlines():
        if RESULT_TAG in line:
            return json.loads(line.split(RESULT_TAG, 1)[1])['median_us']
    return None


def c_medians(out_grads, out_bench):
    medians = {}
    for line in out_grads.splitlines():
        words = line.split()
        if words and words[0] == 'latency':
            medians['c_api/4'] = float(words[3])
    for line in out_bench.splitlines():
        if '# per-op us on rank 0:' in line:
            words = line.split()
            medians['c_ops/4'] = float(words[words.index('median') + 1])
    return medians


def jobs(args, np_):
    script = os.path.abspath(__file__)
    sizes = ','.join(str(s) for s in args.sizes)
    common = ['--sizes', sizes, '--iters', str(args.iters), '--warmup', str(args.warmup)]
    hvdrun = os.path.join(args.build, 'bin', 'hvdrun')
    package = ['--hvd-package', args.hvd_package] if args.hvd_package else []
    table = {
        'hvd': [[hvdrun, '-np', str(np_), args.python, script, '--worker', 'hvd'] + common +
                package],
        'gloo': [[args.python, script, '--torchrun', '--standalone', '--nnodes', '1',
                  '--nproc_per_node', str(np_), script, '--worker', 'gloo'] + common],
        'c': [[os.path.join(args.build, 'bin', 'hvd-bench-grads'), 'latency', '--np', str(np_),
               '-n', str(args.iters), '-w', str(args.warmup)],
              [os.path.join(args.build, 'bin', 'hvd-bench'), 'allreduce', '--np', str(np_),
               '-b', '4', '-e', '4', '-n', str(args.iters), '-w', str(args.warmup), '-I', '1']],
    }
    if args.before:
        # The same worker with another checkout's package and library (its
        # build's hvdrun sets the job up): before and after, interleaved.
        python_dir, build = args.before
        table['before'] = [[os.path.join(build, 'bin', 'hvdrun'), '-np', str(np_), args.python,
                            script, '--worker', 'hvd'] + common + ['--hvd-package', python_dir]]
    return table


def job_env(args, kind):
    if kind != 'before':
        return None
    env = dict(os.environ)
    env['HVD_LIBRARY'] = os.path.join(args.before[1], 'lib', 'libhvd.so.0')
    return env


def drive(args):
    per_np = {np_: {} for np_ in args.nps}  # np -> case/size -> [median per repetition]
    commands, failures = [], []
    for rep in range(args.reps):
        for np_ in args.nps:
            table = jobs(args, np_)
            order = sorted(table)
            order = order[rep % len(order):] + order[:rep % len(order)]
            for kind in order:
                outs = []
                for argv in table[kind]:
                    shown = ' '.join(argv)
                    if shown not in commands:
                        commands.append(shown)
                    r = run(argv, args.timeout, args.settle, job_env(args, kind))
                    if r is None or r[0] != 0:
                        failures.append('%s: %s' % (shown, 'timeout' if r is None else
                                                    'exit %d: %s' % (r[0], r[2][-500:])))
                        outs.append('')
                    else:
                        outs.append(r[1])
                medians = c_medians(*outs) if kind == 'c' else result_of(outs[0]) or {}
                if kind == 'before':
                    medians = {'before:' + case: us for case, us in medians.items()}
                for case, us in medians.items():
                    per_np[np_].setdefault(case, []).append(us)
    report(args, per_np, commands)
    for f in failures:
        print('failed: ' + f, file=sys.stderr)
    return 1 if failures else 0


def median_of(values):
    return statistics.median(values) if values else None


def fmt(us):
    return '–' if us is None else '%.1f' % us


def report(args, per_np, commands):
    print('Medians over %d interleaved repetitions of each run\'s per-op median (us), '
          'float32 sum allreduce, one op at a time:' % args.reps)
    print()
    print('| np | bytes | hvd.allreduce | hvd.allreduce_ | hvd.allreduce_ (named) | '
          'gloo all_reduce | gloo / hvd.allreduce | C API (4 B) | hvd.allreduce - C API |')
    print('|---|---|---|---|---|---|---|---|---|')
    for np_, cases in sorted(per_np.items()):
        m = {case: median_of(v) for case, v in cases.items()}
        c_api = m.get('c_api/4')
        for size in args.sizes:
            hvd_new = m.get('hvd_allreduce/%d' % size)
            gloo = m.get('gloo_all_reduce/%d' % size)
            ratio = '%.2f' % (gloo / hvd_new) if gloo and hvd_new else '–'
            extra = (fmt(hvd_new - c_api) if size == 4 and c_api and hvd_new else '')
            print('| %d | %d | %s | %s | %s | %s | %s | %s | %s |' % (
                np_, size, fmt(hvd_new), fmt(m.get('hvd_allreduce_/%d' % size)),
                fmt(m.get('hvd_named_/%d' % size)), fmt(gloo), ratio,
                fmt(c_api) if size == 4 else '', extra))
        print('| %d | 4 | (C ops layer, hvd-bench -I 1: %s) | | | | | | |'
              % (np_, fmt(m.get('c_ops/4'))))
    if args.before:
        print()
        print('Before (%s) and after, the same worker, interleaved:' % args.before[0])
        print()
        print('| np | bytes | hvd.allreduce before | after | hvd.allreduce_ before | after | '
              'named hvd.allreduce_ before | after |')
        print('|---|---|---|---|---|---|---|---|')
        for np_, cases in sorted(per_np.items()):
            m = {case: median_of(v) for case, v in cases.items()}
            for size in args.sizes:
                row = []
                for case in ('hvd_allreduce', 'hvd_allreduce_', 'hvd_named_'):
                    row += [fmt(m.get('before:%s/%d' % (case, size))),
                            fmt(m.get('%s/%d' % (case, size)))]
                print('| %d | %d | %s |' % (np_, size, ' | '.join(row)))
    print()
    print('Commands:')
    for c in commands:
        print('    ' + c)
    print('Per repetition: ' + json.dumps({str(k): v for k, v in per_np.items()}))


def torchrun(argv):
    sys.path.insert(0, os.path.join(REPO, 'tests', 'python'))
    import torchrun as fixed_torchrun
    fixed_torchrun.main(argv)


def int_list(text):
    try:
        values = [int(v) for v in text.split(',') if v]
    except ValueError:
        raise argparse.ArgumentTypeError('not a comma list of integers: %r' % text) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError('need positive integers: %r' % text)
    return values


def dir_pair(text):
    if ',' not in text:
        raise argparse.ArgumentTypeError('want PYTHON_DIR,BUILD_DIR, not %r' % text)
    return tuple(os.path.abspath(d) for d in text.split(',', 1))


def main(argv):
    if argv[:1] == ['--torchrun']:
        return torchrun(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--worker', choices=['hvd', 'gloo'])
    p.add_argument('--nps', type=int_list, default=[2, 4])
    p.add_argument('--sizes', type=int_list, default=list(SIZES), help='bytes, multiples of 4')
    p.add_argument('--reps', type=int, default=5)
    p.add_argument('--iters', type=int, default=2000, help='timed ops of the smallest sizes')
    p.add_argument('--warmup', type=int, default=200)
    p.add_argument('--timeout', type=int, default=300, help='seconds per run')
    p.add_argument('--settle', type=float, default=0, metavar='PERCENT',
                   help='before each run, wait (up to 5 minutes) until the CPUs were this '
                   'idle over 2 s')
    p.add_argument('--profile', help='worker hvd: cProfile of rank 0 to this file')
    p.add_argument('--hvd-package', help='import hvd from this directory (another checkout\'s '
                   'python/, with HVD_LIBRARY set) to compare versions')
    p.add_argument('--build', default=os.path.join(REPO, 'build'))
    p.add_argument('--before', type=dir_pair, metavar='PYTHON_DIR,BUILD_DIR',
                   help='also run the hvd worker with another checkout\'s package and build '
                   '(its hvdrun and libhvd), interleaved, for a before/after table')
    p.add_argument('--python', default=sys.executable)
    args = p.parse_args(argv)
    if any(s % 4 for s in args.sizes):
        p.error('--sizes: multiples of 4 bytes (float32)')
    if args.worker == 'hvd':
        if args.hvd_package:
            sys.path.insert(0, os.path.abspath(args.hvd_package))
        return worker_hvd(args)
    if args.worker == 'gloo':
        return worker_gloo(args)
    return drive(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
