//! wirl's decoder, written once for the engine that samples and the learner that trains:
//! what a model is (`config`: its config and the checks on it; `family`: each family's
//! tensors, shapes and variants), how a layer is composed (`decoder`, `layer`), the pieces
//! both forwards share (`ops`: rope, grouped keys, the LoRA pair), and the fixed-order
//! reductions (`invariant`, with the few-row product kernels it calls in `decode_matmul`)
//! that make a token's log-prob the same bits on both sides on the CPU in f32. Beside the
//! decoder, what both sides hold of a model in the same terms: its LoRA adapters in PEFT's
//! files (`lora`, written whole or not at all by `files`; `finite`, the check every weight
//! passes), the collectives of a model split over ranks (`comm`: the trait, one rank, ranks
//! as threads), and the seam between the learner that writes the weights in place and what
//! reads them meanwhile (`weights`: the barrier, the hold, the mirror of a reader's copies).
//!
//! What this crate must not know: how a model is served (its weights' files and GGUF, the
//! tokenizer, caches, batches, the engine's actor, the NCCL and MPI transports) or how it is
//! trained (gradients, optimizers). The engine (`wirl-engine`) and the learner (`wirl-grpo`)
//! implement `decoder`'s operations over their own weights; the engine re-exports these
//! modules under their old paths, and the learner depends on this crate, not the engine.

pub mod comm;
pub mod config;
pub mod decode_matmul;
pub mod decoder;
mod error;
pub mod family;
pub mod files;
pub mod finite;
pub mod invariant;
pub mod invariant_check;
#[cfg(feature = "cuda")]
mod invariant_cuda;
pub mod layer;
pub mod lora;
pub mod ops;
pub mod weights;

pub use config::Config;
pub use error::{Error, Refused, Result, without_backtrace};

/// Deterministic inputs for the kernels' unit tests (here and in the engine's) and their device check (`invariant_check`).
#[doc(hidden)]
pub fn test_values(seed: u32) -> impl FnMut() -> f32 {
    let mut state = seed;
    move || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 8) as f32 / (1 << 24) as f32 - 0.5
    }
}
