#!/usr/bin/env bash
# A 0.6B-class model trains GRPO steps on this machine: Qwen3-0.6B's shapes with random
# weights (benches/qwen3_shaped.py, SmolLM2's 49,152-token vocabulary: 491M parameters), f32,
# 4 prompts x 8 completions of 64 new tokens, KL beta 0.04, in three modes — LoRA (rank 16,
# alpha 32, all seven projections), LoRA on a bf16 base (`lora.base_dtype = "bf16"`; the peer
# loads the model in bf16, PEFT keeps its adapters in f32) and every weight — each beside
# TRL's GRPOTrainer with the
# same model, prompts, sizes and reward (PEFT's LoRA for the first; benches/trl_peft_peer.py),
# one after the other in this run under /usr/bin/time -v. Reward: the completion's length
# (plugins/tests/hostile), so that groups differ and every step trains.
# TRL runs its 32 completions in micro-batches of 8 with gradient checkpointing
# (PEER_ARGS="--micro-batch 8 --grad-checkpointing"): in one micro-batch of 32, without
# checkpointing, TRL + PEFT passed 24 GiB and was killed (2026-11-25).
# Prints a JSON line per run (median step seconds, peak resident MiB of the whole process)
# and one with the same-run ratios wirl / peer (a peer that died is reported as such).
#   bash benches/qwen3-0.6b.sh          # STEPS=3 MODES="lora lora-bf16 full"; PEERS=~/.cache/wirl-peers
# Run on an idle machine: on 2 cores any other load moves every number here. Takes ~40 min.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$HOME/.cache/wirl-peers}
python=$peers/venv/bin/python
steps=${STEPS:-3}
modes=${MODES:-lora lora-bf16 full}
work=${WORK:-$(mktemp -d)}
cd "$root"
[ -x "$python" ] || { echo "no peers venv at $peers/venv: run ../shared/peers/setup.sh" >&2; exit 1; }
"$python" -c "import peft" 2> /dev/null || { echo "no PEFT in $peers/venv: run ../shared/peers/setup.sh" >&2; exit 1; }
cargo build -q --release -p wirl-cli
bash scripts/build-plugins > /dev/null
wirl=$root/target/release/wirl
reward=$root/plugins/target/wasm32-wasip2/release/hostile.wasm
peak_mib() { sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$1" | awk '{print int($1 / 1024)}'; }

[ -d "$work/smollm2-hf" ] || "$wirl" model export smollm2-135m-instruct "$work/smollm2-hf" 2> /dev/null
[ -d "$work/model" ] || "$python" benches/qwen3_shaped.py "$work/smollm2-hf" "$work/model" 2> "$work/build.log"
"$wirl" tasks --plugin builtin:arithmetic --count 64 --config kind=chain_sum --config min_terms=2 \
    --config max_terms=2 --config min_digits=1 --config max_digits=1 > "$work/tasks.jsonl" 2> /dev/null

# shellcheck source=benches/length-job.sh
source "$root/benches/length-job.sh"
for mode in $modes; do
    length_job "$work/$mode.toml" "$work/model" "$reward" "$steps" "$mode"
    rm -rf "$work/run-$mode"
    /usr/bin/time -v "$wirl" train "$work/$mode.toml" --run-dir "$work/run-$mode" > /dev/null 2> "$work/wirl-$mode.log" ||
        { tail -20 "$work/wirl-$mode.log" >&2; exit 1; }
    python3 - "$work/run-$mode" "$(peak_mib "$work/wirl-$mode.log")" "$mode" > "$work/wirl-$mode.json" <<'PY'
import json, statistics, sys
run, peak, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
steps = [l["time_s"]["total"] for l in lines]
print(json.dumps({"system": "wirl", "mode": mode, "steps": len(lines), "step_s": [round(s, 2) for s in steps],
                  "step_s_median": round(statistics.median(steps), 2), "peak_mib": peak,
                  "trained_groups": [l.get("groups_trained", l.get("groups")) for l in lines]}))
PY
    cat "$work/wirl-$mode.json"
    # shellcheck disable=SC2086
    /usr/bin/time -v "$python" benches/trl_peft_peer.py --model "$work/model" --tasks "$work/tasks.jsonl" \
        --steps "$steps" "${peer_lora[@]}" ${PEER_ARGS:---micro-batch 8 --grad-checkpointing} \
        > "$work/peer-$mode.out" 2> "$work/peer-$mode.log" || true
    python3 - "$work/peer-$mode.out" "$(peak_mib "$work/peer-$mode.log")" "$mode" "$work/wirl-$mode.json" <<'PY'
import json, sys
out, peak, mode, ours = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lines = open(out).read().strip().splitlines()
if not lines:
    print(json.dumps({"system": "peer", "mode": mode, "failed": "died before its first step ended (killed: out of memory?)",
                      "peak_mib": peak}))
    sys.exit(0)
peer = json.loads(lines[-1])
peer.update({"mode": mode, "peak_mib": peak})
print(json.dumps(peer))
wirl = json.load(open(ours))
print(json.dumps({"mode": mode, "step_time_ratio": round(wirl["step_s_median"] / peer["step_s_median"], 3),
                  "peak_ratio": round(wirl["peak_mib"] / peer["peak_mib"], 3)}))
PY
done
