#!/usr/bin/env bash
# On-policy distillation beside GRPO on the default job (issue 62, deliver 4), same run:
#   1. GRPO: the default job (SmolLM2-135M-Instruct on 1-digit chain sums, math-answer) for
#      STEPS steps from the base model; its last checkpoint is the teacher;
#   2. distillation alone: the base model for STEPS steps with `[distill] teacher = <1's
#      checkpoint>, rewards = false` (the rewards recorded, not trained on);
#   3. distillation with the rewards: as 2 with `rewards = true`.
# Each prints its held-out greedy pass rate before and after (the same 50 tasks), its median
# step time, and for 2 and 3 the student's reverse KL to the teacher (`distill_kl`) at its
# first and last steps; then the step-time ratios against GRPO's.
#   bash benches/distill.sh            # STEPS=20 SEED=0; WIRL=path/to/wirl (default: a release build)
# On 2 cores a 20-step run with both evaluations takes ~8 min: ~25 min for the three.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-20}
seed=${SEED:-0}
wirl=${WIRL:-$root/target/release/wirl}
[ -x "$wirl" ] || (cd "$root" && cargo build --release -p wirl-cli)
work=${DISTILL_WORK:-$(mktemp -d)}
cd "$root"
echo "runs in $work ($("$wirl" --version | head -n 1), $(nproc) cores)"

train() { # name, extra config text
    local name=$1 extra=$2 config=$work/$1.toml
    sed "s/^seed = 0$/seed = $seed/" examples/train/default.toml >"$config"
    printf '\n%s\n' "$extra" >>"$config"
    # The config is read from $work: its builtin plugins need no path.
    "$wirl" train "$config" --steps "$steps" --run-dir "$work/$name" >"$work/$name.log" 2>&1 ||
        { echo "$name failed:" >&2; tail -n 5 "$work/$name.log" >&2; exit 1; }
}

train grpo ""
teacher=$(ls -d "$work"/grpo/checkpoints/step-* | sort | tail -n 1)/model
[ -d "$teacher" ] || { echo "no checkpoint model in $work/grpo/checkpoints" >&2; exit 1; }
train distill "[distill]
teacher = \"$teacher\"
rewards = false"
train distill-rewards "[distill]
teacher = \"$teacher\""

python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
medians = {}
for name in ["grpo", "distill", "distill-rewards"]:
    summary = json.load(open(f"{work}/{name}/summary.json"))
    rows = [json.loads(line) for line in open(f"{work}/{name}/metrics.jsonl")]
    medians[name] = statistics.median(r["time_s"]["total"] for r in rows)
    kl = [r["distill_kl"] for r in rows if r.get("distill_kl") is not None]
    kl_text = f", distill_kl {kl[0]:.4f} -> {kl[-1]:.4f}" if kl else ""
    rewards = statistics.mean(r["reward_mean"] for r in rows)
    print(f"{name:16} held-out {summary['held_out_pass_rate_before']:.3f} -> {summary['held_out_pass_rate_after']:.3f}, "
          f"mean training reward {rewards:.3f}, step {medians[name]:.2f} s (median){kl_text}")
for name in ["distill", "distill-rewards"]:
    print(f"{name} / grpo step time: {medians[name] / medians['grpo']:.3f}")
PY
