#!/usr/bin/env python3
"""TRL's real GRPOTrainer with wirl's sandboxed reward plugin as its reward function.

    bash scripts/python-package                          # or WIRL_PYTHON=... for TRL's venv
    python examples/python/trl_grpo.py --model PATH_OR_HUB_ID [--steps 3]

Needs torch, transformers, trl and datasets beside wirl. It first checks that wirl.Reward
scores examples/score/*.jsonl exactly as `wirl score` does (the binary, where built), then
trains a few GRPO steps on CPU: the tasks come from wirl's `arithmetic` environment plugin
(wirl.Environment), the reward from its `math-answer` reward plugin (wirl.Reward), called by
TRL as any reward function. With `--task math-latex`: examples/math-latex's problems (LaTeX
answers in a `solution` column, as TRL's math recipes have them) scored by
`builtin:math-verify` in place of TRL's `accuracy_reward`. A call that fails in the sandbox would be None for TRL (left out
of the mean), never a 0; the verdict counts print at the end.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys

import wirl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCORED = {
    "math.jsonl": "builtin:math-answer",
    "math-verify.jsonl": "builtin:math-verify",
    "exact.jsonl": os.path.join(ROOT, "plugins", "target", "wasm32-wasip2", "release", "exact_match.wasm"),
}


def wirl_binary():
    built = os.path.join(ROOT, "target", "debug", "wirl")
    return built if os.path.exists(built) else shutil.which("wirl")


def check_against_wirl_score():
    """wirl.Reward on examples/score/*.jsonl: the same rewards and parts as `wirl score`."""
    binary = wirl_binary()
    for name, plugin in SCORED.items():
        path = os.path.join(ROOT, "examples", "score", name)
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        scores = wirl.Reward(plugin).score([r["task"] for r in records], [r["completion"] for r in records])
        ours = [(s.reward, s.parts) for s in scores]
        if binary is None:
            print(f"{name}: {len(ours)} scored (no wirl binary to compare with: cargo build -p wirl-cli)")
            continue
        out = subprocess.run([binary, "score", "--plugin", plugin, "--input", path], capture_output=True, text=True)
        theirs = [(t["reward"], t["parts"]) for t in map(json.loads, out.stdout.splitlines())]
        if ours != theirs:
            sys.exit(f"{name}: wirl.Reward and `wirl score` disagree:\n{ours}\n{theirs}")
        print(f"{name}: {len(ours)} of {len(ours)} scores equal `wirl score`'s")


class CountingReward(wirl.Reward):
    """wirl.Reward as TRL calls it, also counting each call's verdict (TRL sees the floats)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.verdicts = collections.Counter()
        self.samples = []

    def __call__(self, **kwargs):
        rewards = super().__call__(**kwargs)
        self.verdicts.update(score.verdict for score in self.last_scores)
        completion = kwargs["completions"][0]
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        self.samples.append((text, kwargs[self.answer_column][0], self.last_scores[0]))
        return rewards


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="an HF model directory or hub id (SmolLM2-135M-Instruct)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--output-dir", default="runs/trl-wirl")
    parser.add_argument("--task", choices=["arithmetic", "math-latex"], default="arithmetic")
    args = parser.parse_args()

    check_against_wirl_score()

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    if args.task == "math-latex":
        # MATH-style problems; the reward reads the `solution` column, as accuracy_reward does.
        with open(os.path.join(ROOT, "examples", "math-latex", "train.jsonl")) as f:
            rows = [json.loads(line) for line in f][: args.tasks]
        dataset = Dataset.from_list([{"prompt": r["messages"], "solution": r["answer"]} for r in rows])
        reward = CountingReward("builtin:math-verify", answer_column="solution")
    else:
        # The default job's task: 1-digit sums of two terms, with the peers' few-shot prompt.
        environment = wirl.Environment(
            "builtin:arithmetic", {"kind": "chain_sum", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
        )
        dataset = Dataset.from_list(environment.dataset(args.tasks))
        reward = CountingReward("builtin:math-answer")
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=128 if args.task == "math-latex" else 32,
        learning_rate=1e-5,
        beta=0.04,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=[reward], args=config, train_dataset=dataset)
    trainer.train()
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print(f"step {entry.get('step')}: reward {entry['reward']:.3f}  loss {entry.get('loss', float('nan')):.4f}")
    for completion, answer, score in reward.samples:
        print(f"  a completion: {completion!r:.60} (answer {answer}) -> {score.reward} ({score.note})")
    print(f"verdicts of {sum(reward.verdicts.values())} reward calls: {dict(reward.verdicts)}")


if __name__ == "__main__":
    main()
