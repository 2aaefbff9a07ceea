#!/usr/bin/env python3
"""Markdown tables from a bench/compare_grads.sh output directory.

Reads np<N>_rep<R>_<run>.txt, where <run> is one of RUNS below; every file
holds data lines (case, samples, mean, median, p10, p90, min, max, unit,
#wrong) from hvd-bench-grads or mpi_grads. For each np it prints the
gradient-step table and the 4-byte latency table: medians over
repetitions of each repetition's median, p10 and p90, and "(+x%)", how much
slower the slowest repetition's median was. Ratios are taken per
repetition where both numbers come from the same program run (step / plain)
and from the medians over repetitions otherwise. Exits 1 if a run is
missing, or any line reports wrong elements.
"""
import argparse
import os
import re
import statistics
import sys

STEP_RUNS = [
    ("hvd_f1_c1", "hvd, fusion on, cache on"),
    ("hvd_f0_c1", "hvd, fusion off, cache on"),
    ("hvd_f1_c0", "hvd, fusion on, cache off"),
    ("hvd_f0_c0", "hvd, fusion off, cache off"),
]
LAT_RUNS = [("hvd_lat_c1", "hvd, cache on"), ("hvd_lat_c0", "hvd, cache off")]
RUNS = [r for r, _ in STEP_RUNS] + [r for r, _ in LAT_RUNS] + ["mpi_steps", "mpi_lat"]
STEP_TARGET = 1.15  # issue 5: fusion+cache step <= 1.15x one plain allreduce
LAT_TARGET = 3.0  # issue 5: 4-byte latency <= 3x MPI_Allreduce


def parse(path):
    """{case: {"median": .., "p10": .., ...}} from one output file."""
    out = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            p = line.split()
            if len(p) != 10:
                continue
            try:
                out[p[0]] = {
                    "n": int(p[1]),
                    "mean": float(p[2]),
                    "median": float(p[3]),
                    "p10": float(p[4]),
                    "p90": float(p[5]),
                    "min": float(p[6]),
                    "max": float(p[7]),
                    "unit": p[8],
                    "wrong": int(p[9]),
                }
            except ValueError:
                continue
    return out


def fmt(v):
    if v is None:
        return "—"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def worst(vals):
    """(+x%): the slowest repetition against the median."""
    vals = [v for v in vals if v is not None]
    if len(vals) < 2:
        return ""
    m = statistics.median(vals)
    return f" (+{(max(vals) / m - 1) * 100:.0f}%)" if m > 0 else ""


def ratio(a, b):
    return f"{a / b:.3f}" if a is not None and b else "—"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    args = ap.parse_args()

    data = {}  # (np, run) -> [per-rep parsed dicts]
    pat = re.compile(r"np(\d+)_rep(\d+)_(.+)\.txt$")
    for name in sorted(os.listdir(args.dir)):
        m = pat.match(name)
        if m and m.group(3) in RUNS:
            data.setdefault((int(m.group(1)), m.group(3)), []).append(
                (int(m.group(2)), parse(os.path.join(args.dir, name)))
            )
    problems = []
    nps = sorted({np for np, _ in data})
    for np_ in nps:
        reps = max(r for (n, _), v in data.items() if n == np_ for r, _ in v)

        def col(run, case, key):
            vals = []
            for rep in range(1, reps + 1):
                got = dict(data.get((np_, run), [])).get(rep, {})
                if case not in got:
                    problems.append(f"np={np_} rep={rep}: {run} has no '{case}' line")
                    vals.append(None)
                    continue
                if got[case]["wrong"] != 0:
                    problems.append(
                        f"np={np_} rep={rep}: {run} '{case}' reports {got[case]['wrong']} wrong"
                    )
                vals.append(got[case][key])
            return vals

        mpi_single = med(col("mpi_steps", "single", "median"))
        mpi_tensor = med(col("mpi_steps", "per_tensor", "median"))
        print(f"### np={np_}: one gradient step, ResNet-50 (161 tensors, 102.2 MB)\n")
        print(f"Medians over {reps} repetitions, ms (lower is better); step / plain is the "
              "median of each run's ratio.\n")
        print("| configuration | step median | p10 | p90 | plain allreduce (same run) "
              "| step / plain | step / MPI single | step / MPI per-tensor |")
        print("|---|--:|--:|--:|--:|--:|--:|--:|")
        for run, label in STEP_RUNS:
            g = col(run, "grads", "median")
            p = col(run, "plain", "median")
            rs = [a / b for a, b in zip(g, p) if a is not None and b]
            gm = med(g)
            print(f"| {label} | {fmt(gm)}{worst(g)} | {fmt(med(col(run, 'grads', 'p10')))} "
                  f"| {fmt(med(col(run, 'grads', 'p90')))} | {fmt(med(p))}{worst(p)} "
                  f"| {fmt(med(rs))} | {ratio(gm, mpi_single)} | {ratio(gm, mpi_tensor)} |")
        for case, label in (("per_tensor", "MPI, 161 MPI_Allreduce in order"),
                            ("single", "MPI, one MPI_Allreduce of 25.6 M floats")):
            v = col("mpi_steps", case, "median")
            print(f"| {label} | {fmt(med(v))}{worst(v)} "
                  f"| {fmt(med(col('mpi_steps', case, 'p10')))} "
                  f"| {fmt(med(col('mpi_steps', case, 'p90')))} | | | | |")
        print()
        print(f"### np={np_}: 4-byte allreduce, end to end\n")
        print(f"Per-op latency, µs, medians over {reps} repetitions (lower is better).\n")
        print("| system | median | p10 | p90 | / MPI (median) |")
        print("|---|--:|--:|--:|--:|")
        mpi_lat = med(col("mpi_lat", "latency", "median"))
        for run, label in LAT_RUNS + [("mpi_lat", "Open MPI MPI_Allreduce")]:
            v = col(run, "latency", "median")
            print(f"| {label} | {fmt(med(v))}{worst(v)} "
                  f"| {fmt(med(col(run, 'latency', 'p10')))} "
                  f"| {fmt(med(col(run, 'latency', 'p90')))} | {ratio(med(v), mpi_lat)} |")
        print()
        g = col("hvd_f1_c1", "grads", "median")
        p = col("hvd_f1_c1", "plain", "median")
        rs = [a / b for a, b in zip(g, p) if a is not None and b]
        lat = med(col("hvd_lat_c1", "latency", "median"))
        step_ok = med(rs) is not None and med(rs) <= STEP_TARGET
        lat_ok = lat is not None and mpi_lat and lat / mpi_lat <= LAT_TARGET
        print(f"Targets at np={np_}: step / plain {fmt(med(rs))} (≤ {STEP_TARGET}: "
              f"{'met' if step_ok else 'missed'}); 4-byte latency {ratio(lat, mpi_lat)}× MPI "
              f"(≤ {LAT_TARGET}: {'met' if lat_ok else 'missed'}).\n")
    for p in dict.fromkeys(problems):
        print(f"summarize_grads: {p}", file=sys.stderr)
    return 1 if problems or not nps else 0


if __name__ == "__main__":
    sys.exit(main())
