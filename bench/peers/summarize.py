#!/usr/bin/env python3
"""Markdown tables from a bench/compare_allreduce.sh output folder.

Reads np<N>_rep<R>_<hvd|mpi|gloo>.txt (nccl-tests columns; Gloo blocks follow
"# algorithm: NAME" lines), takes per system (and Gloo algorithm) the median
time over repetitions, and prints one table per np. busbw is recomputed from
the median time: size/time * 2(N-1)/N, GB/s = 1e9 B/s. "Gloo best" is the
algorithm with the lowest median time at that size. A time cell's "(+x%)" is
how much slower the slowest repetition was than the fastest.
Exits 1 if any data line reports wrong elements (or an unreadable #wrong), or
if a system that ran produced no line for a listed size.
"""
import argparse
import collections
import os
import re
import statistics
import sys

FILE_RE = re.compile(r"^np(\d+)_rep(\d+)_(hvd|mpi|gloo)\.txt$")


def parse(path, system):
    """Yields (algorithm, size, time_us, wrong) for each data line."""
    algo = {"hvd": "hvd", "mpi": "mpi"}.get(system, "?")
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"#\s*algorithm:\s*(\S+)", line)
            if m:
                algo = m.group(1)
                continue
            fields = line.split()
            if len(fields) < 9 or line.lstrip().startswith("#") or not fields[0].isdigit():
                continue
            try:
                wrong = int(fields[8])
            except ValueError:
                wrong = None
            yield algo, int(fields[0]), float(fields[5]), wrong


def fmt_time(times):
    med = statistics.median(times)
    cell = f"{med:.2f}" if med < 10 else f"{med:.1f}" if med < 1000 else f"{med:.0f}"
    if len(times) > 1:
        cell += f" (+{(max(times) / min(times) - 1) * 100:.0f}%)"
    return cell


def busbw(size, time_us, np_):
    return size / (time_us * 1e-6) / 1e9 * 2 * (np_ - 1) / np_


def fmt_bw(x):
    return f"{x:.3g}" if x >= 0.001 else f"{x:.6f}"


def human(size):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    ap.add_argument("--gloo-detail", help="also write per-algorithm Gloo medians here")
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]

    # times[np][(system, algo)][size] -> [time per rep]
    times = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    ran = collections.defaultdict(set)  # np -> systems with an output file
    reps = collections.defaultdict(set)
    bad = []
    warnings = []
    excluded = collections.defaultdict(set)  # np -> {(gloo algorithm, size)}
    for name in sorted(os.listdir(args.dir)):
        m = FILE_RE.match(name)
        if not m:
            continue
        np_, rep, system = int(m.group(1)), int(m.group(2)), m.group(3)
        ran[np_].add(system)
        reps[np_].add(rep)
        for algo, size, t, wrong in parse(os.path.join(args.dir, name), system):
            if wrong != 0 and system == "gloo":
                # A peer's own wrong answer: its time does not count, the run goes on.
                excluded[np_].add((algo, size))
                warnings.append(f"{name}: gloo/{algo} size {size}: #wrong = {wrong} "
                                f"(excluded from 'Gloo best' at this size)")
                continue
            if wrong != 0:
                bad.append(f"{name}: {system}/{algo} size {size}: #wrong = {wrong}")
            if size in args.sizes:
                times[np_][(system, algo)][size].append(t)

    detail = []
    for np_ in sorted(ran):
        per = times[np_]
        gloo_algos = sorted(a for s, a in per if s == "gloo")
        print(f"\n### allreduce float32 sum, np={np_}, loopback TCP "
              f"(median of {len(reps[np_])} reps; time us, busbw GB/s)\n")
        print("| size | hvd time | hvd busbw | MPI time | MPI busbw | Gloo best | Gloo time | "
              "Gloo busbw | hvd/MPI busbw | hvd/Gloo busbw |")
        print("|---|--:|--:|--:|--:|---|--:|--:|--:|--:|")
        for size in args.sizes:
            def cell(key):
                ts = per.get(key, {}).get(size)
                if not ts:
                    if key[0] in ran[np_] and key[0] != "gloo":
                        bad.append(f"np={np_}: {key[0]} has no result at {size} B")
                    return None, "-", "-"
                med = statistics.median(ts)
                return med, fmt_time(ts), fmt_bw(busbw(size, med, np_))

            h_med, h_t, h_bw = cell(("hvd", "hvd"))
            m_med, m_t, m_bw = cell(("mpi", "mpi"))
            best = None
            for a in gloo_algos:
                ts = per[("gloo", a)].get(size)
                if (a, size) in excluded[np_]:
                    continue
                if ts and (best is None or statistics.median(ts) < best[1]):
                    best = (a, statistics.median(ts))
            if best is None:
                if "gloo" in ran[np_]:
                    bad.append(f"np={np_}: gloo has no result at {size} B")
                g_med, g_name, g_t, g_bw = None, "-", "-", "-"
            else:
                g_name = best[0]
                g_med, g_t, g_bw = cell(("gloo", g_name))
            r_m = f"{m_med / h_med:.2f}" if h_med and m_med else "-"
            r_g = f"{g_med / h_med:.2f}" if h_med and g_med else "-"
            print(f"| {human(size)} | {h_t} | {h_bw} | {m_t} | {m_bw} | {g_name} | {g_t} | "
                  f"{g_bw} | {r_m} | {r_g} |")

        if gloo_algos:
            detail.append(f"\n### Gloo algorithms, np={np_}: median time us (busbw GB/s)\n")
            detail.append("| algorithm | " + " | ".join(human(s) for s in args.sizes) + " |")
            detail.append("|---|" + "--:|" * len(args.sizes))
            for a in gloo_algos:
                cells = []
                for s in args.sizes:
                    ts = per[("gloo", a)].get(s)
                    cells.append(f"{fmt_time(ts)} ({fmt_bw(busbw(s, statistics.median(ts), np_))})"
                                 if ts else "-")
                detail.append(f"| {a} | " + " | ".join(cells) + " |")

    print("\nRatios are busbw hvd / peer (> 1: hvd faster). busbw = size/time x 2(N-1)/N.")
    for w in warnings:
        print(f"\nNote: {w}")
        print(f"summarize: warning: {w}", file=sys.stderr)
    if args.gloo_detail and detail:
        with open(args.gloo_detail, "w", encoding="utf-8") as f:
            f.write("\n".join(detail).lstrip() + "\n")
    if not ran:
        print(f"summarize: no result files in {args.dir}", file=sys.stderr)
        return 1
    for b in bad:
        print(f"summarize: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
