//! Qwen2 (and Qwen2.5): Llama's layer with biases on q, k and v.

use super::{Family, llama::LLAMA};

pub const QWEN2: Family = Family { model_type: "qwen2", title: "Qwen2", qkv_bias: true, gguf: None, ..LLAMA };
