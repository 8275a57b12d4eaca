"""Reference scores from Hugging Face transformers for reward models as wirl loads them: a tiny
random-weight sequence classifier (`...ForSequenceClassification`: the decoder with a `score`
head, no bias, read at a text's last token) of each family, built and run by transformers in
float32.

For each family it writes `tests/fixtures/tiny-reward-<family>/` with the model as
transformers saves it (`config.json`, `model.safetensors`) and `reference.json`:

- `texts`: token sequences, each scored alone (`scores`: one value per label);
- `batch`: the same sequences right-padded with `pad_token_id` into one batch, scored by
  transformers at once (its rule: the rightmost token that is not the padding id), so that
  the fixture itself shows the batch and the single scores agree;
- one sequence ends in the padding id: transformers scores it at the token before.

The decoders are tiny_families.py's (Qwen3, Gemma 3) and two of the same size (Llama,
Qwen2 with q/k/v biases); weights from N(0, 0.5) as there. Qwen2's has two labels (the
others one, as reward models have), to check that every label's score is read.

Run with the peers' virtual environment (../shared/peers/setup.sh makes it; torch and
transformers are all it needs):

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/tiny_reward_models.py [FAMILY ...]
"""
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_families  # noqa: E402  (the same tiny decoders, and their randomization)

PAD = 0
# The last one ends in the padding id (0).
TEXTS = [[2, 17, 33, 5, 9], [40, 41, 42, 43, 44, 45, 46, 47], [3], [12, 30, 7, PAD]]


def llama():
    config = transformers.LlamaConfig(**tiny_families.TINY, num_hidden_layers=2, rms_norm_eps=1e-5,
                                      tie_word_embeddings=False, num_labels=1)
    return transformers.LlamaForSequenceClassification(config)


def qwen2():
    config = transformers.Qwen2Config(**tiny_families.TINY, num_hidden_layers=2, rms_norm_eps=1e-6,
                                      rope_theta=1_000_000.0, tie_word_embeddings=False, use_sliding_window=False,
                                      num_labels=2)
    return transformers.Qwen2ForSequenceClassification(config)


def qwen3():
    config = tiny_families.qwen3().config
    config.num_labels = 1
    return transformers.Qwen3ForSequenceClassification(config)


def gemma3():
    # Its final_logit_softcapping is set: transformers caps the language model's logits with
    # it, not a classifier's scores.
    config = tiny_families.gemma3().config
    config.num_labels = 1
    return transformers.Gemma3TextForSequenceClassification(config)


FAMILIES = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3, "gemma3": gemma3}


def reference(model):
    texts = []
    for ids in TEXTS:
        with torch.no_grad():
            scores = model(torch.tensor([ids])).logits[0]
        texts.append({"ids": ids, "scores": scores.tolist()})
    longest = max(len(ids) for ids in TEXTS)
    padded = [ids + [PAD] * (longest - len(ids)) for ids in TEXTS]
    with torch.no_grad():
        batch = model(torch.tensor(padded)).logits
    return {"transformers": transformers.__version__, "torch": torch.__version__, "pad_token_id": PAD,
            "texts": texts, "batch": batch.tolist()}


def main():
    torch.manual_seed(0)
    for family in tiny_families.chosen(FAMILIES):
        model = FAMILIES[family]()
        model.config.pad_token_id = PAD
        model = model.eval()
        tiny_families.randomize(model)
        out = tiny_families.save(model, f"tiny-reward-{family}", reference(model))
        print(family, "->", out, file=sys.stderr)


if __name__ == "__main__":
    main()
