"""transformers' own load of Gemma-3-270M's GGUF (scripts/fetch-gemma3-270m), greedy, for
wirl's engine to be compared with: a raw prompt (with the <bos> transformers adds) and a
chat prompt through the model's template.

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/gemma3_270m.py DIR
    wirl generate --model DIR/gemma-3-270m-q4_k_m.gguf --prompt "<bos>The capital of France is" \\
        --temperature 0 --max-tokens 16
    wirl generate --model DIR/gemma-3-270m-q4_k_m.gguf --chat "What is the capital of France?" \\
        --temperature 0 --max-tokens 24
"""
import sys

import torch
import transformers

directory = sys.argv[1]
tok = transformers.AutoTokenizer.from_pretrained(directory)
model = transformers.AutoModelForCausalLM.from_pretrained(
    directory, gguf_file="gemma-3-270m-q4_k_m.gguf", dtype=torch.float32).eval()
raw = tok("The capital of France is", return_tensors="pt").input_ids
chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                               add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
for name, ids, new in (("raw", raw, 16), ("chat", chat, 24)):
    out = model.generate(ids, max_new_tokens=new, do_sample=False)
    print(name, ids.shape[1], "prompt tokens:", repr(tok.decode(out[0][ids.shape[1]:])))
