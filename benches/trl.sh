#!/usr/bin/env bash
# The default job beside TRL's GRPOTrainer (../shared/peers/grpo_trl.py: the same model,
# task, prompt and sizes: 4 prompts x 8, 64 new tokens, lr 1e-5, beta 0.04, f32, 2 threads),
# one after the other in this run, each under /usr/bin/time -v. Prints one JSON line per
# system and one with the ratios:
#   - step time (median over the steps),
#   - peak resident memory over the training steps (TRL: the whole process, which is only
#     loading and its steps; wirl: the highest of metrics.jsonl's per-phase peaks) and over
#     wirl's whole default job with its two 50-task evaluations (/usr/bin/time),
#   - learning on the same budget: TRL's trained model (its --save-dir) evaluated by
#     `wirl eval --model` on the default job's 50 held-out tasks, beside wirl's own
#     before/after pass rates on the same tasks.
#   bash benches/trl.sh          # STEPS=20; PEERS=~/.cache/wirl-peers (../shared/peers/setup.sh)
# CONFIG=file.toml (and TRL_ARGS for the peer's matching flags) compares another config.
# Run on an idle machine: on 2 cores any other load moves every number here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$HOME/.cache/wirl-peers}
peer_script=${PEER_SCRIPT:-$root/../shared/peers/grpo_trl.py}
steps=${STEPS:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
[ -x "$peers/venv/bin/python" ] || { echo "no peers venv at $peers/venv: run ../shared/peers/setup.sh" >&2; exit 1; }
[ -f "$peer_script" ] || { echo "no $peer_script (PEER_SCRIPT=...)" >&2; exit 1; }

cargo build -q --release -p wirl-cli
wirl=$root/target/release/wirl
"$wirl" model fetch > /dev/null
config=()
[ -n "${CONFIG:-}" ] && config=("$CONFIG")

peak_kib() { sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$1"; }

# wirl: the whole default job (evaluations before and after included).
/usr/bin/time -v "$wirl" train "${config[@]}" --steps "$steps" --run-dir "$work/wirl" > /dev/null 2> "$work/wirl.log" ||
    { tail -20 "$work/wirl.log" >&2; exit 1; }
python3 - "$work/wirl" "$(peak_kib "$work/wirl.log")" > "$work/wirl.json" <<'PY'
import json, statistics, sys
run, whole_kib = sys.argv[1], int(sys.argv[2])
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
summary = json.load(open(f"{run}/summary.json"))
steps_peak = max(max(v or 0 for v in l["peak_rss_mib_by_phase"].values()) for l in lines)
print(json.dumps({
    "system": "wirl", "steps": len(lines),
    "step_s_median": round(statistics.median(l["time_s"]["total"] for l in lines), 2),
    "peak_mib_steps": steps_peak, "peak_mib_whole_job": whole_kib // 1024,
    "held_out_before": summary["held_out_pass_rate_before"],
    "held_out_after": summary["held_out_pass_rate_after"],
    "held_out_tasks": summary["held_out_tasks"],
}))
PY
cat "$work/wirl.json"

# TRL: the same number of steps, its model saved, then scored on wirl's held-out tasks.
# shellcheck disable=SC2086
/usr/bin/time -v "$peers/venv/bin/python" "$peer_script" --steps "$steps" --save-dir "$work/trl-model" ${TRL_ARGS:-} \
    > "$work/trl.out" 2> "$work/trl.log" || { tail -20 "$work/trl.log" >&2; exit 1; }
"$wirl" eval "${config[@]}" --model "$work/trl-model" --output "$work/trl-eval.jsonl" > "$work/trl-eval.json" 2> "$work/trl-eval.log" ||
    { tail -20 "$work/trl-eval.log" >&2; exit 1; }
python3 - "$work/trl.out" "$(peak_kib "$work/trl.log")" "$work/trl-eval.json" "$work/wirl.json" <<'PY'
import json, sys
out, kib, evaluated, ours = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
trl = json.loads(open(out).read().strip().splitlines()[-1])
evaluation = json.load(open(evaluated))
wirl = json.load(open(ours))
peer = {"system": "trl", "steps": trl["steps"], "step_s_median": trl["step_s_median"], "peak_mib_steps": kib // 1024,
        "held_out_after": evaluation.get("greedy_pass_rate"), "held_out_tasks": evaluation.get("tasks")}
print(json.dumps(peer))
lift = lambda after: None if after is None or wirl["held_out_before"] is None else round(after - wirl["held_out_before"], 3)
print(json.dumps({
    "step_time_ratio": round(wirl["step_s_median"] / peer["step_s_median"], 3),
    "peak_steps_ratio": round(wirl["peak_mib_steps"] / peer["peak_mib_steps"], 3),
    "peak_whole_job_ratio": round(wirl["peak_mib_whole_job"] / peer["peak_mib_steps"], 3),
    "held_out_lift_wirl": lift(wirl["held_out_after"]), "held_out_lift_trl": lift(peer["held_out_after"]),
}))
PY
