#!/usr/bin/env bash
# math-answer in every guest language, through the same host: component size, compile
# (once) and precompiled load time, instantiate time, scores/s with a fresh instance per call
# and with one reused instance. The pairs are the peers' reward pairs (reward_python.py's
# generator) when the peer scripts are there, else tests/fixtures/math-answer-cases.jsonl.
#   bash benches/languages.sh        # N=5000 pairs by default
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${WIRL_PEERS:-$root/../shared/peers}
n=${N:-5000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -f "$peers/reward_python.py" ]; then
    python3 - "$peers" "$n" "$work/pairs.jsonl" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from reward_python import make_pairs
with open(sys.argv[3], "w") as f:
    for completion, answer in make_pairs(int(sys.argv[2]), 0):
        f.write(json.dumps({"completion": completion, "answer": answer}) + "\n")
PY
else
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l); print(json.dumps({"completion": d["completion"], "answer": d["task"]["answer"]}))' \
        "$root/tests/fixtures/math-answer-cases.jsonl" > "$work/pairs.jsonl"
fi
cd "$root"
bash scripts/build-plugins >/dev/null
for build in rust:plugins/target/wasm32-wasip2/release/math_answer.wasm python:plugins/target/python/math_answer.wasm \
    js:plugins/target/js/math_answer.wasm c:plugins/target/c/math_answer.wasm; do
    language=${build%%:*}
    cargo bench -q -p wirl-cli --bench reward -- "$work/pairs.jsonl" "$root/${build#*:}" > "$work/$language.json"
done
python3 - "$work" <<'PY'
import json, os, sys
print(f"{'language':<9}{'size MB':>9}{'compile s':>11}{'load ms':>9}{'inst. p50 ms':>14}{'fresh /s':>10}{'reused /s':>11}")
for language in ("rust", "python", "js", "c"):
    w = json.load(open(os.path.join(sys.argv[1], f"{language}.json")))
    print(f"{language:<9}{w['component_bytes'] / 1e6:>9.2f}{w['load_cold_ms'] / 1e3:>11.2f}{w['load_warm_ms']:>9.1f}"
          f"{w['fresh_instantiate_us']['p50'] / 1e3:>14.3f}{w['fresh_per_s']:>10,.0f}{w['reused_per_s']:>11,.0f}")
PY
