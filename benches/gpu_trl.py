#!/usr/bin/env python3
"""TRL's GRPOTrainer on the GPU, for scripts/gpu-check: the default job's shape (4 prompts
x 8 completions, 64 new tokens, lr 1e-5, beta 0.04, f32, or --bf16 for TRL's mixed precision) or a bigger one (--prompts 64
--max-tokens 256), on an HF directory that `wirl model export` wrote. The prompts are sums
of a few small integers in the default job's format, scored 1 when the last number of the
completion is the sum: the same shape of work as wirl's arithmetic task, not the same
bytes. Prints one JSON line: step times (median after the first), peak GPU memory."""
import argparse
import json
import random
import re
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--prompts", type=int, default=4)
ap.add_argument("--generations", type=int, default=8)
ap.add_argument("--max-tokens", type=int, default=64)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script off the GPU machine")
ap.add_argument("--bf16", action="store_true", help="TRL's bf16=True (autocast, f32 master weights): what its users run")
ap.add_argument("--tasks", help="a JSONL file as `wirl tasks` writes it: its prompts (messages) and answers, in order, "
                                "instead of generated sums (benches/gpu-scale.sh: the tasks wirl's run draws from)")
args = ap.parse_args()

rng = random.Random(args.seed)
rows = []
if args.tasks:
    for line in open(args.tasks):
        task = json.loads(line)["task"]
        rows.append({"prompt": task["messages"], "answer": task["answer"]})
    assert len(rows) >= args.prompts * args.steps, f"{args.tasks} has {len(rows)} tasks, the run takes {args.prompts * args.steps}"
for _ in range(0 if args.tasks else args.prompts * args.steps):
    terms = [rng.randint(1, 9) for _ in range(rng.randint(2, 4))]
    signs = [rng.choice("+-") for _ in terms[1:]]
    expression = str(terms[0]) + "".join(f" {s} {t}" for s, t in zip(signs, terms[1:]))
    answer = terms[0] + sum(t if s == "+" else -t for s, t in zip(signs, terms[1:]))
    rows.append({"prompt": [{"role": "user", "content": f"Compute {expression}. Answer with <answer>N</answer>."}],
                 "answer": str(answer)})


def correct(completions, answer, **_):
    scores = []
    for completion, want in zip(completions, answer):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        numbers = re.findall(r"-?\d+", text)
        scores.append(1.0 if numbers and numbers[-1] == want else 0.0)
    return scores


def synchronize():
    if args.device != "cpu":
        torch.cuda.synchronize()


class Times(TrainerCallback):
    def __init__(self):
        self.started, self.steps = None, []

    def on_step_begin(self, *_, **__):
        synchronize()
        self.started = time.perf_counter()

    def on_step_end(self, *_, **__):
        synchronize()
        self.steps.append(time.perf_counter() - self.started)


tok = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)
config = GRPOConfig(
    output_dir=tempfile.mkdtemp(prefix="gpu-trl-"), max_steps=args.steps, learning_rate=1e-5, beta=0.04,
    num_generations=args.generations, per_device_train_batch_size=args.prompts * args.generations,
    gradient_accumulation_steps=1, max_completion_length=args.max_tokens, logging_steps=1,
    save_strategy="no", report_to=[], seed=args.seed, bf16=args.bf16, temperature=1.0,
    use_cpu=args.device == "cpu",
)
times = Times()
trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[correct], args=config,
                      train_dataset=Dataset.from_list(rows), callbacks=[times])
gpu = args.device != "cpu"
if gpu:
    torch.cuda.reset_peak_memory_stats()
trainer.train()
print(json.dumps({
    "check": "trl", "pass": True, "peer": "trl", "version": __import__("trl").__version__,
    "device": torch.cuda.get_device_name(0) if gpu else "cpu", "prompts": args.prompts, "generations": args.generations,
    "max_tokens": args.max_tokens, "gradient_checkpointing": config.gradient_checkpointing, "bf16": args.bf16,
    "steps": len(times.steps), "step_s": [round(s, 3) for s in times.steps],
    "step_s_median_after_first": round(statistics.median(times.steps[1:] or times.steps), 3),
    "peak_gpu_mib_allocated": torch.cuda.max_memory_allocated() // (1 << 20) if gpu else None,
    "peak_gpu_mib_reserved": torch.cuda.max_memory_reserved() // (1 << 20) if gpu else None,
}))
