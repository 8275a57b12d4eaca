#!/usr/bin/env bash
# Same-run A/B of the default job's step between two commits: each is built in release
# (a worktree for the other commit, sharing the target directory), then ROUNDS runs of STEPS
# steps alternate A, B, A, B, ... Prints each run's step times (metrics.jsonl's time_s.total)
# and rewards (equal when both sample the same groups), then per side the median of step 1
# and of steps 2..STEPS summed, and B/A.
#   bash benches/step-ab.sh BEFORE_COMMIT [AFTER_COMMIT]   # AFTER: the working tree
# CONFIG=FILE: the job both run (default examples/train/default.toml); CONFIG= (empty): each
# binary's own embedded default job, for a commit that cannot read today's file.
# Run on an idle machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
before=${1:?give the commit to compare against}
after=${2:-}
config=${CONFIG-examples/train/default.toml}
job=()
[ -n "$config" ] && job=("$config")
steps=${STEPS:-4}
rounds=${ROUNDS:-3}
cd "$root"
# shellcheck source=benches/ab-build.sh
source "$root/benches/ab-build.sh"
ab_build "$before" "$after"
for round in $(seq "$rounds"); do
    for side in A B; do
        run=$work/$side-$round
        "$work/wirl-$side" train "${job[@]}" --steps "$steps" --eval-tasks 0 --run-dir "$run" \
            >"$run.log" 2>&1 || { echo "$side round $round failed:" >&2; tail -n 5 "$run.log" >&2; exit 1; }
        python3 - "$run/metrics.jsonl" "$side" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(sys.argv[2], " ".join(f"{r['time_s']['total']:.2f}" for r in rows),
      "| reward", " ".join(f"{r['reward_mean']:.4f}" for r in rows))
PY
    done
done | tee "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY'
import statistics, sys
sides = {}
for line in open(sys.argv[1]):
    side, rest = line.split(" ", 1)
    times = [float(t) for t in rest.split("|")[0].split()]
    sides.setdefault(side, []).append(times)
med = {s: (statistics.median(r[0] for r in runs), statistics.median(sum(r[1:]) for r in runs))
       for s, runs in sides.items()}
for s, (first, rest) in med.items():
    print(f"{s}: step 1 median {first:.2f} s, steps 2.. summed median {rest:.2f} s")
print(f"B/A: step 1 {med['B'][0] / med['A'][0]:.3f}, steps 2.. {med['B'][1] / med['A'][1]:.3f}")
PY
