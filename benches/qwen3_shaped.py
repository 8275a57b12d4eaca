"""A model with Qwen3-0.6B's shapes and random weights, as transformers builds it, for the
0.6B-class training bench (benches/qwen3-0.6b.sh): 28 layers, hidden 1024, 16 query heads
and 8 key/value heads of 128, MLP 3072, per-head q/k norms, tied head, rope base 1e6 — and
the vocabulary of the tokenizer it is given (SmolLM2's 49,152 tokens: Qwen3's own 151,936
are not on this machine), so that wirl and TRL run the same prompts through the same model.

    python benches/qwen3_shaped.py TOKENIZER_DIR OUT_DIR [--size 0.6B|1.7B|4B|8B] [--dtype f32|bf16] [--device cuda]

Weights: transformers' own initialization (N(0, 0.02)), seeded; saved in float32 (or
bf16). The other sizes (benches/gpu-scale.sh) have Qwen3-1.7B's, 4B's and 8B's shapes
(8B's head untied), built on the GPU when --device cuda (8B in ~20 s there).
"""
import argparse
import json
import os
import shutil
import sys

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("tokenizer_dir")
ap.add_argument("out")
ap.add_argument("--size", default="0.6B")
ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
ap.add_argument("--device", default="cpu")
args = ap.parse_args()
tokenizer_dir, out = args.tokenizer_dir, args.out
# Qwen3's published shapes: hidden, MLP, layers, query heads, tied head (8 key/value heads
# of 128 in every size).
SHAPES = {
    "0.6B": (1024, 3072, 28, 16, True),
    "1.7B": (2048, 6144, 28, 16, True),
    "4B": (2560, 9728, 36, 32, True),
    "8B": (4096, 12288, 36, 32, False),
}
hidden, mlp, layers, heads, tied = SHAPES[args.size]
with open(os.path.join(tokenizer_dir, "config.json")) as f:
    source = json.load(f)
torch.manual_seed(0)
config = transformers.Qwen3Config(
    vocab_size=source["vocab_size"],
    hidden_size=hidden,
    intermediate_size=mlp,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=tied,
    attention_bias=False,
    use_sliding_window=False,
    bos_token_id=source.get("bos_token_id"),
    eos_token_id=source.get("eos_token_id"),
)
dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
with torch.device(args.device):
    torch.set_default_dtype(dtype)
    model = transformers.Qwen3ForCausalLM(config).to(dtype)
model.save_pretrained(out, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"):
    path = os.path.join(tokenizer_dir, name)
    if os.path.exists(path):
        shutil.copy(path, os.path.join(out, name))
print(sum(p.numel() for p in model.parameters()), "parameters ->", out, file=sys.stderr)
