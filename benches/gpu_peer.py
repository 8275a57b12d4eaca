#!/usr/bin/env python3
"""The transformers peer on a GPU, for benches/gpu.sh: batch-1 greedy decode and
group sampling (8 x 128 from one prompt) with `generate`, bf16 on CUDA, from an HF
directory that `wirl model export` wrote. Prints one JSON line."""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to("cuda").eval()
ids = tok("The capital of France is", return_tensors="pt").input_ids.to("cuda")


def timed(**kw):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids.repeat(kw.pop("batch", 1), 1), pad_token_id=tok.eos_token_id, **kw)
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


with torch.no_grad():
    timed(max_new_tokens=16, do_sample=False)  # warm-up
    out, dt = timed(max_new_tokens=32, do_sample=False)
    greedy = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    _, dt1 = timed(max_new_tokens=256, min_new_tokens=256, do_sample=False)
    _, dt8 = timed(batch=8, max_new_tokens=128, min_new_tokens=128, do_sample=True, temperature=1.0)
print(json.dumps({
    "peer": "transformers", "version": __import__("transformers").__version__, "dtype": "bf16",
    "device": torch.cuda.get_device_name(0), "greedy_32": greedy,
    "bs1_decode_tok_s": round(256 / dt1, 1), "group_8x128_tok_s": round(8 * 128 / dt8, 1),
}))
