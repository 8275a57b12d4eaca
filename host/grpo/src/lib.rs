//! wirl's GRPO trainer: the policy's trainable forward pass over the engine's weights
//! (`policy`), the GRPO objective (`loss`), and AdamW with clipping and a schedule (`optim`).
//! The loop that ties these to plugins and the engine lives in the `wirl train` command.

pub mod loss;
pub mod optim;
pub mod policy;

pub use loss::{AdvantageMode, Aggregation, LossParts, LossSettings, group_advantages, grpo_loss, token_weights};
pub use optim::{Optimizer, Schedule, Update};
pub use policy::{Net, Policy, TokenStats};
