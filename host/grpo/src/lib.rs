//! wirl's GRPO learner: the policy's trainable forward pass over the model's weights
//! (`policy`), what a step optimises as one value (`objective`) and its terms (`loss`), AdamW with clipping and a schedule (`optim`), and
//! one update over a step's groups (`update`: old/reference passes, token weights, epochs,
//! gradient accumulation, the optimizer step through the weights barrier).
//! It must not know plugins, tasks, files or HTTP: `wirl-trainer` drives it.

pub mod correction;
pub mod credit;
pub mod device_check;
mod fused;
pub mod grads;
mod head;
pub mod loss;
pub mod objective;
pub mod optim;
pub mod policy;
mod positions;
pub mod update;

pub use correction::{CorrectionMode, RolloutCorrection};
pub use credit::turn_advantages;
pub use grads::Gradients;
pub use loss::{
    AdaptiveKl, AdvantageMode, Aggregation, KlEstimate, KlEstimator, LossKind, LossParts, LossSettings,
    SAPO_TEMPERATURES, UnknownLoss, Whitening, group_advantages, grpo_loss, kl_estimate, kl_penalty,
    masked_token_weights, overlong_penalty, token_weights,
};
pub use objective::{Correction, KlTarget, KlTerm, Objective, Overlong, PolicyTerm};
pub use optim::{Optimizer, Schedule, Update};
pub use policy::{MemoryLimits, Net, Policy, TokenStats};
pub use positions::Part;
pub use update::{GapToken, GroupBatch, Learner, SamplerGap, UpdateSettings, UpdateStats, UpdateTimes};

/// What an update can fail with, its cause kept as the source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed (shapes, memory, the device).
    #[error("tensor: {}", wirl_model::without_backtrace(.0))]
    Tensor(#[from] candle_core::Error),
    /// The model's: its files (an adapter), the weights barrier (the engine stopped), the
    /// data-parallel ranks' collectives, its kernels' inputs.
    #[error(transparent)]
    Model(wirl_model::Error),
    /// A broken invariant of wirl's own, told apart from bad input.
    #[error("internal error (a bug in wirl, please report it): {0}")]
    Internal(String),
}

/// The model's errors, a tensor's kept as a tensor's (as the engine's are).
impl From<wirl_model::Error> for Error {
    fn from(error: wirl_model::Error) -> Self {
        match error {
            wirl_model::Error::Tensor(error) => Error::Tensor(error),
            other => Error::Model(other),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
