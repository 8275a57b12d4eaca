#!/usr/bin/env bash
# The default job trained two ways on the same budget (20 steps of 4 prompts x 8 samples,
# the same tasks and seeds): every weight (lr 1e-5, as examples/train/default.toml) and LoRA
# (rank 16, alpha 32, all seven projections, lr LORA_LR = 1e-4: adapters start at zero
# effect and are trained at the usual ~10x a full fine-tune's rate), one after the other in
# this run. Prints a JSON line per run: held-out greedy pass rate before and after (50
# tasks), median step seconds, peak resident MiB (/usr/bin/time), checkpoint bytes.
#   bash benches/lora-default.sh         # STEPS=20 LORA_LR=1e-4 MODES="full lora"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-20}
lora_lr=${LORA_LR:-1e-4}
modes=${MODES:-full lora}
work=${WORK:-$(mktemp -d)}
cd "$root"
cargo build -q --release -p wirl-cli
wirl=$root/target/release/wirl
"$wirl" model fetch > /dev/null
printf '\n[lora]\nrank = 16\nalpha = 32\n' | cat examples/train/default.toml - > "$work/lora.toml"
for mode in $modes; do
    config=examples/train/default.toml
    sets=(--steps "$steps")
    if [ "$mode" = lora ]; then config=$work/lora.toml; sets+=(--set "grpo.learning_rate=$lora_lr"); fi
    rm -rf "$work/run-$mode"
    /usr/bin/time -v "$wirl" train "$config" "${sets[@]}" --run-dir "$work/run-$mode" > /dev/null 2> "$work/$mode.log" ||
        { tail -20 "$work/$mode.log" >&2; exit 1; }
    peak=$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$work/$mode.log")
    python3 - "$work/run-$mode" "$mode" "$peak" <<'PY'
import json, os, statistics, sys
run, mode, peak_kib = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
summary = json.load(open(f"{run}/summary.json"))
checkpoints = os.path.join(run, "checkpoints")
newest = os.path.join(checkpoints, sorted(os.listdir(checkpoints))[-1])
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(newest) for f in files)
print(json.dumps({"mode": mode, "steps": len(lines),
                  "held_out_before": summary["held_out_pass_rate_before"],
                  "held_out_after": summary["held_out_pass_rate_after"], "held_out_tasks": summary["held_out_tasks"],
                  "step_s_median": round(statistics.median(l["time_s"]["total"] for l in lines), 2),
                  "peak_mib": peak_kib // 1024, "checkpoint_mib": round(size / 2**20, 1)}))
PY
done
