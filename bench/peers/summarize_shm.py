#!/usr/bin/env python3
"""Markdown tables from a bench/compare_shm.sh output folder.

Reads np<N>_<coll>_rep<R>_<hvd|tcp|mpi>.txt (nccl-tests columns), takes per
system the median time over repetitions, and prints one table per np and
collective: time and busbw (recomputed from the median time with
nccl-tests' factors: allreduce 2(N-1)/N, allgather (N-1)/N, broadcast 1;
GB = 1e9 B), the ratios hvd/Open MPI and hvd/hvd-TCP (of busbw: > 1 means
hvd is faster), and each system's busbw as a fraction of this machine's
memcpy bandwidth at 256 MiB (membw.txt, from hvd-bench-shm). A time cell's
"(+x%)" is how much slower the slowest repetition was than the fastest.
Exits 1 if a data line reports wrong elements, or a system that ran
produced no line for a size another system has (but an allgather of less
than a float per rank).
"""
import collections
import os
import re
import statistics
import sys

from summarize import parse as parse_lines  # the same nccl-tests columns

FILE_RE = re.compile(r"^np(\d+)_(allreduce|allgather|broadcast)_rep(\d+)_(hvd|tcp|mpi)\.txt$")
FACTORS = {"allreduce": lambda n: 2.0 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0}


def parse(path):
    """Yields (size, time_us, wrong) for each data line."""
    for _, size, us, wrong in parse_lines(path, "hvd"):
        yield size, us, wrong


def membw(folder):
    """memcpy and add GB/s at the largest size hvd-bench-shm measured."""
    best = None
    try:
        with open(os.path.join(folder, "membw.txt"), encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[0].isdigit():
                    best = (int(fields[0]), float(fields[1]), float(fields[2]))
    except OSError:
        pass
    return best


def human(size):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div and size % div == 0:
            return f"{size // div} {unit}"
    return f"{size} B"


def main():
    folder = sys.argv[1]
    times = collections.defaultdict(list)  # (np, coll, sys, size) -> [us]
    ok = True
    for name in sorted(os.listdir(folder)):
        m = FILE_RE.match(name)
        if not m:
            continue
        np_, coll, _, system = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        for size, us, wrong in parse(os.path.join(folder, name)):
            if wrong != 0:
                print(f"{name}: size {size}: #wrong {wrong}", file=sys.stderr)
                ok = False
            times[(np_, coll, system, size)].append(us)
    bw = membw(folder)
    if bw:
        print(f"Memory bandwidth of this machine (hvd-bench-shm, one thread, {human(bw[0])}): "
              f"memcpy {bw[1]:.1f} GB/s, add {bw[2]:.1f} GB/s. `/memcpy` columns: busbw as a "
              "fraction of memcpy.\n")
    for np_ in sorted({k[0] for k in times}):
        for coll in ("allreduce", "allgather", "broadcast"):
            sizes = sorted({k[3] for k in times if k[0] == np_ and k[1] == coll})
            if not sizes:
                continue
            systems = [s for s in ("hvd", "mpi", "tcp")
                       if any(k[0] == np_ and k[1] == coll and k[2] == s for k in times)]
            print(f"np={np_} {coll} (time us, busbw GB/s; ratios of busbw, > 1: hvd faster)\n")
            head = ["size"]
            for s in systems:
                label = {"hvd": "hvd shm", "mpi": "Open MPI shm", "tcp": "hvd TCP"}[s]
                head += [f"{label} time", f"{label} busbw"]
            head += ["hvd/MPI", "hvd/TCP"] + [f"{s} /memcpy" for s in systems]
            print("| " + " | ".join(head) + " |")
            print("|" + "---|" + "--:|" * (len(head) - 1))
            for size in sizes:
                row = [human(size)]
                bus = {}
                for s in systems:
                    v = times.get((np_, coll, s, size))
                    if not v:
                        # An allgather of fewer than one float per rank cannot run.
                        if coll != "allgather" or size >= 4 * np_:
                            print(f"np={np_} {coll} {s}: no result for size {size}",
                                  file=sys.stderr)
                            ok = False
                        row += ["-", "-"]
                        continue
                    med = statistics.median(v)
                    spread = (max(v) / min(v) - 1) * 100 if min(v) > 0 else 0
                    bus[s] = size / (med * 1e-6) / 1e9 * FACTORS[coll](np_)
                    row += [f"{med:.2f} (+{spread:.0f}%)", f"{bus[s]:.3f}"]
                for other in ("mpi", "tcp"):
                    row.append(f"{bus['hvd'] / bus[other]:.2f}"
                               if "hvd" in bus and bus.get(other) else "-")
                for s in systems:
                    row.append(f"{bus[s] / bw[1]:.2f}" if bw and s in bus else "-")
                print("| " + " | ".join(row) + " |")
            print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
