#!/bin/sh
# How long a job takes to start under a real Slurm (the test bed of
# tests/slurm: 4 tasks on 2 nodes of network namespaces, one machine):
# from the last task's start, and from the last task's imports, to every
# task's process group being up, for hvd's core package, hvd.torch, and
# torch.distributed (gloo, with the MASTER_ADDR an sbatch script computes),
# interleaved, each in an allocation of its own. Prints every run and the
# median of each mode. Needs root (tests/slurm/cluster.sh check).
#   REPS=9 bench/launch_init.sh [BIN_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../build/bin}
out=$(HVD_INIT_REPS=${REPS:-9} "$here/../tests/slurm/slurm.sh" "$bin" init_time) || {
    echo "$out" >&2
    exit 1
}
echo "$out" | grep -v '^ok '
echo "$out" | grep -v '^ok ' | sort -k1,1 -k2,2n |
    awk '{ s[$1] = s[$1] " " $2; i[$1] = i[$1] " " $3 }
         function median(list,    v, n) {
             n = split(list, v, " ")
             asort_num(v, n)
             return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
         }
         function asort_num(v, n,    a, b, t) {
             for (a = 2; a <= n; a++)
                 for (b = a; b > 1 && v[b - 1] + 0 > v[b] + 0; b--) { t = v[b]; v[b] = v[b - 1]; v[b - 1] = t }
         }
         END {
             for (m in s)
                 printf "%-10s median of %d: %5.0f ms from the last start, %5.0f ms from the last imports\n",
                        m, split(s[m], x, " "), median(s[m]), median(i[m])
         }'
