#!/usr/bin/env python3
"""What the sandbox costs a Python trainer per reward call: wirl.Reward("builtin:math-answer")
beside the peers' plain-Python reward of the same rule (../shared/peers/grpo_trl.py's
`correctness_reward`, copied here: 1.0 when the text inside <answer></answer> equals the
reference number), both called as TRL calls them (batches of 32 conversational completions),
in one run, alternating. Prints one JSON line: microseconds per completion for each, and the
ratio; and checks that both give the same rewards.

    .venv/bin/python benches/python_reward.py [--batches 300]
"""

import argparse
import json
import re
import statistics
import time

import wirl

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def correctness_reward(completions, answer, **kwargs):
    out = []
    for c, a in zip(completions, answer):
        text = c[-1]["content"] if isinstance(c, list) else c
        m = ANSWER_RE.search(text)
        got = None if m is None else m.group(1).strip().replace(",", "")
        try:
            out.append(1.0 if got is not None and abs(float(got) - float(a)) < 1e-6 else 0.0)
        except ValueError:
            out.append(0.0)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--reuse-instance", action="store_true", help="one instance per thread across calls")
    args = parser.parse_args()
    env = wirl.Environment("builtin:arithmetic", {"kind": "chain_sum", "min_terms": 2, "max_terms": 2})
    rows = env.dataset(32)
    prompts = [row["prompt"] for row in rows]
    answers = [row["answer"] for row in rows]
    completions = [[{"role": "assistant", "content": f"<answer>{int(a) + (i % 2)}</answer>"}] for i, a in enumerate(answers)]
    reward = wirl.Reward("builtin:math-answer", threads=args.threads, reuse_instance=args.reuse_instance)
    ours = reward(prompts=prompts, completions=completions, answer=answers)
    theirs = correctness_reward(completions=completions, answer=answers)
    assert ours == theirs, (ours, theirs)
    times = {"wirl": [], "python": []}
    for _ in range(args.batches):
        for name, call in (("wirl", reward), ("python", correctness_reward)):
            started = time.perf_counter()
            call(prompts=prompts, completions=completions, answer=answers)
            times[name].append((time.perf_counter() - started) / len(completions) * 1e6)
    wirl_us, python_us = statistics.median(times["wirl"]), statistics.median(times["python"])
    print(json.dumps({"batch": len(completions), "batches": args.batches, "threads": reward._native.threads, "reuse_instance": args.reuse_instance,
                      "wirl_us_per_completion": round(wirl_us, 2), "python_us_per_completion": round(python_us, 2),
                      "wirl_over_python": round(wirl_us / python_us, 1)}))


if __name__ == "__main__":
    main()
