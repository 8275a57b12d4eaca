//! Qwen3: Llama's layer with each head's query and key RMS-normed before the rope, no biases.

use super::{Family, Norms, llama::LLAMA};

pub const QWEN3: Family = Family {
    model_type: "qwen3",
    title: "Qwen3",
    norms: Norms { query_key: Some(("self_attn.q_norm", "self_attn.k_norm")), ..LLAMA.norms },
    gguf: None,
    ..LLAMA
};
