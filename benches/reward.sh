#!/usr/bin/env bash
# Reward throughput, wirl's math-answer plugin beside the Python reward function of the peer
# harness, on the same 100k (completion, answer) pairs, single-threaded. Prints both JSON
# results and the ratios. Needs the peer scripts (WIRL_PEERS, default ../shared/peers next to
# this checkout); the Python peer needs only python3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${WIRL_PEERS:-$root/../shared/peers}
n=${N:-100000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

[ -f "$peers/reward_python.py" ] || { echo "peer scripts not found in $peers (set WIRL_PEERS)" >&2; exit 1; }
# The same pairs the Python peer scores: its own generator, written out once.
python3 - "$peers" "$n" "$work/pairs.jsonl" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from reward_python import make_pairs
with open(sys.argv[3], "w") as f:
    for completion, answer in make_pairs(int(sys.argv[2]), 0):
        f.write(json.dumps({"completion": completion, "answer": answer}) + "\n")
PY

cd "$root"
cargo bench -q -p wirl-cli --bench reward -- "$work/pairs.jsonl" > "$work/wirl.json"
PEERS_WAIT_IDLE=${PEERS_WAIT_IDLE:-60} python3 "$peers/reward_python.py" --n "$n" --repeats 5 2>/dev/null | tail -1 > "$work/python.json"
cat "$work/wirl.json" "$work/python.json"
python3 - "$work/wirl.json" "$work/python.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))
py = p["calls_per_s_median"]
print(f"python function      {py:>12,.0f} calls/s (unsandboxed, in-process)")
for mode in ("fresh", "reused", "batched8", "reused_batched8"):
    v = w[f"{mode}_per_s"]
    print(f"wirl {mode:<15} {v:>12,.0f} scores/s   {v / py:5.2f}x python")
print(f"fresh instantiate p50/p99 {w['fresh_instantiate_us']['p50']}/{w['fresh_instantiate_us']['p99']} us; "
      f"call p50/p99 {w['fresh_call_us']['p50']}/{w['fresh_call_us']['p99']} us")
print(f"load cold {w['load_cold_ms']:.1f} ms, warm {w['load_warm_ms']:.1f} ms ({w['component_bytes']} bytes)")
PY
