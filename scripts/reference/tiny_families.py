"""Reference values from Hugging Face transformers for the model families wirl's engine runs
beyond Llama: a tiny random-weight model of each, built and run by transformers in float32.

For each family it writes `tests/fixtures/tiny-<family>/` with the model as transformers saves
it (`config.json`, `model.safetensors`) and `reference.json`:

- `logits`: for a few fixed token sequences, every position's logits over the whole
  (tiny) vocabulary;
- `greedy`: 12-token greedy continuations (argmax of the full forward each step).

The weights are drawn from N(0, 0.5) (norm weights around 1) instead of transformers'
N(0, 0.02), so that logits spread and greedy choices are not near-ties. The vocabulary is the
tests' tiny word-level one (64 ids); wirl's tests add its tokenizer files.

Run with the peers' virtual environment (../shared/peers/setup.sh makes it):

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/tiny_families.py
"""
import json
import os
import sys

import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SEQUENCES = [[2, 17, 33, 5, 9], [40, 41, 42, 43, 44, 45, 46, 47], [3]]
VOCAB = 64


def qwen3():
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        # Not hidden_size / heads (8): Qwen3 gives head_dim apart.
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        eos_token_id=1,
        bos_token_id=None,
    )
    return transformers.Qwen3ForCausalLM(config)


def gemma3():
    # Three layers, the middle one global: sliding layers with a window of 3 positions (the
    # test sequences are longer), their own rope base; queries scaled by 24^-1/2, not
    # head_dim's; logits soft-capped (Gemma 3's configs leave it null, Gemma 2's set 30:
    # here set, to test it).
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        final_logit_softcapping=30.0,
        attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        attention_bias=False,
        eos_token_id=1,
        bos_token_id=None,
        pad_token_id=0,
    )
    return transformers.Gemma3ForCausalLM(config)


FAMILIES = {"qwen3": qwen3, "gemma3": gemma3}


def randomize(model):
    generator = torch.Generator().manual_seed(0)
    # Gemma's norms scale by 1 + w: weights around 0 there, around 1 elsewhere.
    norm_centre = 0.0 if model.config.model_type == "gemma3_text" else 1.0
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.5
            if name.endswith("norm.weight"):
                parameter.copy_(norm_centre + 0.2 * noise)
            else:
                parameter.copy_(noise)


def reference(model):
    logits = []
    for ids in SEQUENCES:
        with torch.no_grad():
            out = model(torch.tensor([ids])).logits[0]
        logits.append({"ids": ids, "values": out.tolist()})
    greedy = []
    for ids in SEQUENCES:
        sequence = list(ids)
        for _ in range(12):
            with torch.no_grad():
                out = model(torch.tensor([sequence])).logits[0, -1]
            sequence.append(int(out.argmax()))
        greedy.append({"prompt": ids, "continuation": sequence[len(ids):]})
    return {"transformers": transformers.__version__, "torch": torch.__version__, "logits": logits,
            "greedy": greedy}


def main():
    torch.manual_seed(0)
    for family, build in FAMILIES.items():
        model = build().eval()
        randomize(model)
        out = os.path.join(ROOT, "tests", "fixtures", f"tiny-{family}")
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        for extra in ("generation_config.json",):
            path = os.path.join(out, extra)
            if os.path.exists(path):
                os.remove(path)
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(reference(model), f)
        print(family, "->", out, file=sys.stderr)


if __name__ == "__main__":
    main()
