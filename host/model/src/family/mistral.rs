//! Mistral: Llama's layer, with a `sliding_window` this engine runs within (see [`Windows`]).

use super::{Family, Windows, llama::LLAMA};

pub const MISTRAL: Family =
    Family { model_type: "mistral", title: "Mistral", windows: Windows::CapsContext, gguf: None, ..LLAMA };
