//! Gemma 3 (`gemma3_text`): four `(1 + w)` norms a layer (before and after attention and the
//! MLP), per-head q/k norms, embeddings × √hidden, GELU, scores scaled by
//! `query_pre_attn_scalar`, logits soft-capped, sliding-window layers between global ones.

use super::Activation;
use super::llama::{self, LLAMA};
use super::{Family, Gguf, Norms, Windows};

pub const GEMMA3: Family = Family {
    model_type: "gemma3_text",
    title: "Gemma 3",
    norms: Norms {
        attention_in: "input_layernorm",
        attention_out: Some("post_attention_layernorm"),
        mlp_in: "pre_feedforward_layernorm",
        mlp_out: Some("post_feedforward_layernorm"),
        query_key: Some(("self_attn.q_norm", "self_attn.k_norm")),
        offset: 1.0,
    },
    activation: Activation::GeluTanh,
    scaled_embedding: true,
    gemma_scaling: true,
    windows: Windows::ByLayer,
    layer_types: &["full_attention", "sliding_attention"],
    // NeoX's rope: llama.cpp stores q and k rows in HF's order.
    gguf: Some(Gguf {
        architecture: "gemma3",
        layer_names: &[GGUF_NORMS, llama::GGUF_PROJECTIONS],
        permuted_rope: false,
    }),
    ..LLAMA
};

const GGUF_NORMS: &[(&str, &str)] = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "post_attention_norm.weight"),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
];
