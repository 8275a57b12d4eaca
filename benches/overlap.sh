#!/usr/bin/env bash
# A step's phases one after another, overlapped, and with a one-step generation lag, back to
# back on the same job: `grpo.overlap = false` (serial), the default (each group scored as
# soon as its samples finish, the next step's tasks drawn during the update), and
# `grpo.generation_lag = 1` (the next step's groups sampled during the update). Prints, per
# setting, the mean step time and its parts (metrics.jsonl's time_s) and the held-out pass
# rate after (with EVAL_TASKS > 0).
#   bash benches/overlap.sh                 # the default job, STEPS=5, EVAL_TASKS=0
#   CODE=1 bash benches/overlap.sh          # code: HumanEval problems graded by the
#                                           # humaneval-grader in the CPython runner
# Run on an idle machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-5}
eval_tasks=${EVAL_TASKS:-0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
cargo build -q --release -p wirl-cli
wirl=target/release/wirl
"$wirl" model fetch > /dev/null

job=()
if [ "${CODE:-0}" = 1 ]; then
    bash scripts/build-plugins > /dev/null
    # HumanEval's problems as training tasks (its evaluation set: this measures time, not
    # learning), 4 prompts x 8, 128 new tokens.
    job=(examples/humaneval.toml --set dataset.train=examples/humaneval/HumanEval.jsonl --set sampling.max_tokens=128)
fi

run() { # run NAME SETTINGS...
    local name=$1
    shift
    local sets=()
    for s in "$@"; do sets+=(--set "$s"); done
    "$wirl" train "${job[@]}" --run-dir "$work/$name" --steps "$steps" --eval-tasks "$eval_tasks" \
        "${sets[@]}" > /dev/null 2> "$work/$name.log" || { tail -20 "$work/$name.log" >&2; exit 1; }
    python3 - "$work/$name" "$name" <<'PY'
import json, sys
run, name = sys.argv[1:]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
mean = lambda key: round(sum(l["time_s"].get(key, 0) for l in lines) / len(lines), 2)
summary = json.load(open(f"{run}/summary.json"))
print(json.dumps({"setting": name, "steps": len(lines), "step_s_mean": mean("total"),
                  "generate_s_mean": mean("generate"), "score_s_mean": mean("score"), "draw_s_mean": mean("draw"),
                  "train_s_mean": mean("train"), "reward_mean": round(sum(l["reward_mean"] for l in lines) / len(lines), 3),
                  "held_out_before": summary.get("held_out_pass_rate_before"),
                  "held_out_after": summary.get("held_out_pass_rate_after")}))
PY
}
run serial grpo.overlap=false
run overlap
run lag1 grpo.generation_lag=1
