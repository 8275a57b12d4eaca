#!/usr/bin/env bash
# builtin:math-verify beside Math-Verify (PyPI math-verify, the peers' venv), in one run:
# agreement with Math-Verify's own verdicts (made in this run) on the differential corpus,
# by class, with builtin:math-answer's beside it; per-answer p50/p99 and answers per second
# (Math-Verify: verify(parse(), parse()) in one process; wirl: `wirl score`, one process);
# then answers built to hang a verifier, each timed on both sides (Math-Verify in a child
# killed after HOSTILE_TIMEOUT seconds, default 60: once with its 5 s signal timeouts, once
# without them, as a multi-threaded trainer must run it).
#   bash benches/math-verify.sh                 # the committed corpus
#   CORPUS=file.jsonl bash benches/math-verify.sh
#   MV_TESTS=DIR bash benches/math-verify.sh    # Math-Verify's own test cases (DIR: a checkout's tests/)
# Run on an idle machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$HOME/.cache/wirl-peers}
python=$peers/venv/bin/python
"$python" -c "import math_verify" 2>/dev/null || { echo "no math-verify in $peers/venv: run ../shared/peers/setup.sh" >&2; exit 1; }
cd "$root"
cargo build -q --release -p wirl-cli
corpus=${CORPUS:-plugins/rust/math-verify/tests/corpus.jsonl}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${MV_TESTS:-}" ]; then
    "$python" scripts/math-verify-corpus.py --tests "$MV_TESTS" > "$work/own.jsonl"
    corpus=$work/own.jsonl
fi
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
"$python" benches/math_verify_peer.py target/release/wirl "$corpus" --hostile --hostile-timeout "${HOSTILE_TIMEOUT:-60}"
