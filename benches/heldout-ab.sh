#!/usr/bin/env bash
# Same-run A/B of what the default job learns between two commits: each built in release
# (benches/ab-build.sh), then for each of SEEDS the full default job (STEPS steps, the
# held-out pass rate on its 50 tasks before and after; the seed is the sampler's, the tasks
# stay the same) run by A, then by B. Prints a line
# per run (seed, side, pass rate before → after, step-time median, the largest sampler gap)
# and per side the mean lift over the seeds and the mean step time, then B/A of the latter.
# Issue 61 asks that the bitwise sampler leave the held-out result unchanged within noise
# (3 seeds) and the step within 10 % of its time before.
#   bash benches/heldout-ab.sh BEFORE_COMMIT [AFTER_COMMIT]   # AFTER: the working tree
#   SEEDS="0 1 2" STEPS=20 AB_KEEP=DIR (reuse step-ab.sh's builds of the same pair)
# CONFIG=FILE: the job both run (default examples/train/default.toml); CONFIG= (empty): each
# binary's own embedded default job, for a commit that cannot read today's file (8308a1a
# reads the flat keys only).
# On 2 cores a run of 20 steps with both evaluations takes ~8 min: ~50 min with the defaults.
# Run on an idle machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
before=${1:?give the commit to compare against}
after=${2:-}
seeds=${SEEDS:-0 1 2}
steps=${STEPS:-20}
config=${CONFIG-examples/train/default.toml}
job=()
[ -n "$config" ] && job=("$config")
cd "$root"
# shellcheck source=benches/ab-build.sh
source "$root/benches/ab-build.sh"
ab_build "$before" "$after"
for seed in $seeds; do
    for side in A B; do
        run=$work/$side-$seed
        "$work/wirl-$side" train "${job[@]}" --steps "$steps" --set "grpo.seed=$seed" \
            --run-dir "$run" >"$run.log" 2>&1 ||
            { echo "$side seed $seed failed:" >&2; tail -n 5 "$run.log" >&2; exit 1; }
        python3 - "$run" "$side" "$seed" <<'PY'
import json, statistics, sys
run, side, seed = sys.argv[1:]
summary = json.load(open(f"{run}/summary.json"))
rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
gaps = [r["sampler_logp_diff_max"] for r in rows if r.get("sampler_logp_diff_max") is not None]
print(side, seed, summary["held_out_pass_rate_before"], summary["held_out_pass_rate_after"],
      f"{statistics.median(r['time_s']['total'] for r in rows):.2f}", max(gaps, default="none"))
PY
    done
done | tee "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY'
import statistics, sys
sides = {}
for line in open(sys.argv[1]):
    side, seed, before, after, step, gap = line.split()
    gap = None if gap == "none" else float(gap)
    sides.setdefault(side, []).append((float(after) - float(before), float(after), float(step), gap))
for side, runs in sides.items():
    lifts = [r[0] for r in runs]
    print(f"{side}: held-out after {[r[1] for r in runs]}, mean lift {statistics.mean(lifts):+.3f}"
          f" (sd {statistics.stdev(lifts) if len(lifts) > 1 else 0:.3f}), step {statistics.mean(r[2] for r in runs):.2f} s (mean of the runs' medians),"
          f" largest gap {max((r[3] for r in runs if r[3] is not None), default='none')}")
print(f"B/A step time: {statistics.mean(r[2] for r in sides['B']) / statistics.mean(r[2] for r in sides['A']):.3f}")
PY
