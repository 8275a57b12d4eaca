#!/usr/bin/env bash
# SandboxFusion's /run_code as wirl serves it, beside a `python3` subprocess per program with
# rlimits, in the same run (benches/sandbox_http.py): programs/s and p50/p99 latency at 1 and
# 32 concurrent clients, HumanEval's 164 programs and a short one; a short one in JavaScript
# Lua and Ruby beside `node`, `lua5.4` and `ruby` subprocesses (where installed). Release build.
#   bash benches/sandbox.sh            # WORKERS (default: the cores), REPS=2
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/build-plugins >/dev/null
cargo build -q --release -p wirl-cli
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
python3 benches/sandbox_http.py --wirl target/release/wirl --runner plugins/target/python/code_runner.wasm \
    --humaneval examples/humaneval/HumanEval.jsonl --workers "${WORKERS:-$(nproc)}" --reps "${REPS:-2}" \
    --other nodejs=plugins/target/js/code_runner.wasm --other lua=plugins/target/c/lua_runner.wasm \
    --other ruby=plugins/target/prebuilt/ruby_runner.wasm
