#!/usr/bin/env bash
# Engine throughput beside the peers: wirl's engine bench (benches/engine.rs) and, where the
# peers' venv has them, transformers (decode_hf.py) and llama.cpp (decode_llamacpp.py) run
# now on the same machine; a peer that is not installed is shown with the figure recorded
# in ../shared/peers/README.md, marked "recorded". Prints both sides and the ratios.
#   bash benches/engine.sh            # REPS=5 by default
# Run on an idle machine: on 2 cores any other load ruins every number here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${WIRL_PEERS:-$root/../shared/peers}
venv=${PEERS_VENV:-$HOME/.cache/wirl-peers/venv}
reps=${REPS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"

model=$(cargo run -q -p wirl-cli -- model fetch)
cargo bench -q -p wirl-engine --bench engine -- "$model" "$reps" > "$work/wirl.json"

run_peer() { # run_peer NAME MODULE ARGS...: the peer's JSON line, or nothing
    local name=$1 module=$2
    shift 2
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $module" 2>/dev/null; then
        PEERS_WAIT_IDLE=${PEERS_WAIT_IDLE:-60} "$venv/bin/python" "$peers/$name.py" "$@" 2>"$work/$name.log" | tail -1
    fi
}
run_peer decode_hf transformers --reps "$reps" --reps-big "$reps" --no-save > "$work/hf.json" || true
run_peer decode_llamacpp llama_cpp --reps "$reps" > "$work/llamacpp.json" || true
cat "$work/wirl.json" "$work/hf.json" "$work/llamacpp.json"
python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
w = json.load(open(os.path.join(work, "wirl.json")))
def peer(name):
    path = os.path.join(work, name)
    text = open(path).read().strip() if os.path.exists(path) else ""
    return json.loads(text) if text else None
def at(d, path):
    """The number at `path` (keys, outer first) in a peer's JSON, or None."""
    for key in path:
        d = d.get(key) if isinstance(d, dict) else None
    return d if isinstance(d, (int, float)) else None
hf, lc = peer("hf.json"), peer("llamacpp.json")
# Figures recorded in ../shared/peers/README.md (2 vCPU, idle), used when a peer is absent.
recorded = {"lc_decode": 85.1, "lc_prefill_ms": 267, "hf_bs1": 22.3, "hf_bs8": 71.8, "hf_prefill_ms": 130}
def value(live, path, fallback):
    v = at(live, path) if live else None
    return (v, "now") if v is not None else (recorded[fallback], "recorded")
rows = [
    ("bs1 decode, Q4_1 vs llama.cpp", w["q4_1_bs1_decode_tok_s"], value(lc, ["decode_tok_per_s_median"], "lc_decode"), 0.8, "tok/s"),
    ("bs1 sample, f32 vs transformers", w["f32_bs1_sample_tok_s"], value(hf, ["bs1_sample", "tok_per_s_median"], "hf_bs1"), 1.5, "tok/s"),
    ("group 8x128, f32 vs transformers bs8", w["f32_group8_tok_s"], value(hf, ["bs8_sample", "tok_per_s_median"], "hf_bs8"), 3.0, "tok/s"),
]
print(f"{'':40} {'wirl':>9} {'peer':>9}  ratio  goal")
for name, ours, (theirs, when), goal, unit in rows:
    print(f"{name:40} {ours:9.1f} {theirs:9.1f}  {ours / theirs:5.2f}x  >= {goal}x  ({unit}; peer {when})")
for label, ours, (theirs, when) in [
    ("prefill 64, Q4_1 vs llama.cpp", w["q4_1_prefill64_ms"], value(lc, ["prefill_ms_median"], "lc_prefill_ms")),
    ("prefill 64, f32 vs transformers", w["f32_prefill64_ms"], value(hf, ["prefill_bs1_ms_median"], "hf_prefill_ms")),
]:
    print(f"{label:40} {ours:7.0f} ms {theirs:7.0f} ms  {theirs / ours:5.2f}x speed  (peer {when})")
print(f"peak RSS: {w['peak_rss_after_q4_1_mib']:.0f} MiB after the Q4_1 runs, {w['peak_rss_after_f32_mib']:.0f} MiB after f32")
# Half-precision weights beside f32, same run, and each format's log-prob mismatch against
# f32 (f32's greedy continuation teacher-forced).
print(f"bf16 vs f32: bs1 decode {w['bf16_bs1_decode_tok_s']:.1f} vs {w['f32_bs1_decode_tok_s']:.1f} tok/s "
      f"({w['bf16_bs1_decode_tok_s'] / w['f32_bs1_decode_tok_s']:.2f}x), group 8x128 {w['bf16_group8_tok_s']:.1f} vs "
      f"{w['f32_group8_tok_s']:.1f} tok/s ({w['bf16_group8_tok_s'] / w['f32_group8_tok_s']:.2f}x)")
for label in ("q4_1", "bf16"):
    print(f"{label}: |Δ log p| against f32: max {w[label + '_logprob_delta_max']:.4f}, "
          f"mean {w[label + '_logprob_delta_mean']:.5f}")
PY
