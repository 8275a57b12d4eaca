//! Phi-3 (Phi-3-mini, and Phi-3.5 / Phi-4-mini where their rope is plain): Llama's layer with
//! query, key and value stacked by rows in one `qkv_proj`, gate and up in one `gate_up_proj`
//! (what PEFT's adapters for it target); a `sliding_window` this engine runs within.

use super::{Family, Part, Projection, Windows, llama::LLAMA};

pub const PHI3: Family = Family {
    model_type: "phi3",
    title: "Phi-3",
    attention_in: &[Projection { module: "self_attn.qkv_proj", parts: &[Part::Query, Part::Key, Part::Value] }],
    mlp_in: &[Projection { module: "mlp.gate_up_proj", parts: &[Part::Gate, Part::Up] }],
    windows: Windows::CapsContext,
    gguf: None,
    ..LLAMA
};
