#!/bin/sh
# How fast an elastic job resumes after kill -9 of one of its 4 workers, on
# loopback: from the kill to the first completed step of the new round (as
# examples/train_elastic reports it). Runs the e2e "kill" case REPS times
# and prints each time and the median. CASE=kill_five: five of 7 workers
# killed 0.02-0.4 s apart; the time is from the last kill to the last
# round's first step.
#   REPS=5 [CASE=kill|kill_two|kill_five] bench/elastic_resume.sh [BIN_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../build/bin}
reps=${REPS:-5}
case_name=${CASE:-kill}
times=""
i=0
while [ $i -lt "$reps" ]; do
    i=$((i + 1))
    out=$("$here/../tests/e2e/elastic.sh" "$bin" "$case_name")
    t=$(echo "$out" | sed -n 's/^resumed \([0-9.]*\) s after the .*kill$/\1/p')
    [ -n "$t" ] || { echo "run $i: no measurement" >&2; exit 1; }
    echo "$out" | grep -v '^ok ' | sed "s/^/run $i: /"
    times="$times $t"
done
echo "$times" | tr ' ' '\n' | sed '/^$/d' | sort -n |
    awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                            printf "median of %d: %.3f s (min %.3f, max %.3f)\n", NR, m, v[1], v[NR] }'
