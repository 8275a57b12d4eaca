"""Reference greedy continuations from llama.cpp for wirl's quantized path.

Runs the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) with llama-cpp-python as stored
(Q4_1 matrices, 8-bit activations, 2 threads) and writes
`tests/fixtures/llamacpp-greedy.json`: for a few prompts, the prompt's token ids and the
32-token greedy continuation (argmax of the last logits after each token, end-of-sequence
ignored). wirl's quantized CPU path multiplies Q4_1 as llama.cpp does, and its test expects
the same tokens.

Run once with the peers' virtual environment (../shared/peers/setup.sh makes it; the
llama-cpp-python build takes ~15 minutes on 2 cores):

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/llamacpp.py --gguf PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf

(`wirl model fetch` prints the path of the default model.)
"""
import argparse
import json
import os

import llama_cpp
import numpy as np
from llama_cpp import Llama

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    # The chat template's rendering of a question (as wirl's `--chat` renders it).
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]
GREEDY_TOKENS = 32


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True, help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                                                     "llamacpp-greedy.json"))
    args = parser.parse_args()

    llm = Llama(model_path=args.gguf, n_ctx=512, n_threads=2, n_threads_batch=2, seed=0, verbose=False)
    n_vocab = llm.n_vocab()

    def last_logits():
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))

    cases = []
    for text in PROMPTS:
        prompt = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(prompt)
        continuation = []
        for _ in range(GREEDY_TOKENS):
            token = int(np.argmax(last_logits()))
            continuation.append(token)
            llm.eval([token])
        cases.append({"text": text, "prompt": prompt, "continuation": continuation,
                      "continuation_text": llm.detokenize(continuation).decode(errors="replace")})
        print(repr(cases[-1]["continuation_text"]))

    with open(args.out, "w") as f:
        json.dump({"made_by": f"llama-cpp-python {llama_cpp.__version__}, scripts/reference/llamacpp.py",
                   "model": os.path.basename(args.gguf), "greedy": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
