#!/usr/bin/env bash
# Same-run A/B of CPU prefill between two commits (each built in release, as step-ab.sh does;
# AB_KEEP=DIR shares the builds): `wirl generate` of ONE token after a prompt of WORDS words
# (~2.9 tokens a word: 1,400 words are the 4,000-token prompt of the serving test
# `long_prompts_are_prefilled_in_slices...`) on MODEL (default: the default model), ROUNDS
# rounds alternating A, B. Prints each run's wall seconds, the medians and B/A (above 1: B is
# slower). Run on an idle machine.
#   bash benches/prefill-ab.sh BEFORE_COMMIT [AFTER_COMMIT]   # AFTER: the working tree
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
words=${WORDS:-1400}
rounds=${ROUNDS:-3}
model=${MODEL:-smollm2-135m-instruct}
cd "$root"
# shellcheck source=benches/ab-build.sh
source "$root/benches/ab-build.sh"
ab_build "${1:?give the commit to compare against}" "${2:-}"
prompt=$(python3 -c "import sys; print(' '.join(f'word{i % 50}' for i in range(int(sys.argv[1]))))" "$words")
for round in $(seq "$rounds"); do
    for side in A B; do
        start=$(date +%s.%N)
        "$work/wirl-$side" generate --model "$model" --prompt "$prompt" --max-tokens 1 --temperature 0 \
            > "$work/$side.txt" 2> "$work/$side.log" || { tail -3 "$work/$side.log" >&2; exit 1; }
        echo "$side $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$start" "$(date +%s.%N)")"
    done
    cmp -s "$work/A.txt" "$work/B.txt" || echo "round $round: A and B wrote different tokens"
done | tee "$work/runs.txt"
ab_medians "$work/runs.txt" s
