#!/usr/bin/env bash
# Same-run A/B of CPU decoding between two commits (each built in release, as step-ab.sh
# does; AB_KEEP=DIR shares the builds with it): `wirl generate` on the default model as an f32
# HF directory (`wirl model export`: dense weights, which the engine may fuse, where the
# default GGUF's Q4_1 blocks stay apart), ROWS rows x TOKENS tokens sampled at temperature 1
# with a fixed seed, ROUNDS rounds alternating A, B. Prints each run's tokens/s, the medians
# and B/A; the texts of A and B must be equal (same seed, same numbers).
#   bash benches/decode-ab.sh BEFORE_COMMIT [AFTER_COMMIT]   # AFTER: the working tree
# Run on an idle machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rows=${ROWS:-8}
tokens=${TOKENS:-128}
rounds=${ROUNDS:-5}
cd "$root"
# shellcheck source=benches/ab-build.sh
source "$root/benches/ab-build.sh"
ab_build "${1:?give the commit to compare against}" "${2:-}"
"$work/wirl-B" model export smollm2-135m-instruct "$work/hf" > /dev/null 2>&1
for round in $(seq "$rounds"); do
    for side in A B; do
        "$work/wirl-$side" generate --model "$work/hf" --prompt "The capital of France is" -n "$rows" \
            --max-tokens "$tokens" --ignore-eos --temperature 1 --seed 7 > "$work/$side.txt" 2> "$work/$side.log"
        echo "$side $(sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' "$work/$side.log" | tail -n1)"
    done
    cmp -s "$work/A.txt" "$work/B.txt" || echo "round $round: A and B sampled different texts"
done | tee "$work/runs.txt"
ab_medians "$work/runs.txt" tokens/s
