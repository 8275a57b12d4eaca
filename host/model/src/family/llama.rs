//! Llama (and SmolLM, Llama 2 and 3): the plain layer every other family here varies.

use super::Activation;
use super::{Family, Gguf, Norms, Part, Projection, Windows};

pub const LLAMA: Family = Family {
    model_type: "llama",
    title: "Llama",
    attention_in: ATTENTION_IN,
    attention_out: "self_attn.o_proj",
    mlp_in: MLP_IN,
    mlp_out: "mlp.down_proj",
    norms: NORMS,
    qkv_bias: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gemma_scaling: false,
    windows: Windows::None,
    layer_types: &["full_attention"],
    gguf: Some(Gguf { architecture: "llama", layer_names: &[GGUF_NORMS, GGUF_PROJECTIONS], permuted_rope: true }),
};

/// Query, key and value, each in a matrix of its own.
const ATTENTION_IN: &[Projection] = &[
    Projection { module: "self_attn.q_proj", parts: &[Part::Query] },
    Projection { module: "self_attn.k_proj", parts: &[Part::Key] },
    Projection { module: "self_attn.v_proj", parts: &[Part::Value] },
];

/// Gate and up, each in a matrix of its own.
const MLP_IN: &[Projection] = &[
    Projection { module: "mlp.gate_proj", parts: &[Part::Gate] },
    Projection { module: "mlp.up_proj", parts: &[Part::Up] },
];

/// A norm before attention and one before the MLP.
const NORMS: Norms = Norms {
    attention_in: "input_layernorm",
    attention_out: None,
    mlp_in: "post_attention_layernorm",
    mlp_out: None,
    query_key: None,
    offset: 0.0,
};

const GGUF_NORMS: &[(&str, &str)] =
    &[("input_layernorm.weight", "attn_norm.weight"), ("post_attention_layernorm.weight", "ffn_norm.weight")];

/// llama.cpp's names of the projections (every family it writes with Llama's layer).
pub(super) const GGUF_PROJECTIONS: &[(&str, &str)] = &[
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];
