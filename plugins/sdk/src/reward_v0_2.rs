//! The `reward-plugin` world of `wirl:rl@0.2.0` (`wit/0.2.0/`): score a group of completions
//! at once, knowing where the training run stands (annealed or curriculum-shaped rewards),
//! and asking the model when a reward needs one ([`generate`]: an LLM judge; [`logprobs`]:
//! how likely it finds a given reply).
//!
//! ```ignore
//! use wirl_sdk::reward_v0_2::{Progress, Reward, Score, Task};
//!
//! struct Annealed;
//!
//! impl Reward for Annealed {
//!     fn score_group(task: Task, completions: Vec<String>, progress: Progress) -> Vec<Result<Score, String>> {
//!         // The length bonus fades over the run.
//!         let fade = 1.0 - progress.fraction();
//!         completions.iter().map(|c| Ok(Score::new(fade * c.len().min(100) as f32 / 100.0))).collect()
//!     }
//! }
//!
//! wirl_sdk::register_reward_v0_2!(Annealed);
//! ```

#[doc(hidden)]
pub mod bindings {
    // 0.2.0's `reward-plugin` under a world name of this SDK's own: wit-bindgen names the
    // export macro it exports from this crate's root after the world, and 0.1.0's world of
    // the same name has one (both are built when a workspace's plugins enable both
    // features). The component's imports and exports are 0.2.0's `reward-plugin`'s.
    wit_bindgen::generate!({
        inline: "package wirl:sdk; world reward-plugin-v0-2 { include wirl:rl/reward-plugin@0.2.0; }",
        path: "../../wit/0.2.0",
        world: "wirl:sdk/reward-plugin-v0-2",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_reward_plugin_v0_2",
        default_bindings_module: "::wirl_sdk::reward_v0_2::bindings",
        runtime_path: "::wirl_sdk::__wit_bindgen::rt",
    });
}

shared_helpers!(self::bindings);

pub use bindings::wirl::rl::inference::{ReplyLogprobs, ReplyToScore};
pub use bindings::wirl::rl::run::Progress;
pub use bindings::wirl::rl::types::{Completion, FinishReason, Sampling};

/// One completion per conversation from the model (an LLM judge's verdicts): in a training
/// run, the model being trained, within this reward's budget per scoring call
/// (`inference_calls`, `inference_tokens` of its `[[rewards]]` entry). `Err` when the host
/// refuses: the budget is spent, a conversation does not fit the context, or there is no
/// model to call (`wirl score`).
pub fn generate(conversations: &[Vec<Message>], sampling: &Sampling) -> Result<Vec<Completion>, String> {
    bindings::wirl::rl::inference::generate(conversations, sampling)
}

/// How likely the model finds each reply, as the assistant's next turn after its
/// conversation: each token's text and log-prob (a judge reading `P("Yes")`, a reference
/// answer's likelihood). Within the same budget as [`generate`] (the replies' tokens count as
/// generated ones); `Err` when the host refuses (the budget, the context, no model, a host
/// that samples only, as an OpenAI-compatible server).
pub fn logprobs(replies: &[ReplyToScore]) -> Result<Vec<ReplyLogprobs>, String> {
    bindings::wirl::rl::inference::logprobs(replies)
}

impl ReplyLogprobs {
    /// The reply's log-probability: the sum over its tokens.
    pub fn total(&self) -> f32 {
        self.logprobs.iter().sum()
    }
}

#[doc(hidden)]
pub use bindings::exports::wirl::rl::reward::Guest as __Guest;

impl Progress {
    /// Whether the completions come from a training step (not an evaluation, `wirl score` or
    /// a server's score call).
    pub fn in_training(&self) -> bool {
        self.steps > 0
    }

    /// How far through its planned steps the run is, from 0 to 1 (0 outside training).
    pub fn fraction(&self) -> f32 {
        if self.steps == 0 { 0.0 } else { (self.step as f64 / self.steps as f64).clamp(0.0, 1.0) as f32 }
    }
}

/// A reward function that scores a group at once and is told the run's progress.
pub trait Reward {
    /// Score every completion of one group of `task`, in order. `Err` is your verdict that a
    /// completion cannot be scored: wirl records the reason and gives the configured failure
    /// reward.
    fn score_group(task: Task, completions: Vec<String>, progress: Progress) -> Vec<Result<Score, String>>;
}

/// Export `$ty` (which implements [`Reward`]) as this component's reward function.
#[macro_export]
macro_rules! register_reward_v0_2 {
    ($ty:ty) => {
        #[cfg(not(target_family = "wasm"))]
        const _: () = {
            let _ = <$ty as $crate::reward_v0_2::Reward>::score_group;
        };
        #[cfg(target_family = "wasm")]
        const _: () = {
            #[doc(hidden)]
            struct __WirlRewardExport;

            impl $crate::reward_v0_2::__Guest for __WirlRewardExport {
                fn score_group(
                    task: $crate::reward_v0_2::Task,
                    completions: Vec<String>,
                    progress: $crate::reward_v0_2::Progress,
                ) -> Vec<Result<$crate::reward_v0_2::Score, String>> {
                    <$ty as $crate::reward_v0_2::Reward>::score_group(task, completions, progress)
                }
            }

            $crate::reward_v0_2::bindings::__export_reward_plugin_v0_2!(__WirlRewardExport with_types_in $crate::reward_v0_2::bindings);
        };
    };
}
