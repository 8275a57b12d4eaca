"""Reference values from Hugging Face transformers for wirl's engine tests.

Loads the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) with transformers, dequantized
to float32 exactly as wirl's dense path does, and writes `tests/fixtures/smollm2-reference.json`:

- `tokenizer`: HF token ids of a corpus with digits, unicode, emoji, code and chat special
  tokens (wirl builds its tokenizer from the GGUF metadata and must give the same ids);
- `logits`: for a few fixed prompts, every position's logits at a fixed subset of the
  vocabulary (a stride plus each position's top 8), and each position's full-vocabulary argmax;
- `greedy`: 32-token greedy continuations (argmax of the full forward, end-of-sequence
  ignored).

Run once with the peers' virtual environment (../shared/peers/setup.sh makes it):

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/smollm2.py --gguf PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf

(`wirl model fetch` prints the path of the default model.)
"""
import argparse
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

CORPUS = [
    "Hello, world!",
    "12345 + 678 = 13023; 3.14159 and -0.5e10",
    "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji: 😀🎉👍🏽 and a family 👨‍👩‍👧",
    "def add(a, b):\n    return a + b  # tabs\tand\n\n  spaces",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "   leading and trailing spaces   ",
    "line one\r\nline two\n\n\nfour newlines\n\n\n\n",
    "{\"json\": [1, 2, {\"k\": null}], \"s\": \"\\u00e9\"}",
    "<answer>42</answer> \\boxed{3/4}",
]

CHAT = [
    {"role": "system", "content": "Answer with the final number inside <answer></answer> tags."},
    {"role": "user", "content": "State the final answer to the following arithmetic problem: 2 + 3 ="},
]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    None,  # the chat prompt, rendered with the model's template
]
GREEDY_TOKENS = 32
STRIDE = 769
TOP = 8


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True, help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                     "smollm2-reference.json"))
    args = parser.parse_args()
    directory, name = os.path.split(os.path.abspath(args.gguf))
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval()

    tokenizer_ids = [{"text": text, "ids": tokenizer.encode(text, add_special_tokens=False)} for text in CORPUS]

    prompts = []
    for text in PROMPTS:
        if text is None:
            text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        prompts.append({"text": text, "ids": tokenizer.encode(text, add_special_tokens=False)})

    vocab = model.config.vocab_size
    with torch.no_grad():
        full = [model(torch.tensor([p["ids"]])).logits[0] for p in prompts]
        columns = set(range(0, vocab, STRIDE))
        for logits in full:
            columns.update(torch.topk(logits, TOP, dim=-1).indices.flatten().tolist())
        columns = sorted(columns)
        index = torch.tensor(columns)
        logit_entries = []
        for prompt, logits in zip(prompts, full):
            logit_entries.append({
                "ids": prompt["ids"],
                "argmax": logits.argmax(-1).tolist(),
                "values": [[round(v, 5) for v in row] for row in logits[:, index].tolist()],
            })

        greedy = []
        for prompt in prompts:
            ids = list(prompt["ids"])
            for _ in range(GREEDY_TOKENS):
                logits = model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmax()))
            greedy.append({"prompt": prompt["ids"], "continuation": ids[len(prompt["ids"]):],
                           "text": tokenizer.decode(ids[len(prompt["ids"]):])})

    fixture = {
        "made_by": "scripts/reference/smollm2.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": name,
        "tokenizer": tokenizer_ids,
        "columns": columns,
        "logits": logit_entries,
        "greedy": greedy,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
