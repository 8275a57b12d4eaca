#!/usr/bin/env bash
# wirl serve beside llama.cpp's server (llama-cpp-python's, the same GGUF, 2 threads): 1, 8
# and 32 concurrent streaming clients (the peer queues them: --interrupt_requests False, else
# each new request cuts the one streaming), the same prompts and settings (chat, 64 new tokens,
# temperature 0.8), one server at a time; then 8 clients again with one ~4,000-token prompt
# sent just before them (head-of-line blocking: the short requests' first-token latency).
# Prints each run's JSON line and the ratios (aggregate tokens/s, first-token latency).
#   bash benches/serve.sh                 # PEERS_SERVE_VENV: a venv with llama-cpp-python[server]
# The peer's venv: python3 -m venv ~/.cache/wirl-peers/serve-venv && CMAKE_ARGS="-DGGML_NATIVE=ON"
#   ~/.cache/wirl-peers/serve-venv/bin/pip install --no-binary llama-cpp-python "llama-cpp-python[server]==0.3.36"
# Run on an idle machine: on 2 cores any other load ruins every number here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${PEERS_SERVE_VENV:-$HOME/.cache/wirl-peers/serve-venv}
max_tokens=${MAX_TOKENS:-64}
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
cd "$root"

cargo build -q --release -p wirl-cli
wirl=target/release/wirl
model=$("$wirl" model fetch)

wait_up() { # wait_up URL: until /v1/models answers (at most 120 s)
    for _ in $(seq 240); do
        curl -sf "$1/v1/models" > /dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "no server at $1" >&2
    return 1
}

load() { # load NAME URL: the three client counts
    local name=$1 url=$2
    python3 benches/serve_load.py "$url" --name "$name" --clients 1 --requests 6 --max-tokens "$max_tokens" # warm-up
    python3 benches/serve_load.py "$url" --name "$name" --clients 1 --requests 8 --max-tokens "$max_tokens" >> "$work/$name.jsonl"
    python3 benches/serve_load.py "$url" --name "$name" --clients 8 --requests 32 --max-tokens "$max_tokens" >> "$work/$name.jsonl"
    python3 benches/serve_load.py "$url" --name "$name" --clients 32 --requests 64 --max-tokens "$max_tokens" >> "$work/$name.jsonl"
    python3 benches/serve_load.py "$url" --name "$name" --clients 8 --requests 32 --max-tokens "$max_tokens" \
        --long-prompt-words 1400 >> "$work/$name-long.jsonl"
}

# wirl twice: its f32 weights (dequantized, what the trainer's log-probs match) and the
# GGUF's Q4_1 weights as stored (--quantized, what llama.cpp runs).
for mode in wirl wirl-quantized; do
    flags=()
    [ "$mode" = wirl-quantized ] && flags=(--quantized)
    "$wirl" serve --model "$model" --port 18601 --max-concurrent 64 "${flags[@]}" 2> "$work/$mode.log" &
    pids+=($!)
    wait_up http://127.0.0.1:18601
    load "$mode" http://127.0.0.1:18601 > /dev/null
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
done

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    "$venv/bin/python" -m llama_cpp.server --model "$model" --n_threads 2 --n_threads_batch 2 --n_ctx 8192 \
        --interrupt_requests False --host 127.0.0.1 --port 18602 > "$work/llama.log" 2>&1 &
    pids+=($!)
    wait_up http://127.0.0.1:18602
    load llamacpp http://127.0.0.1:18602 > /dev/null
else
    echo "llama-cpp-python[server] is not in $venv: only wirl's figures (see the header for the venv)" >&2
fi

cat "$work"/*.jsonl
python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
def runs(name):
    path = os.path.join(work, f"{name}.jsonl")
    return {r["clients"]: r for r in map(json.loads, open(path))} if os.path.exists(path) else {}
peer = runs("llamacpp")
print(f"{'server':>15} {'clients':>7} {'tok/s':>7} {'llama tok/s':>11} {'ratio':>6} {'TTFT p50':>8} {'llama TTFT':>10} {'p50/p99 s':>13} {'llama p50/p99 s':>15}")
for name in ("wirl", "wirl-quantized"):
    for c, w in sorted(runs(name).items()):
        p = peer.get(c)
        ratio = f"{w['tokens_per_s'] / p['tokens_per_s']:.2f}x" if p else "-"
        print(f"{name:>15} {c:>7} {w['tokens_per_s']:>7} {p['tokens_per_s'] if p else '-':>11} {ratio:>6} "
              f"{w['ttft_p50_s']:>8} {p['ttft_p50_s'] if p else '-':>10} "
              f"{str(w['latency_p50_s']) + '/' + str(w['latency_p99_s']):>13} "
              f"{(str(p['latency_p50_s']) + '/' + str(p['latency_p99_s'])) if p else '-':>15}")
print()
print("8 short clients with one ~4,000-token prompt sent just before them:")
print(f"{'server':>15} {'tok/s':>7} {'TTFT p50/p99 s':>15} {'latency p50/p99 s':>18} {'long prompt':>30}")
for name in ("wirl", "wirl-quantized", "llamacpp"):
    for r in runs(f"{name}-long").values():
        long = r["long_prompt"]
        print(f"{name:>15} {r['tokens_per_s']:>7} {str(r['ttft_p50_s']) + '/' + str(r['ttft_p99_s']):>15} "
              f"{str(r['latency_p50_s']) + '/' + str(r['latency_p99_s']):>18} "
              f"{str(long.get('prompt_tokens')) + ' tokens, ' + str(long.get('latency_s')) + ' s':>30}")
PY
