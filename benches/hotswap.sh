#!/usr/bin/env bash
# What a hot swap costs a running training: the default job's model and sizes (4 prompts x 8
# samples, 64 new tokens), the reward plugin replaced with `wirl ctl apply` once STEP steps
# are done — Rust math-answer's bytes by C math-answer's (the same scores, so the steps
# before and after do the same work). Prints the time the apply took (the checks
# run beside training: loading, re-scoring the last two steps' rollouts), the switch itself
# (how long the trainer was held), and each step's time around it. No peer: no RL framework
# swaps a reward in a running training.
#   bash benches/hotswap.sh            # STEPS=8 STEP=3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
steps=${STEPS:-8}
at=${STEP:-3}
cargo build --quiet -p wirl-cli
wirl=$root/target/debug/wirl
work=$(mktemp -d)
trap 'kill "$train" 2>/dev/null || true; rm -rf "$work"' EXIT
release=plugins/target/wasm32-wasip2/release
cp "$release/math_answer.wasm" "$work/reward.wasm"
tasks='
[[tasks]]
name = "sums"
[tasks.environment]
plugin = "builtin:arithmetic"
config = { kind = "chain_sum", min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 }

[[rewards]]
plugin = "reward.wasm"
'
printf '[model]\npath = "smollm2-135m-instruct"\n%s\n[sampling]\nmax_tokens = 64\n[grpo]\nsteps = %s\nprompts_per_step = 4\ngroup_size = 8\nlearning_rate = 1e-5\nbeta = 0.04\ncheckpoint_every = 0\n[eval]\ntasks = 0\n' \
    "$tasks" "$steps" > "$work/train.toml"
printf '%s' "$tasks" > "$work/tasks.toml"
"$wirl" train "$work/train.toml" --run-dir "$work/run" > "$work/train.log" 2>&1 &
train=$!
steps_done() { if [ -f "$work/run/metrics.jsonl" ]; then wc -l < "$work/run/metrics.jsonl"; else echo 0; fi; }
until [ "$(steps_done)" -ge "$at" ]; do sleep 0.2; done
cp plugins/target/c/math_answer.wasm "$work/reward.wasm"
start=$(date +%s.%N)
# (The C build imports what the Rust one does not: allowed here.)
(cd "$work" && "$wirl" ctl run apply tasks.toml --allow-capabilities > "$work/apply.log")
end=$(date +%s.%N)
wait "$train"
python3 - "$work/run" "$start" "$end" <<'PY'
import json, statistics, sys
run, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
events = [json.loads(l) for l in open(f"{run}/events.jsonl")]
applied = next(e for e in events if e["kind"] == "applied")
print(f"apply (checks beside training): {end - start:.2f} s; switch: {applied['switch_ms']:.3f} ms after step {applied['step']}")
for check in applied["report"]["checks"]:
    print(f"  check {check['task']} {check['kind']}: {check['calls']} calls, {check['failed']} failed, "
          f"reward mean {check.get('reward_mean_old')} -> {check.get('reward_mean_new')}")
for s in steps:
    mark = "  <- the checks ran during this step" if s["step"] == applied["step"] else ""
    print(f"step {s['step']:>2}  generation {s['manifest_generation']}  {s['time_s']['total']:.2f} s{mark}")
others = [s["time_s"]["total"] for s in steps if s["step"] not in (1, applied["step"])]
print(f"steps: {len(steps)} of {len(steps)} run (none lost); median step {statistics.median(others):.2f} s")
PY
