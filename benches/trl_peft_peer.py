"""The peer of benches/qwen3-0.6b.sh: TRL's GRPOTrainer (with PEFT's LoRA, or every weight)
on CPU in float32, on the same model directory and the same prompts as wirl's run; and of
benches/gpu-scale.sh on a GPU (--device cuda --bf16: TRL's mixed precision, what its users
run there).

Prompts: the `messages` of a JSONL file as `wirl tasks` writes it (wirl's arithmetic
environment, with its few-shot turns), as chat prompts. Reward: the completion's length in
characters (what the bench's reward plugin, plugins/tests/hostile, scores for ordinary
text): a random-weight model never answers, and GRPO needs rewards that differ within a group.
Sizes: PROMPTS prompts x GENERATIONS completions per optimizer step (one generate() call;
--micro-batch completions per forward/backward, gradient accumulation over the rest;
--grad-checkpointing), MAX_TOKENS new tokens, temperature 1, constant learning rate, KL beta to the
reference (PEFT's: the base with adapters off; full: TRL's reference copy).

    python trl_peft_peer.py --model DIR --tasks tasks.jsonl --steps 3 [--lora-rank 16 --lora-alpha 32]

Last stdout line: JSON with the steps' seconds and their median.
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--lora-rank", type=int, default=0, help="0: train every weight")
    ap.add_argument("--lora-alpha", type=float, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="completions per forward/backward (gradient accumulation for the rest); 0: all")
    ap.add_argument("--grad-checkpointing", action="store_true")
    ap.add_argument("--base-dtype", choices=["f32", "bf16"], default="f32",
                    help="the dtype the model is loaded in (with LoRA, PEFT keeps the adapters in f32)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bf16", action="store_true", help="TRL's bf16=True (autocast over f32 master weights)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    dtype = torch.bfloat16 if args.base_dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    rows = [json.loads(line)["task"] for line in open(args.tasks)]
    dataset = Dataset.from_list([{"prompt": row["messages"]} for row in rows])

    def length_reward(completions, **kwargs):
        return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.started, self.steps = None, []

        def on_step_begin(self, a, state, control, **kw):
            self.started = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.steps.append(time.perf_counter() - self.started)
            print(f"[peer] step {state.global_step}: {self.steps[-1]:.1f}s", file=sys.stderr, flush=True)

    peft_config = None
    if args.lora_rank > 0:
        from peft import LoraConfig
        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"], task_type="CAUSAL_LM")
    total = args.prompts * args.generations
    micro = args.micro_batch or total
    assert total % micro == 0, "the micro-batch must divide prompts x generations"
    config = GRPOConfig(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "trl-peft-peer"),
        per_device_train_batch_size=micro, gradient_accumulation_steps=total // micro,
        num_generations=args.generations,
        max_completion_length=args.max_tokens, temperature=1.0, learning_rate=args.lr,
        lr_scheduler_type="constant", beta=args.beta, max_steps=args.steps, logging_steps=1, save_strategy="no",
        report_to="none", bf16=args.bf16, fp16=False, use_vllm=False, use_cpu=args.device == "cpu",
        gradient_checkpointing=args.grad_checkpointing,
        seed=0, dataloader_num_workers=0, dataloader_pin_memory=False, disable_tqdm=True)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[length_reward], args=config,
                          train_dataset=dataset, callbacks=[timer], peft_config=peft_config)
    trainer.train()
    assert config.generation_batch_size == total, config.generation_batch_size
    print(json.dumps({"system": "trl+peft" if peft_config else "trl", "steps": len(timer.steps),
                      "micro_batch": micro, "grad_checkpointing": args.grad_checkpointing,
                      "step_s": [round(s, 2) for s in timer.steps],
                      "step_s_median": round(statistics.median(timer.steps), 2),
                      "device": args.device, "bf16": args.bf16, "base_dtype": args.base_dtype,
                      "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20) if args.device == "cuda" else None}))


if __name__ == "__main__":
    main()
