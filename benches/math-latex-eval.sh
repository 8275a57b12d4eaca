#!/usr/bin/env bash
# A model on examples/train/math-latex.toml's 60 held-out problems (LaTeX answers), scored
# by builtin:math-verify and by builtin:math-answer in the same run: greedy pass rate under
# each, and the problems where the two verifiers disagree.
#   bash benches/math-latex-eval.sh              # the config's model (SmolLM2-135M)
#   MODEL=path bash benches/math-latex-eval.sh   # another model or checkpoint
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build -q --release -p wirl-cli
wirl=$root/target/release/wirl
config=examples/train/math-latex.toml
# The same config with the other reward, next to it (its dataset paths are relative to it).
other=examples/train/.math-latex-answer.$$.toml
work=$(mktemp -d)
trap 'rm -rf "$work" "$other"' EXIT
sed 's/builtin:math-verify/builtin:math-answer/; /^config = { float_rounding/d' "$config" > "$other"
model=()
[ -n "${MODEL:-}" ] && model=(--model "$MODEL")
for verifier in math-verify math-answer; do
    file=$config
    [ "$verifier" = math-answer ] && file=$other
    "$wirl" eval "$file" "${model[@]}" --output "$work/$verifier.jsonl" > "$work/$verifier.json" 2> "$work/$verifier.log" ||
        { tail -20 "$work/$verifier.log" >&2; exit 1; }
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
rows = {v: {json.loads(l)["task_id"]: json.loads(l) for l in open(f"{work}/{v}.jsonl")} for v in ("math-verify", "math-answer")}
tasks = {json.loads(l)["id"]: json.loads(l) for l in open("examples/math-latex/eval.jsonl")}
for v, by_id in rows.items():
    passed = sum(r["greedy"]["passed"] for r in by_id.values())
    print(json.dumps({"verifier": v, "greedy_pass": passed, "of": len(by_id), "rate": round(passed / len(by_id), 3)}))
for task_id, row in rows["math-verify"].items():
    other = rows["math-answer"][task_id]
    if row["greedy"]["passed"] != other["greedy"]["passed"]:
        print(json.dumps({"disagree": task_id, "answer": tasks[task_id]["answer"], "math_verify": row["greedy"]["passed"],
                          "math_answer": other["greedy"]["passed"], "completion": row["greedy"]["completion"][-160:]}))
PY
