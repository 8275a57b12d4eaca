#!/usr/bin/env python3
"""transformers' `generate` on the GPU, for benches/gpu-scale.sh: on an HF directory (a
Qwen3-shaped random model), bf16, the same two decodes wirl runs — ROWS rows sampled at
temperature 1 from one prompt, and one row greedy — each TOKENS new tokens (no early stop).
Warmed up first. Prints one JSON line: tokens/s of each.

    python benches/gpu_scale_peer.py MODEL_DIR [--rows 64] [--tokens 256]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--rows", type=int, default=64)
ap.add_argument("--tokens", type=int, default=256)
args = ap.parse_args()

tok = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda").eval()
ids = tok("The capital of France is", return_tensors="pt").input_ids.to("cuda")


def timed(rows, tokens, sample):
    torch.cuda.synchronize()
    started = time.perf_counter()
    model.generate(ids.repeat(rows, 1), pad_token_id=tok.eos_token_id, max_new_tokens=tokens, min_new_tokens=tokens,
                   do_sample=sample, temperature=1.0 if sample else None, top_k=0 if sample else None,
                   top_p=1.0 if sample else None)
    torch.cuda.synchronize()
    return time.perf_counter() - started


with torch.no_grad():
    timed(args.rows, 8, True)  # warm-up: kernels, the allocator
    timed(1, 8, False)
    many = timed(args.rows, args.tokens, True)
    one = timed(1, args.tokens, False)
print(json.dumps({
    "system": "transformers", "version": __import__("transformers").__version__, "dtype": "bf16",
    "device": torch.cuda.get_device_name(0), "rows": args.rows, "tokens": args.tokens,
    "rows_tok_s": round(args.rows * args.tokens / many, 1), "bs1_tok_s": round(args.tokens / one, 1),
    "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20),
}))
