"""A model with Qwen3-0.6B's shapes and random weights, as transformers builds it, for the
0.6B-class training bench (benches/qwen3-0.6b.sh): 28 layers, hidden 1024, 16 query heads
and 8 key/value heads of 128, MLP 3072, per-head q/k norms, tied head, rope base 1e6 — and
the vocabulary of the tokenizer it is given (SmolLM2's 49,152 tokens: Qwen3's own 151,936
are not on this machine), so that wirl and TRL run the same prompts through the same model.

    python benches/qwen3_shaped.py TOKENIZER_DIR OUT_DIR

Weights: transformers' own initialization (N(0, 0.02)), seeded; saved in float32.
"""
import json
import os
import shutil
import sys

import torch
import transformers

tokenizer_dir, out = sys.argv[1], sys.argv[2]
with open(os.path.join(tokenizer_dir, "config.json")) as f:
    source = json.load(f)
torch.manual_seed(0)
config = transformers.Qwen3Config(
    vocab_size=source["vocab_size"],
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    attention_bias=False,
    use_sliding_window=False,
    bos_token_id=source.get("bos_token_id"),
    eos_token_id=source.get("eos_token_id"),
)
model = transformers.Qwen3ForCausalLM(config).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"):
    path = os.path.join(tokenizer_dir, name)
    if os.path.exists(path):
        shutil.copy(path, os.path.join(out, name))
print(sum(p.numel() for p in model.parameters()), "parameters ->", out, file=sys.stderr)
