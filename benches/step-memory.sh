#!/usr/bin/env bash
# The default job's step, memory and time, in five settings run back to back: the head
# whole and each group's graph whole (as before issue 17), the head by chunks, the head by
# chunks with the layers recomputed one at a time, that with each group split into
# micro-batches of similar completion lengths (the default), and that with micro-batches of
# at most 4 rows. Prints, per setting, the peak resident memory
# of each phase (metrics.jsonl's peak_rss_mib_by_phase, max over steps), the whole process's
# (/usr/bin/time -v) and the mean step time.
#   bash benches/step-memory.sh        # STEPS=5 by default
# Run on an idle machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
cargo build -q --release -p wirl-cli
wirl=target/release/wirl
"$wirl" model fetch > /dev/null

run() { # run NAME SETTINGS...
    local name=$1
    shift
    local sets=()
    for s in "$@"; do sets+=(--set "$s"); done
    /usr/bin/time -v "$wirl" train --run-dir "$work/$name" --set grpo.steps="$steps" --set eval.tasks=2 \
        "${sets[@]}" > /dev/null 2> "$work/$name.log"
    python3 - "$work/$name" "$work/$name.log" "$name" <<'PY'
import json, re, sys
run, log, name = sys.argv[1:]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
phases = {p: max((l.get("peak_rss_mib_by_phase", {}).get(p) or 0) for l in lines) for p in ("generate", "score", "train")}
whole = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(log).read()).group(1)) // 1024
step = sum(l["time_s"]["total"] for l in lines) / len(lines)
train = sum(l["time_s"]["train"] for l in lines) / len(lines)
print(json.dumps({"setting": name, "steps": len(lines), "peak_mib_by_phase": phases, "peak_mib_process": whole,
                  "step_s_mean": round(step, 2), "train_s_mean": round(train, 2)}))
PY
}
run whole grpo.head_chunk_mib=0 grpo.recompute_above_mib=1024 grpo.split_by_length=false
run chunked grpo.recompute_above_mib=1024 grpo.split_by_length=false
run chunked-recomputed grpo.split_by_length=false
run chunked-recomputed-split-by-length
run chunked-recomputed-split-by-length-micro4 grpo.micro_batch_rows=4
