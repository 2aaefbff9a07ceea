#!/usr/bin/env bash
# The autotuner against fixed settings on the gradient benchmark: hvd-bench
# grads steps (ResNet-50's 161 gradients) with hvd's defaults, with each
# setting of a sweep (fusion threshold x cycle time x the ring's switch point,
# HVD_ALLREDUCE_RING_BYTES), and with
# HOROVOD_AUTOTUNE=1, whose untimed warm-up steps cover the tuning so that
# the timed steps run with the setting it fixed. Runs are INTERLEAVED, the
# order rotated by one each repetition. Prints a markdown table of the
# medians of each run's median step time, the ratio to the best fixed
# setting, and the autotuner's logs (its CSV and the setting it fixed).
# Raw outputs land in build/autotune-compare/<UTC timestamp>/. Exits 1 if a
# run fails, reports wrong values, or the tuner did not finish in its warm-up.
#
# Environment (defaults):
#   REPS=3 NP=4          repetitions, ranks
#   STEPS=20 WARMUP=3    timed and untimed steps of the fixed runs
#   TUNE_WARMUP=120      untimed steps of the autotune runs (tuning happens there)
#   FUSIONS="0 16M 64M" CYCLES="1 5" RINGS="16M 256M"   the sweep
#                        (HOROVOD_CYCLE_TIME in ms; a ring from 256M: halving-doubling)
#   HVD_BUILD=build  RUN_TIMEOUT=600
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
NP=${NP:-4}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
TUNE_WARMUP=${TUNE_WARMUP:-120}
FUSIONS=${FUSIONS:-"0 16M 64M"}
CYCLES=${CYCLES:-"1 5"}
RINGS=${RINGS:-"16M 256M"}
HVD_BUILD=${HVD_BUILD:-build}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
BENCH=$HVD_BUILD/bin/hvd-bench-grads

[ -x "$BENCH" ] || ./scripts/build.sh >/dev/null
out=$HVD_BUILD/autotune-compare/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"

configs=(default autotune)
for f in $FUSIONS; do
    for c in $CYCLES; do
        for r in $RINGS; do
            configs+=("f${f}_c${c}_r${r}")
        done
    done
done

# run CONFIG REP: one hvd-bench-grads run, its output in $out/CONFIG.REP.txt.
run() {
    local cfg=$1 rep=$2 warm=$WARMUP
    local -a env=(HOROVOD_LOG_LEVEL=info)
    case $cfg in
    default) ;;
    autotune)
        env+=(HOROVOD_AUTOTUNE=1 "HOROVOD_AUTOTUNE_LOG=$out/autotune.$rep.csv")
        warm=$TUNE_WARMUP
        ;;
    f*)
        local f=${cfg#f} c r
        r=${f##*_r}
        c=${f#*_c}
        c=${c%%_r*}
        f=${f%%_c*}
        env+=("HOROVOD_FUSION_THRESHOLD=$(numfmt --from=iec "$f")" "HOROVOD_CYCLE_TIME=$c"
            "HVD_ALLREDUCE_RING_BYTES=$(numfmt --from=iec "$r")")
        ;;
    esac
    echo "$(date -u +%T) $cfg rep $rep load $(cut -d' ' -f1 /proc/loadavg)" >>"$out/runs.log"
    env "${env[@]}" timeout "$RUN_TIMEOUT" "$BENCH" steps --np "$NP" -n "$STEPS" -w "$warm" \
        --plain 0 --samples 0 >"$out/$cfg.$rep.txt" 2>"$out/$cfg.$rep.err"
}

n=${#configs[@]}
for rep in $(seq 1 "$REPS"); do
    for i in $(seq 0 $((n - 1))); do
        cfg=${configs[$(((i + rep - 1) % n))]}
        echo "autotune_compare: rep $rep $cfg" >&2
        run "$cfg" "$rep" || { echo "autotune_compare: $cfg rep $rep failed (see $out)" >&2; exit 1; }
    done
done

/usr/bin/python3 - "$out" "$REPS" "${configs[@]}" <<'EOF'
import csv, glob, os, re, statistics, sys
out, reps, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med, bad = {}, False
for cfg in configs:
    vals = []
    for rep in range(1, reps + 1):
        text = open(os.path.join(out, '%s.%d.txt' % (cfg, rep))).read()
        m = re.search(r'^\s*grads\s+\d+\s+\S+\s+(\S+).*\s(\d+)\s*$', text, re.M)
        if not m or m.group(2) != '0':
            print('%s rep %d: no result or wrong values' % (cfg, rep)); bad = True; continue
        vals.append(float(m.group(1)))
    med[cfg] = statistics.median(vals) if vals else float('nan')
fixed = {c: v for c, v in med.items() if c != 'autotune'}
best = min(fixed, key=fixed.get)
print('| setting | step median (ms) | / best fixed |')
print('|---|--:|--:|')
for cfg in configs:
    print('| %s | %.1f | %.3f |' % (cfg, med[cfg], med[cfg] / fixed[best]))
print('\nbest fixed: %s' % best)
for rep in range(1, reps + 1):
    log = os.path.join(out, 'autotune.%d.csv' % rep)
    rows = list(csv.reader(open(log))) if os.path.exists(log) else []
    done = [l for l in open(os.path.join(out, 'autotune.%d.err' % rep)) if 'autotune: done' in l]
    print('autotune rep %d: %d scored samples; %s' % (rep, max(len(rows) - 1, 0),
          done[-1].split('autotune: ')[-1].strip() if done else 'NOT FINISHED in the warm-up'))
    bad = bad or not done
sys.exit(1 if bad else 0)
EOF
