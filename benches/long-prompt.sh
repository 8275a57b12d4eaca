#!/usr/bin/env bash
# Peak memory of one `wirl train` step against prompt length, on the default model
# (SmolLM2-135M, f32 trainer): group 4 at temperature 1.5 (so that rewards differ and the group is trained on), 8 new tokens, one task of ~N tokens. Each length runs
# with the recomputing backward (the default above grpo.recompute_above_mib = 1024) and, up
# to MAX_WHOLE tokens, with the whole graph kept (recompute_above_mib = huge), to show what
# recomputation saves. Prints one JSON line per run: prompt tokens, mode, peak RSS, step time.
#   bash benches/long-prompt.sh                   # LENGTHS="250 500 1000 2000", MAX_WHOLE=1000
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
lengths=${LENGTHS:-250 500 1000 2000}
max_whole=${MAX_WHOLE:-1000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build -q -p wirl-cli
bash scripts/build-plugins > /dev/null
wirl=target/debug/wirl
# A reward that differs within almost every group (the test guest that scores a completion
# by its length), so that the group is kept and trained on.
reward=$root/plugins/target/wasm32-wasip2/release/hostile.wasm
for n in $lengths; do
    python3 - "$n" > "$work/tasks-$n.jsonl" <<'PY'
import json, sys
words = " ".join(["the"] * int(sys.argv[1]))
print(json.dumps({"id": f"long-{sys.argv[1]}", "messages": [{"role": "user", "content": words}], "answer": "1"}))
PY
    for mode in recompute whole; do
        if [ "$mode" = whole ] && [ "$n" -gt "$max_whole" ]; then continue; fi
        above=$([ "$mode" = recompute ] && echo 1024 || echo 1000000000)
        cat > "$work/train-$n-$mode.toml" <<TOML
[model]
path = "smollm2-135m-instruct"
[dataset]
train = "$work/tasks-$n.jsonl"
[[rewards]]
plugin = "$reward"
[sampling]
max_tokens = 8
temperature = 1.5
[grpo]
steps = 1
prompts_per_step = 1
group_size = 4
beta = 0.04
recompute_above_mib = $above
[eval]
tasks = 0
TOML
        run="$work/run-$n-$mode"
        "$wirl" train "$work/train-$n-$mode.toml" --run-dir "$run" > /dev/null 2> "$work/log-$n-$mode" || {
            echo "{\"words\": $n, \"mode\": \"$mode\", \"failed\": true}"; tail -3 "$work/log-$n-$mode" >&2; continue; }
        python3 - "$run" "$n" "$mode" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1] + "/metrics.jsonl").readline())
roll = [json.loads(l) for l in open(sys.argv[1] + "/rollouts.jsonl")]
print(json.dumps({"words": int(sys.argv[2]), "mode": sys.argv[3], "recomputed": line["groups_recomputed"],
                  "groups_kept": line["groups_kept"], "peak_rss_mib": line["peak_rss_mib"],
                  "train_s": round(line["time_s"]["train"], 2)}))
PY
    done
done
