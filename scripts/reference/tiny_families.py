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

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/tiny_families.py [FAMILY ...]

With family names (qwen3, gemma3, phi3), only those are written: the others' fixtures stay
as they are.
"""
import json
import os
import sys

import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SEQUENCES = [[2, 17, 33, 5, 9], [40, 41, 42, 43, 44, 45, 46, 47], [3]]
VOCAB = 64
# What every tiny model shares: its width, MLP, heads (grouped-query: 4 query heads over 2
# key/value heads), context and token ids.
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, eos_token_id=1, bos_token_id=None)


def qwen3():
    config = transformers.Qwen3Config(
        **TINY,
        num_hidden_layers=2,
        # Not hidden_size / heads (8): Qwen3 gives head_dim apart.
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
    )
    return transformers.Qwen3ForCausalLM(config)


def gemma3():
    # Three layers, the middle one global: sliding layers with a window of 3 positions (the
    # test sequences are longer), their own rope base; queries scaled by 24^-1/2, not
    # head_dim's; logits soft-capped (Gemma 3's configs leave it null, Gemma 2's set 30:
    # here set, to test it).
    config = transformers.Gemma3TextConfig(
        **TINY,
        num_hidden_layers=3,
        head_dim=16,
        query_pre_attn_scalar=24,
        rms_norm_eps=1e-6,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        final_logit_softcapping=30.0,
        attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        attention_bias=False,
        pad_token_id=0,
    )
    return transformers.Gemma3ForCausalLM(config)


def phi3():
    # q, k and v in one qkv_proj, gate and up in one gate_up_proj; grouped-query attention so
    # that the query's rows and the key's differ in number. No sliding window (wirl caps the
    # context at one, which the 20-position greedy runs would pass).
    config = transformers.Phi3Config(
        **TINY,
        num_hidden_layers=2,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 1.0},
        original_max_position_embeddings=64,
        sliding_window=None,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    return transformers.Phi3ForCausalLM(config)


FAMILIES = {"qwen3": qwen3, "gemma3": gemma3, "phi3": phi3}


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


def write_gemma3_gguf(model, path):
    """The tiny Gemma 3 as llama.cpp's converter writes a gemma3 GGUF (f32): its tensor
    names, norm weights stored as 1 + w, no q/k permutation, a SentencePiece tokenizer left
    to a tokenizer.json beside the file; the layer pattern (global every 2nd layer) in
    `gemma3.attention.sliding_window_pattern`."""
    import gguf
    config = model.config
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_uint32("gemma3.context_length", config.max_position_embeddings)
    writer.add_uint32("gemma3.embedding_length", config.hidden_size)
    writer.add_uint32("gemma3.block_count", config.num_hidden_layers)
    writer.add_uint32("gemma3.feed_forward_length", config.intermediate_size)
    writer.add_uint32("gemma3.attention.head_count", config.num_attention_heads)
    writer.add_uint32("gemma3.attention.head_count_kv", config.num_key_value_heads)
    writer.add_uint32("gemma3.attention.key_length", config.head_dim)
    writer.add_uint32("gemma3.attention.value_length", config.head_dim)
    writer.add_float32("gemma3.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32("gemma3.rope.freq_base", 1_000_000.0)
    writer.add_uint32("gemma3.attention.sliding_window", config.sliding_window)
    writer.add_uint32("gemma3.attention.sliding_window_pattern", 2)
    writer.add_float32("gemma3.final_logit_softcapping", config.final_logit_softcapping)
    writer.add_uint32("gemma3.vocab_size", config.vocab_size)
    writer.add_string("tokenizer.ggml.model", "llama")
    writer.add_uint32("tokenizer.ggml.eos_token_id", 1)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        data = tensor.detach().float().numpy().copy()
        if name.endswith("norm.weight"):
            data = data + 1.0
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            gguf_name = f"blk.{layer}.{names[rest.rsplit('.', 1)[0]]}.weight"
        writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def chosen(families):
    """The families named on the command line (all of `families` without names)."""
    names = sys.argv[1:] or list(families)
    unknown = [f for f in names if f not in families]
    if unknown:
        sys.exit(f"unknown families {unknown}: choose from {list(families)}")
    return names


def save(model, name, reference):
    """`model` as transformers saves it in `tests/fixtures/NAME/` (without the generation
    config wirl's tests do not read), with `reference` as its `reference.json`."""
    out = os.path.join(ROOT, "tests", "fixtures", name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    path = os.path.join(out, "generation_config.json")
    if os.path.exists(path):
        os.remove(path)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f)
    return out


def main():
    torch.manual_seed(0)
    for family in chosen(FAMILIES):
        build = FAMILIES[family]
        model = build().eval()
        randomize(model)
        out = save(model, f"tiny-{family}", reference(model))
        if family == "gemma3":
            write_gemma3_gguf(model, os.path.join(out, "model.gguf"))
        print(family, "->", out, file=sys.stderr)


if __name__ == "__main__":
    main()
